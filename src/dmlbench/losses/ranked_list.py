"""Ranked list loss: a hypersphere per class, negatives pushed beyond a boundary."""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.distances import check_batch, euclidean
from dmlbench.errors import UserInputError
from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.losses.pair_masks import masked_logsumexp, pair_masks
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_non_negative, check_positive


@LOSSES.register("ranked_list")
class RankedListLoss(MetricLoss):
    """Ranked list loss, Wang et al. 2019b, as written in Fehervari et al. 2019 eq. 6-9.

    Per query i, with Euclidean distances d of the L2-normalised embeddings (the loss normalises its input):
    ``L_P = 1/|P*| sum_{j in P*} (d_ij - (boundary - margin))`` over the non-trivial positives
    ``P* = {j: d_ij > boundary - margin}``, ``L_N = sum_{j in N*} w_ij (boundary - d_ij) / sum_{N*} w_ij``
    over the non-trivial negatives ``N* = {j: d_ij < boundary}`` with ``w_ij = exp(temperature (boundary - d_ij))``,
    and ``L = 1/b sum_i (L_P + negative_weight L_N)`` (empty sets give 0). As in the paper (and its
    official code) the weights w are constants in the gradient. Defaults: the paper's boundary
    alpha = 1.2, margin m = 0.4, T = 10, lambda = 1 (the seeds give none). With mined tuples, the
    candidate positives/negatives of i are its listed pairs.
    """

    uses_tuples = True

    def __init__(
        self, margin: float = 0.4, boundary: float = 1.2, temperature: float = 10.0, negative_weight: float = 1.0
    ) -> None:
        super().__init__()
        self.margin = check_positive("margin", margin)
        self.boundary = check_positive("boundary", boundary)
        if margin > boundary:
            raise UserInputError(f"margin must not exceed boundary ({boundary!r}), got {margin!r}")
        self.temperature = check_non_negative("temperature", temperature)
        self.negative_weight = check_non_negative("negative_weight", negative_weight)

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_batch(embeddings, labels)
        positive, negative = pair_masks(labels, tuples)
        if not (positive.any() or negative.any()):
            return zero_loss(embeddings)
        distances = euclidean(torch.nn.functional.normalize(embeddings, dim=1))
        positive_radius = self.boundary - self.margin
        hard_positive = positive & (distances > positive_radius)
        hard_negative = negative & (distances < self.boundary)

        positive_violation = torch.where(hard_positive, distances - positive_radius, torch.zeros_like(distances))
        positive_term = positive_violation.sum(dim=1) / hard_positive.sum(dim=1).clamp_min(1)

        with torch.no_grad():
            # Normalised weights w_ij / sum_j w_ij as a masked softmax, stable for large temperatures.
            logits = self.temperature * (self.boundary - distances)
            weights = torch.where(
                hard_negative,
                torch.exp(logits - masked_logsumexp(logits, hard_negative, dim=1).unsqueeze(1)),
                torch.zeros_like(logits),
            )
        negative_term = (weights * (self.boundary - distances)).sum(dim=1)
        return (positive_term + self.negative_weight * negative_term).mean()
