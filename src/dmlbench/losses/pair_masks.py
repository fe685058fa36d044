"""Building blocks of the batch-wise pair and list losses: a batch and optional mined tuples become
boolean ``[b, b]`` pair masks, so that each loss is written once over masks and accepts "all pairs of
the batch" and "mined pairs" alike; plus log-sum-exp over masked (possibly empty) sets."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from dmlbench.distances import label_masks
from dmlbench.errors import UserInputError
from dmlbench.mining.tuples import Tuples, to_pairs


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


def label_pairs(labels: Tensor) -> tuple[Tensor, Tensor]:
    """``(anchors, positives)``: every ordered pair of two positions with the same label, the pairs of
    ``pair_masks(labels)[0]`` (in another order), found from the sorted labels without a [b, b] mask
    (in NumPy: a dozen small array operations, each a fraction of torch's cost per call)."""
    values = labels.cpu().numpy()
    order = np.argsort(values, kind="stable")
    sorted_labels = values[order]
    # Sorted position i pairs with the positions first[i], ..., first[i] + size[i] - 1 of its label.
    first = np.searchsorted(sorted_labels, sorted_labels)
    size = np.searchsorted(sorted_labels, sorted_labels, side="right") - first
    anchor = np.repeat(np.arange(len(values)), size)
    partner = np.arange(len(anchor)) + np.repeat(first - (np.cumsum(size) - size), size)
    distinct = anchor != partner
    pairs = torch.from_numpy(np.stack([order[anchor[distinct]], order[partner[distinct]]]))
    anchors, positives = pairs.to(labels.device)
    return anchors, positives


def masked_logsumexp(values: Tensor, mask: Tensor, dim: int = -1) -> Tensor:
    """``log sum_{mask} exp(values)`` along ``dim``: ``-inf`` where the mask selects nothing, gradients always finite."""
    selected = torch.where(mask, values, float("-inf"))
    # Written out rather than torch.logsumexp: fewer [b, b] passes (no separate mask.any, the backward
    # reuses exp(selected - maximum) instead of recomputing it). The shift is detached: log-sum-exp's
    # gradient does not depend on it. A non-empty row's sum is at least exp(0) = 1; an empty row
    # (maximum -inf) is shifted by a finite number, sums to 0 and is lifted to 0.5 before the log,
    # so its result is log(0.5) + (-inf) = -inf with no 0/0 in the backward.
    maximum = selected.amax(dim=dim, keepdim=True).detach()
    total = torch.exp(selected - maximum.clamp_min(torch.finfo(values.dtype).min)).sum(dim=dim, keepdim=True)
    result = torch.log(total.clamp_min(0.5)) + maximum
    return result.squeeze(dim)


def log1p_exp(values: Tensor) -> Tensor:
    """``log(1 + exp(values))`` without overflow; ``-inf`` gives 0 with gradient 0."""
    return torch.logaddexp(values, values.new_zeros(()))
