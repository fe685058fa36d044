"""Circle loss on the pairs of a batch."""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.distances import check_batch, cosine_similarity
from dmlbench.errors import UserInputError
from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.losses.pair_masks import log1p_exp, masked_logsumexp, pair_masks
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_positive


@LOSSES.register("circle")
class CircleLoss(MetricLoss):
    """Circle loss with pair-wise labels, Sun et al. 2020 eq. 6 (margins and optima as set in its eq. 8).

    Per anchor: ``log(1 + sum_n exp(gamma a_n (s_n - m)) * sum_p exp(-gamma a_p (s_p - 1 + m)))`` with
    ``a_p = [1 + m - s_p]_+`` and ``a_n = [s_n + m]_+`` held constant in the gradient (as in the paper),
    cosine similarity s (the loss normalises its input), then the mean over all b anchors (an anchor
    without positives or negatives contributes 0; the seeds do not use circle loss). Defaults m = 0.4,
    gamma = 80 are the paper's fine-grained image retrieval setting (m = 0.25, gamma = 256 is its face
    recognition setting). With mined tuples, each anchor's listed pairs are its positives/negatives.
    """

    uses_tuples = True

    def __init__(self, margin: float = 0.4, gamma: float = 80.0) -> None:
        super().__init__()
        if not (isinstance(margin, (int, float)) and 0.0 <= margin < 1.0):
            raise UserInputError(f"margin must lie in [0, 1), got {margin!r}")
        self.margin = float(margin)
        self.gamma = check_positive("gamma", gamma)

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_batch(embeddings, labels)
        positive, negative = pair_masks(labels, tuples)
        if not (positive.any(1) & negative.any(1)).any():
            return zero_loss(embeddings)
        similarity = cosine_similarity(embeddings)
        positive_weight = torch.relu(1 + self.margin - similarity).detach()
        negative_weight = torch.relu(similarity + self.margin).detach()
        positive_logits = -self.gamma * positive_weight * (similarity - (1 - self.margin))
        negative_logits = self.gamma * negative_weight * (similarity - self.margin)
        per_anchor = log1p_exp(
            masked_logsumexp(positive_logits, positive, dim=1) + masked_logsumexp(negative_logits, negative, dim=1)
        )
        return per_anchor.mean()
