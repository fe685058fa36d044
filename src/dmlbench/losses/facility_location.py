"""Structured clustering with the facility-location objective (Song et al. 2017); the inference of its
medoids is ``losses.medoids``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dmlbench.distances import check_batch, euclidean, same_label_mask
from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.losses.medoids import assign_to_medoids, batched_nmi, greedy_loss_augmented_medoids, swap_refined_medoids
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_flag, check_non_negative


def oracle_clustering_score(distances: Tensor, labels: Tensor) -> Tensor:
    """``F~(X, y) = sum_k max_{j in class k} F(X_k, {j})``: the best medoid of every class (eq. 10)."""
    same = same_label_mask(labels)
    # Column j: the total distance from j's classmates to j, i.e. -F(X_{y_j}, {j}).
    cost = (distances * same.to(distances.dtype)).sum(dim=0)
    _, class_index = torch.unique(labels, return_inverse=True)
    members = F.one_hot(class_index).T.bool()
    return -torch.where(members, cost.unsqueeze(0), float("inf")).amin(dim=1).sum()


@LOSSES.register("facility_location")
class FacilityLocationLoss(MetricLoss):
    """Structured clustering loss, Fehervari et al. 2019 eq. 10-12 (Song et al. 2017).

    ``L = [max_{S, |S| = |Y|} {F(X, S) + gamma Delta(g(S), Y)} - F~(X, Y)]_+`` with the facility
    location ``F(X, S) = -sum_i min_{j in S} ||phi_i - phi_j||`` (Euclidean, not squared, as Song et
    al.), ``F~`` the score of the best medoid per class (eq. 10), ``g(S)`` the nearest-medoid
    assignment (eq. 12) and the structured margin ``Delta = 1 - NMI`` (sklearn's arithmetic NMI; the
    reference codes used the geometric mean). The max is Song et al.'s greedy loss-augmented
    inference, then (``refine``, default on) their PAM-style swap refinement (seed 000 sec. 2.7):
    best single medoid/non-medoid swaps while they strictly increase the objective
    (``swap_refined_medoids``; the reference code only tries each cluster's own members, for 5
    iterations). Still a lower bound of eq. 11's max; its medoids are constants for
    the gradient, which flows through the distances of both terms. ``margin_multiplier`` is gamma
    (1, as Song et al.). A sum over the batch, not normalised (as eq. 11). The embeddings are used as
    given (seed 000's Table 1 normalises them for this loss).
    """

    def __init__(self, margin_multiplier: float = 1.0, refine: bool = True) -> None:
        super().__init__()
        self.margin_multiplier = check_non_negative("margin_multiplier", margin_multiplier)
        self.refine = check_flag("refine", refine)

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_batch(embeddings, labels)
        if len(labels) == 0:
            return zero_loss(embeddings)
        distances = euclidean(embeddings)
        _, class_index = torch.unique(labels, return_inverse=True)
        with torch.no_grad():
            medoids = greedy_loss_augmented_medoids(distances.detach(), class_index, self.margin_multiplier)
            if self.refine:
                medoids = swap_refined_medoids(distances.detach(), class_index, self.margin_multiplier, medoids)
            margin = 1.0 - batched_nmi(assign_to_medoids(distances.detach(), medoids).unsqueeze(0), class_index)
        predicted_score = -distances[medoids].amin(dim=0).sum()
        augmented = predicted_score + self.margin_multiplier * margin.squeeze(0).to(distances.dtype)
        return F.relu(augmented - oracle_clustering_score(distances, labels))
