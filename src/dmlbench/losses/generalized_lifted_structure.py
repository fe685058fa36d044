"""Generalised lifted structure loss: every positive and every negative of each anchor at once."""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.distances import check_batch, euclidean
from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.losses.pair_masks import masked_logsumexp, pair_masks
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_non_negative, check_positive


@LOSSES.register("generalized_lifted_structure")
class GeneralizedLiftedStructureLoss(MetricLoss):
    """Generalised lifted structure loss, Roth et al. 2020 supp. eq. 3 (Hermans et al. 2017).

    ``L = sum_a [log sum_{p} exp(d(a, p)) + log sum_{n} exp(margin - d(a, n))]_+ + regularization/b * sum_a ||phi*_a||^2``
    with the Euclidean distance of the *unnormalised* embeddings phi* (pass the model's output before
    L2 normalisation; any embeddings are accepted). As in eq. 3 the hinge term is summed, not averaged,
    over the anchors, while the embedding regulariser is a batch mean. Positives exclude the anchor
    itself; an anchor without a positive or without a negative contributes 0 (log of an empty sum is
    -inf, clipped by the hinge). With mined tuples the positives/negatives of ``a`` are its listed pairs.
    A batch without any such anchor gives ``zero_loss`` (no regulariser either: nothing to balance).
    """

    uses_tuples = True

    def __init__(self, margin: float = 1.0, regularization: float = 0.005) -> None:
        super().__init__()
        self.margin = check_positive("margin", margin)
        self.regularization = check_non_negative("regularization", regularization)

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_batch(embeddings, labels)
        positive, negative = pair_masks(labels, tuples)
        if not (positive.any(1) & negative.any(1)).any():
            return zero_loss(embeddings)
        distances = euclidean(embeddings)
        per_anchor = masked_logsumexp(distances, positive, dim=1) + masked_logsumexp(
            self.margin - distances, negative, dim=1
        )
        embedding_norms = embeddings.pow(2).sum(dim=1).mean()
        return torch.relu(per_anchor).sum() + self.regularization * embedding_norms
