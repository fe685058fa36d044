"""Margin loss with a learnable boundary beta."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dmlbench.distances import check_batch, euclidean
from dmlbench.errors import UserInputError
from dmlbench.losses.base import LOSSES, MetricLoss, check_labels, zero_loss
from dmlbench.mining.tuples import Tuples, all_pairs, to_pairs
from dmlbench.validation import check_non_negative, check_positive_int


@LOSSES.register("margin")
class MarginLoss(MetricLoss):
    """Margin loss, Wu et al. 2017 / Roth et al. 2020 supp. eq. 10: [margin + y_ij (d_ij - beta)]_+ + nu * beta.

    ``y_ij = +1`` for positive and ``-1`` for negative pairs, ``d`` the Euclidean distance
    (embeddings expected L2-normalised). ``beta`` is one learnable boundary, or one per class with
    ``beta_per_class`` (then indexed by the label of the pair's anchor, docs/decisions.md; needs
    ``num_classes``). Its regulariser ``nu * beta_{y_i}`` is added per pair, as in Wu et al.'s
    objective. Reduction: eq. 10 writes a bare sum; here the mean over all pairs (zeros included),
    so the scale does not grow with the batch (Wu et al. divide by the number of non-zero pairs
    instead). Triplets count as their (a, p) and (a, n) pairs; without tuples every ordered pair of
    the batch is used. Pairs are trusted as given (rho-regularisation).
    """

    uses_tuples = True

    def __init__(
        self,
        margin: float = 0.2,
        beta: float = 1.2,
        nu: float = 0.0,
        beta_per_class: bool = False,
        learn_beta: bool = True,
        num_classes: int | None = None,
    ) -> None:
        super().__init__()
        self.margin = check_non_negative("margin", margin)
        self.nu = check_non_negative("nu", nu)
        check_non_negative("beta", beta)
        self.beta_per_class = bool(beta_per_class)
        if self.beta_per_class:
            if num_classes is None:
                raise UserInputError("margin loss with beta_per_class=True needs num_classes")
            self.num_classes = check_positive_int("num_classes", num_classes)
        initial = torch.full((num_classes if self.beta_per_class else 1,), float(beta))
        if learn_beta:
            self.beta = nn.Parameter(initial)
        else:
            self.register_buffer("beta", initial)

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_batch(embeddings, labels)
        if self.beta_per_class:
            check_labels(labels, self.num_classes)
        pairs = all_pairs(labels) if tuples is None else to_pairs(tuples)
        if len(pairs) == 0:
            return zero_loss(embeddings) + 0.0 * self.beta.sum()
        distances = euclidean(embeddings)
        anchors = torch.cat([pairs.positive_anchors, pairs.negative_anchors])
        d = torch.cat(
            [distances[pairs.positive_anchors, pairs.positives], distances[pairs.negative_anchors, pairs.negatives]]
        )
        sign = torch.ones_like(d)
        sign[len(pairs.positive_anchors):] = -1.0
        beta = self.beta[labels[anchors]] if self.beta_per_class else self.beta.expand(len(d))
        return ((self.margin + sign * (d - beta)).relu() + self.nu * beta).mean()
