"""Lifted structured embedding loss, plus the batch helpers every batch-wise pair/list loss shares.

The helpers (``pair_masks``, ``masked_logsumexp``, ``log1p_exp``) turn a batch and optional mined
tuples into boolean ``[b, b]`` pair masks, so that each loss is written once over masks and accepts
"all pairs of the batch" and "mined pairs" alike.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.distances import euclidean
from dmlbench.errors import UserInputError
from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.mining.base import check_batch, label_masks
from dmlbench.mining.tuples import Tuples, to_pairs
from dmlbench.validation import check_positive


def _check_indices(name: str, indices: Tensor, batch_size: int) -> None:
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= batch_size):
        raise UserInputError(
            f"tuples.{name} must index the batch of size {batch_size}, got range "
            f"[{int(indices.min())}, {int(indices.max())}]"
        )


def pair_masks(labels: Tensor, tuples: Tuples | None = None) -> tuple[Tensor, Tensor]:
    """Boolean ``[b, b]`` masks ``(positive, negative)`` of the batch's pairs; row = anchor, diagonal never set.

    Without tuples every same-label pair is positive and every other-label pair negative. With tuples
    (``Triplets`` are read as their (a, p) and (a, n) pairs) exactly the listed pairs are used, whatever
    their labels (rho-regularisation lists same-class "negatives" on purpose); a pair listed twice counts once.
    """
    if tuples is None:
        return label_masks(labels)
    size = labels.shape[0]
    not_self = ~torch.eye(size, dtype=torch.bool, device=labels.device)
    pairs = to_pairs(tuples)
    masks = []
    for name, rows, columns in (
        ("positive_anchors", pairs.positive_anchors, pairs.positives),
        ("negative_anchors", pairs.negative_anchors, pairs.negatives),
    ):
        _check_indices(name, rows, size)
        _check_indices(name.replace("_anchors", "s"), columns, size)
        mask = torch.zeros(size, size, dtype=torch.bool, device=labels.device)
        mask[rows.to(labels.device), columns.to(labels.device)] = True
        masks.append(mask & not_self)
    return masks[0], masks[1]


def masked_logsumexp(values: Tensor, mask: Tensor, dim: int = -1) -> Tensor:
    """``log sum_{mask} exp(values)`` along ``dim``: ``-inf`` where the mask selects nothing, gradients always finite."""
    any_selected = mask.any(dim=dim, keepdim=True)
    selected = values.masked_fill(~mask, float("-inf"))
    # A row of only -inf has a NaN logsumexp gradient; give empty rows harmless zeros instead and
    # overwrite their result below, where no gradient flows back.
    selected = torch.where(any_selected, selected, torch.zeros_like(selected))
    result = torch.logsumexp(selected, dim=dim, keepdim=True).masked_fill(~any_selected, float("-inf"))
    return result.squeeze(dim)


def log1p_exp(values: Tensor) -> Tensor:
    """``log(1 + exp(values))`` without overflow; ``-inf`` gives 0 with gradient 0."""
    return torch.logaddexp(values, torch.zeros_like(values))


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
