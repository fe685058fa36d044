"""Fréchet-distance matching (FRD), Roth et al. 2020 sec. 3.2.

Among ``num_candidates`` random batches of the big batch ``B*``, pick the one with the smallest
``FRD(B, B*) = ||mu_B - mu_B*||^2 + Tr(S_B + S_B* - 2 (S_B S_B*)^(1/2))`` (Heusel et al. 2017),
with means and unbiased covariances of the embeddings, computed in float64.

``Tr((S_B S_B*)^(1/2))`` is the sum of the square roots of the eigenvalues of ``S_B S_B*``. With the
centred batch ``X`` (``S_B = X^T X / (b - 1)``) these are the eigenvalues of the symmetric
``[b, b]`` matrix ``X S_B* X^T / (b - 1)``, so no matrix square root is needed and one batched
``eigvalsh`` scores all candidates.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.sampling.base import SAMPLERS
from dmlbench.sampling.memory import CandidateMatchingSampler


def frechet_distances(reference: Tensor, sets: Tensor) -> Tensor:
    """FRD between the Gaussian fits of ``reference`` ``[k, D]`` and each of ``sets`` ``[..., b, D]``
    (Roth et al. 2020 sec. 3.2, eq. of "FRD-Score Matching"); float64, ``[...]``."""
    reference, sets = reference.to(torch.float64), sets.to(torch.float64)
    reference_mean = reference.mean(dim=0)
    reference_centred = reference - reference_mean
    reference_cov = reference_centred.T @ reference_centred / (reference.shape[0] - 1)
    set_mean = sets.mean(dim=-2)
    centred = sets - set_mean.unsqueeze(-2)
    scale = sets.shape[-2] - 1
    cross = centred @ reference_cov @ centred.transpose(-1, -2) / scale
    eigenvalues = torch.linalg.eigvalsh(cross)
    # The matrix is PSD with rank <= min(b - 1, D); its zero eigenvalues come out as round-off of
    # either sign, whose square roots (~1e-8 each) would swamp exact answers such as FRD(X, X) = 0.
    # Cut them at the usual numerical-rank tolerance, as a pseudo-inverse does.
    tolerance = eigenvalues[..., -1:].clamp_min(0.0) * cross.shape[-1] * torch.finfo(torch.float64).eps
    trace_sqrt = torch.where(eigenvalues > tolerance, eigenvalues, 0.0).sqrt().sum(-1)
    return (
        (set_mean - reference_mean).square().sum(-1)
        + centred.square().sum((-2, -1)) / scale
        + reference_cov.trace()
        - 2.0 * trace_sqrt
    )


class FrechetMatchingSampler(CandidateMatchingSampler):
    """FRD batches: the candidate with the smallest Fréchet distance to the big batch (Roth et al. 2020 sec. 3.2)."""

    def mismatch(self, points: Tensor, candidates: Tensor) -> Tensor:
        return frechet_distances(points, points[candidates])


SAMPLERS.register("frd")(FrechetMatchingSampler)
