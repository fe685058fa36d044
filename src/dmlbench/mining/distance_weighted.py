"""Distance-weighted negative sampling."""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.distances import euclidean, label_masks
from dmlbench.errors import UserInputError
from dmlbench.mining.base import MINERS, Miner
from dmlbench.mining.draw import draw_from_log_weights, draw_from_masks
from dmlbench.mining.tuples import Triplets

# log(1 - d^2/4) is -inf at d = 2 (antipodal points); distances are clamped just below it
_BELOW_ANTIPODAL = 2.0 - 1e-4


@MINERS.register("distance_weighted")
class DistanceWeightedMiner(Miner):
    """Distance-weighted sampling, Wu et al. 2017 / Roth et al. 2020 supp. eq. 23-24: P(n|a) ∝ min(lambda, 1/q(d_an)).

    ``q(d) ∝ d^(D-2) (1 - d^2/4)^((D-3)/2)`` is the density of distances between uniform points on
    the unit sphere in ``D`` dimensions (the embedding dimension; the printed eq. 23 lost the square
    on ``d``, Wu et al. have it). Expects L2-normalised embeddings. Weights are computed in log space.
    Eq. 24's clip ``min(lambda, q^-1(d))`` is realised as in Wu et al.'s and the authors' code:
    distances are clamped below at ``lower_cutoff`` (0.5, the lambda of the paper), which caps the
    weight of close negatives at ``q^-1(0.5)`` (``q^-1`` decreases on ``(0, sqrt 2)``), and just below
    2 above. Negatives at ``d >= upper_cutoff`` (1.4; ``None`` disables it) get weight 0 (docs/decisions.md).
    Per anchor: a uniformly random positive and one weighted negative; anchors without a positive
    or without an eligible negative give no triplet.
    """

    def __init__(
        self,
        lower_cutoff: float = 0.5,
        upper_cutoff: float | None = 1.4,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(generator)
        if not (isinstance(lower_cutoff, (int, float)) and 0 < lower_cutoff < 2):
            raise UserInputError(f"lower_cutoff must lie in (0, 2), got {lower_cutoff!r}")
        if upper_cutoff is not None and not (isinstance(upper_cutoff, (int, float)) and upper_cutoff > lower_cutoff):
            raise UserInputError(
                f"upper_cutoff must be None or a number > lower_cutoff={lower_cutoff}, got {upper_cutoff!r}"
            )
        self.lower_cutoff = float(lower_cutoff)
        self.upper_cutoff = None if upper_cutoff is None else float(upper_cutoff)

    def negative_log_weights(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """``log P(n|a)`` up to a per-row constant, ``-inf`` for non-negatives and negatives beyond ``upper_cutoff``."""
        dim = embeddings.shape[1]
        distances = euclidean(embeddings)
        clamped = distances.clamp(min=self.lower_cutoff, max=_BELOW_ANTIPODAL)
        log_q = (dim - 2.0) * torch.log(clamped) + (dim - 3.0) / 2.0 * torch.log(1.0 - clamped.square() / 4.0)
        _, eligible = label_masks(labels)
        if self.upper_cutoff is not None:
            eligible = eligible & (distances < self.upper_cutoff)
        return (-log_q).masked_fill(~eligible, float("-inf"))

    def mine(self, embeddings: Tensor, labels: Tensor) -> Triplets:
        log_weights = self.negative_log_weights(embeddings, labels)
        positive, _ = label_masks(labels)
        anchors = (positive.any(dim=1) & torch.isfinite(log_weights).any(dim=1)).nonzero().squeeze(1)
        positives = draw_from_masks(positive[anchors], self.generator)
        negatives = draw_from_log_weights(log_weights[anchors], self.generator)
        return Triplets(anchors, positives, negatives)
