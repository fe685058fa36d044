"""Distance-distribution matching (DDM), Roth et al. 2020 sec. 3.2.

Among ``num_candidates`` random batches of the big batch ``B*``, pick the one whose normalised
histogram of pairwise Euclidean distances (all pairs ``i < j``) has the smallest 1-Wasserstein
distance to that of ``B*`` (Rubner et al. 2000). Both histograms use the same ``num_bins`` equal
bins spanning ``[min, max]`` of ``B*``'s pairwise distances (50 bins, as in the authors' code); a
candidate is a subset of ``B*``, so its distances always fall inside. On equal-width bins the
1-Wasserstein distance is ``bin_width * sum_k |F_B(k) - F_B*(k)|`` with ``F`` the cumulative
histograms.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dmlbench.distances import squared_euclidean
from dmlbench.sampling.base import SAMPLERS
from dmlbench.sampling.memory import CandidateMatchingSampler
from dmlbench.validation import check_positive_int


def distance_histograms(distances: Tensor, low: float, high: float, num_bins: int) -> Tensor:
    """Normalised histograms ``[..., num_bins]`` of the last axis of ``distances`` over ``[low, high]``;
    ``high`` falls into the last bin."""
    width = (high - low) / num_bins if high > low else 1.0
    bins = ((distances - low) / width).floor().clamp(0, num_bins - 1).to(torch.int64)
    counts = torch.zeros(*distances.shape[:-1], num_bins, dtype=distances.dtype, device=distances.device)
    counts.scatter_add_(-1, bins, torch.ones_like(distances))
    return counts / distances.shape[-1]


def histogram_wasserstein(first: Tensor, second: Tensor, bin_width: float) -> Tensor:
    """1-Wasserstein distance between normalised histograms on the same equal-width bins (Rubner et al. 2000)."""
    return (first.cumsum(-1) - second.cumsum(-1)).abs()[..., :-1].sum(-1) * bin_width


def pairwise_distance_values(distances: Tensor) -> Tensor:
    """The strict upper triangles of ``[..., k, k]`` distance matrices, as ``[..., k(k-1)/2]``."""
    rows, cols = torch.triu_indices(distances.shape[-1], distances.shape[-1], offset=1, device=distances.device)
    return distances[..., rows, cols]


@dataclass(kw_only=True, eq=False, repr=False)
class DistanceMatchingSampler(CandidateMatchingSampler):
    """DDM batches (Roth et al. 2020 sec. 3.2): the candidate whose distance histogram is W1-closest to B*'s."""

    num_bins: int = 50

    def check_options(self) -> None:
        super().check_options()
        self.num_bins = check_positive_int("num_bins", self.num_bins)

    def mismatch(self, points: Tensor, candidates: Tensor) -> Tensor:
        # No autograd runs through the sampler, so the plain sqrt (infinite slope at 0) is safe and
        # half the cost of the gradient-safe ``distances.euclidean``.
        distances = squared_euclidean(points).sqrt()
        big_values = pairwise_distance_values(distances)
        low, high = float(big_values.min()), float(big_values.max())
        big_histogram = distance_histograms(big_values, low, high, self.num_bins)
        candidate_distances = distances[candidates.unsqueeze(-1), candidates.unsqueeze(-2)]
        histograms = distance_histograms(pairwise_distance_values(candidate_distances), low, high, self.num_bins)
        bin_width = (high - low) / self.num_bins if high > low else 1.0
        return histogram_wasserstein(histograms, big_histogram, bin_width)


SAMPLERS.register("ddm")(DistanceMatchingSampler)
