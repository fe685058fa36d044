"""Lifted structured embedding loss (Oh Song et al. 2016)."""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.distances import check_batch, euclidean
from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.losses.pair_masks import masked_logsumexp, pair_masks
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_positive


@LOSSES.register("lifted_structure")
class LiftedStructureLoss(MetricLoss):
    """Lifted structured loss, Oh Song et al. 2016 (smooth J_ij), as cited by Roth et al. 2020 supp. A.1 and Fehervari et al. 2019 sec. 2.3.

    ``J_ij = log(sum_{(i,k) in N} exp(margin - D_ik) + sum_{(j,l) in N} exp(margin - D_jl)) + D_ij`` for
    every positive pair (i, j) in P, and ``J = 1/(2|P|) sum_P [J_ij]_+^2``: the original per-positive-pair
    formulation with the squared hinge (the seeds cite it without restating it; Roth et al. use the
    generalised variant, ``generalized_lifted_structure``). D is the Euclidean distance of the
    L2-normalised embeddings (the loss normalises its input, a no-op on the model head's output).
    N is a set of unordered pairs: a negative pair counts for both of its members. With all pairs P
    holds both orders of each pair, which leaves the value of the unordered formula unchanged.
    Mined tuples give P (their positive pairs) and N (their negative pairs).
    """

    uses_tuples = True

    def __init__(self, margin: float = 1.0) -> None:
        super().__init__()
        self.margin = check_positive("margin", margin)

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_batch(embeddings, labels)
        positive, negative = pair_masks(labels, tuples)
        negative = negative | negative.T
        if not positive.any() or not negative.any():
            return zero_loss(embeddings)
        distances = euclidean(torch.nn.functional.normalize(embeddings, dim=1))
        negative_term = masked_logsumexp(self.margin - distances, negative, dim=1)
        first, second = positive.nonzero(as_tuple=True)
        both_ends = torch.stack([negative_term[first], negative_term[second]], dim=1)
        both_have_negatives = torch.stack([negative.any(1)[first], negative.any(1)[second]], dim=1)
        pair_term = masked_logsumexp(both_ends, both_have_negatives, dim=1) + distances[first, second]
        return torch.relu(pair_term).pow(2).sum() / (2 * len(first))
