"""FastAP: average precision of each anchor's ranked list from soft distance histograms."""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.distances import check_batch, squared_euclidean
from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.losses.pair_masks import pair_masks
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_positive_int

MAX_SQUARED_DISTANCE = 4.0  # ||x - y||^2 of unit vectors lies in [0, 4]


@LOSSES.register("fastap")
class FastAPLoss(MetricLoss):
    """FastAP loss, Cakir et al. 2019 (histogram-binned AP, "FastAP" eq.), as benchmarked in Musgrave et al. 2020 Table 7.

    For each anchor q: ``FastAP(q) = 1/N+ sum_l h+_l H+_l / H_l`` where h+ (h) is the soft histogram of
    the squared Euclidean distances of q's positives (positives and negatives) over the ``num_bins`` + 1
    equally spaced centres of [0, 4], with a triangular kernel of width 4 / num_bins, and H+, H their
    cumulative sums; terms with ``H_l = 0`` are 0. ``L = mean over anchors with >= 1 positive of
    (1 - FastAP)`` (AP is undefined without positives). The seeds give no bin count; 10 is Cakir et
    al.'s default. Distances are those of the L2-normalised embeddings (the loss normalises its input).
    With mined tuples an anchor's ranked list is its listed positives and negatives.
    """

    uses_tuples = True

    def __init__(self, num_bins: int = 10) -> None:
        super().__init__()
        self.num_bins = check_positive_int("num_bins", num_bins)

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_batch(embeddings, labels)
        positive, negative = pair_masks(labels, tuples)
        positive_count = positive.sum(dim=1)
        has_positive = positive_count > 0
        if not has_positive.any():
            return zero_loss(embeddings)
        distances = squared_euclidean(torch.nn.functional.normalize(embeddings, dim=1))
        # The triangular kernel of width 4 / num_bins gives each pair weight in its two nearest bin
        # centres only: a [b, b, 2] scatter into the bins instead of a [b, b, num_bins + 1] kernel.
        scaled = distances * (self.num_bins / MAX_SQUARED_DISTANCE)
        # A NaN distance still needs a valid bin index: its NaN weight then makes the loss NaN.
        lower = scaled.detach().floor().nan_to_num_(0.0).clamp_(0, self.num_bins - 1)
        bins = torch.stack([lower, lower + 1], dim=2)
        weights = torch.relu(1 - (scaled.unsqueeze(2) - bins).abs())
        bins = bins.long().flatten(1)
        empty = distances.new_zeros(len(distances), self.num_bins + 1)
        positive_histogram = empty.scatter_add(1, bins, (weights * positive.unsqueeze(2)).flatten(1))
        all_histogram = positive_histogram + empty.scatter_add(1, bins, (weights * negative.unsqueeze(2)).flatten(1))
        cumulative_positive = positive_histogram.cumsum(dim=1)
        cumulative_all = all_histogram.cumsum(dim=1)
        # `!= 0`, not `> 0` (the same for these non-negative sums): a NaN must reach the loss, not be masked.
        filled = cumulative_all != 0
        safe_cumulative_all = torch.where(filled, cumulative_all, torch.ones_like(cumulative_all))
        precision_terms = torch.where(
            filled, positive_histogram * cumulative_positive / safe_cumulative_all, torch.zeros_like(cumulative_all)
        )
        average_precision = precision_terms.sum(dim=1)[has_positive] / positive_count[has_positive]
        return (1 - average_precision).mean()
