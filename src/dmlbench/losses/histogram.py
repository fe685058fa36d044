"""Histogram loss: overlap of the soft histograms of positive and negative similarities."""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.distances import check_batch, cosine_similarity
from dmlbench.errors import UserInputError
from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.losses.pair_masks import pair_masks
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_positive_int


def soft_histogram(values: Tensor, nodes: Tensor) -> Tensor:
    """Roth et al. 2020 supp. eq. 7-8: ``h(r) = 1/|S| sum_s delta(s, r)`` with the triangular kernel on equally spaced nodes.

    ``delta(s, r) = max(0, 1 - |s - t_r| / Delta)`` equals eq. 7 on every interval, and unlike eq. 7 as
    printed (two closed intervals) it gives weight exactly 1, not 2, to a value on a node, e.g. s = 1.
    """
    spacing = nodes[1] - nodes[0]
    kernel = torch.relu(1 - (values.unsqueeze(1) - nodes).abs() / spacing)
    return kernel.sum(dim=0) / len(values)


@LOSSES.register("histogram")
class HistogramLoss(MetricLoss):
    """Histogram loss, Roth et al. 2020 supp. eq. 7-9 (Ustinova & Lempitsky 2016).

    ``L = sum_r h-(r) sum_{q <= r} h+(q)`` over ``num_bins`` = R nodes ``t_r = -1 + (r - 1) Delta``,
    ``Delta = 2 / (R - 1)``, with h+/h- the soft histograms of the cosine similarities (the loss normalises
    its input) of positive and negative pairs. Default R = 65 (the seed's CUB200/CARS196 value; it uses
    11 for SOP). Pairs are ordered, so each unordered pair is counted twice in both histograms, which
    leaves them unchanged. With mined tuples the histograms use the listed pairs. A batch without a
    positive or without a negative pair gives ``zero_loss``.
    """

    uses_tuples = True

    def __init__(self, num_bins: int = 65) -> None:
        super().__init__()
        check_positive_int("num_bins", num_bins)
        if num_bins < 2:
            raise UserInputError(f"num_bins must be an integer >= 2 (nodes at -1 and 1), got {num_bins!r}")
        self.num_bins = num_bins

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_batch(embeddings, labels)
        positive, negative = pair_masks(labels, tuples)
        if not positive.any() or not negative.any():
            return zero_loss(embeddings)
        similarity = cosine_similarity(embeddings)
        nodes = torch.linspace(-1.0, 1.0, self.num_bins, dtype=similarity.dtype, device=similarity.device)
        positive_histogram = soft_histogram(similarity[positive], nodes)
        negative_histogram = soft_histogram(similarity[negative], nodes)
        return (negative_histogram * positive_histogram.cumsum(dim=0)).sum()
