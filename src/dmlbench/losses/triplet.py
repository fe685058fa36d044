"""Triplet loss."""

from __future__ import annotations

from torch import Tensor

from dmlbench.distances import check_batch, euclidean
from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.mining.tuples import Tuples, all_triplets, to_triplets
from dmlbench.validation import check_non_negative


@LOSSES.register("triplet")
class TripletLoss(MetricLoss):
    """Triplet loss, Hu et al. 2014 / Roth et al. 2020 supp. eq. 2: mean over triplets of [d_ap - d_an + margin]_+.

    ``d`` is the Euclidean distance; embeddings are expected L2-normalised (margin 0.2 is on the
    unit-sphere scale). Reduction: eq. 2's ``1/b``, the mean over all given triplets (zeros
    included). Pairs become every (positive pair, negative pair) combination sharing an anchor;
    without tuples every valid triplet of the batch is used. Triplets are trusted as given
    (rho-regularised triplets have a same-class negative).
    """

    uses_tuples = True

    def __init__(self, margin: float = 0.2) -> None:
        super().__init__()
        self.margin = check_non_negative("margin", margin)

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_batch(embeddings, labels)
        triplets = all_triplets(labels) if tuples is None else to_triplets(tuples)
        if len(triplets) == 0:
            return zero_loss(embeddings)
        distances = euclidean(embeddings)
        d_ap = distances[triplets.anchors, triplets.positives]
        d_an = distances[triplets.anchors, triplets.negatives]
        return (d_ap - d_an + self.margin).relu().mean()
