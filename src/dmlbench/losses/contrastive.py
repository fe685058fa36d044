"""Contrastive loss."""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.distances import check_batch, euclidean
from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.mining.tuples import Tuples, all_pairs, to_pairs
from dmlbench.validation import check_positive


@LOSSES.register("contrastive")
class ContrastiveLoss(MetricLoss):
    """Contrastive loss, Hadsell et al. 2006 / Roth et al. 2020 supp. eq. 1: d (positive), [margin - d]_+ (negative).

    ``d`` is the Euclidean distance; embeddings are expected L2-normalised (the default margin 1
    is on the unit-sphere scale). Reduction, as eq. 1's ``1/b`` over the ``b`` pairs: the mean over
    all pairs, positive and negative together. Triplets count as their (a, p) and (a, n) pairs;
    without tuples every ordered pair of the batch is used. Pairs are trusted: a negative pair of
    two same-class samples (rho-regularisation) is pushed apart.
    """

    uses_tuples = True

    def __init__(self, margin: float = 1.0) -> None:
        super().__init__()
        self.margin = check_positive("margin", margin)

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_batch(embeddings, labels)
        pairs = all_pairs(labels) if tuples is None else to_pairs(tuples)
        if len(pairs) == 0:
            return zero_loss(embeddings)
        distances = euclidean(embeddings)
        positive = distances[pairs.positive_anchors, pairs.positives]
        negative = (self.margin - distances[pairs.negative_anchors, pairs.negatives]).relu()
        return torch.cat([positive, negative]).mean()
