"""Quadruplet loss."""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.distances import check_batch, euclidean, same_label_mask
from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.mining.tuples import Tuples, all_triplets, to_triplets
from dmlbench.validation import check_non_negative


@LOSSES.register("quadruplet")
class QuadrupletLoss(MetricLoss):
    """Quadruplet loss, Chen et al. 2017 / Roth et al. 2020 supp. eq. 14: triplet term + [d_ij - d_lk + margin_2]_+.

    For each triplet (i, j, k) (anchor, positive, first negative; from the miner, or every valid
    triplet without tuples): ``[d_ij - d_ik + margin_1]_+``, and for every fourth sample ``l`` of
    the batch with ``y_l != y_k`` and ``y_l != y_i``: ``[d_ij - d_lk + margin_2]_+``. The printed
    eq. 14 has ``d_ik`` as the first distance of the second term, which would pull the anchor to its
    negative; Chen et al. and the authors' code use the positive distance ``d_ij``, as here. Using
    every valid ``l`` instead of one random one (authors' code) is its expectation, deterministic.
    ``d`` is the Euclidean distance (embeddings expected L2-normalised). Reduction: eq. 14 writes bare
    sums; here the mean over triplets plus the mean over quadruplets (zeros included). Cost
    O(triplets x batch) for given tuples; without tuples the quadruplet term is summed in
    O(batch^2 log batch) (see ``_all_quadruplet_sums``) rather than enumerated.
    """

    uses_tuples = True

    def __init__(self, margin_1: float = 1.0, margin_2: float = 0.5) -> None:
        super().__init__()
        self.margin_1 = check_non_negative("margin_1", margin_1)
        self.margin_2 = check_non_negative("margin_2", margin_2)

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_batch(embeddings, labels)
        triplets = all_triplets(labels) if tuples is None else to_triplets(tuples)
        if len(triplets) == 0:
            return zero_loss(embeddings)
        anchors, negatives = triplets.anchors, triplets.negatives
        distances = euclidean(embeddings)
        d_ij = distances[anchors, triplets.positives]
        triplet_term = (d_ij - distances[anchors, negatives] + self.margin_1).relu().mean()
        if tuples is None:
            total, count = _all_quadruplet_sums(distances, labels, self.margin_2)
        else:
            fourth = (labels.unsqueeze(0) != labels[negatives].unsqueeze(1)) & (
                labels.unsqueeze(0) != labels[anchors].unsqueeze(1)
            )
            total = ((d_ij.unsqueeze(1) - distances[negatives] + self.margin_2).relu() * fourth).sum()
            count = fourth.sum()
        return triplet_term + total / count.clamp_min(1)


def _all_quadruplet_sums(distances: Tensor, labels: Tensor, margin: float) -> tuple[Tensor, Tensor]:
    """Sum and count of ``[d_ij + margin - d_kl]_+`` over every quadruplet of the batch, in O(B^2 log B).

    Every quadruplet is a positive pair (i, j) of class c with an ordered negative pair (k, l) outside
    c. With ``R_k(x) = sum_{l: y_l != y_k} [x - d_kl]_+``, the pairs with ``y_k != c`` but ``y_l == c``
    sum to ``sum_{k in c} R_k(x)`` (swap k and l), so the wanted sum is
    ``sum_{k not in c} R_k(x) - sum_{k in c} R_k(x)``; ``R`` comes from sorted rows and prefix sums
    instead of the O(B^4 / C) explicit enumeration.
    """
    same = same_label_mask(labels)
    positive = same & ~torch.eye(len(labels), dtype=torch.bool, device=labels.device)
    pair_anchors, pair_positives = positive.nonzero(as_tuple=True)
    thresholds = distances[pair_anchors, pair_positives] + margin
    row_sums = _row_hinge_sums(distances, ~same, thresholds)
    sign = 1.0 - 2.0 * same[:, pair_anchors].to(distances.dtype)
    count = ((~same).sum(dim=1, keepdim=True) * sign).sum()
    return (row_sums * sign).sum(), count


def _row_hinge_sums(distances: Tensor, mask: Tensor, thresholds: Tensor) -> Tensor:
    """``R[k, p] = sum_{l: mask[k, l]} [thresholds[p] - distances[k, l]]_+`` for every row k and threshold p."""
    rows = len(distances)
    sorted_rows, _ = distances.masked_fill(~mask, float("inf")).sort(dim=1)
    finite = sorted_rows.masked_fill(~torch.isfinite(sorted_rows), 0.0)
    prefix = torch.cat([finite.new_zeros(rows, 1), finite.cumsum(dim=1)], dim=1)
    # number of row entries strictly below each threshold; masked entries are +inf and never count
    below = torch.searchsorted(sorted_rows.detach(), thresholds.detach().expand(rows, -1).contiguous())
    return below * thresholds - prefix.gather(1, below)
