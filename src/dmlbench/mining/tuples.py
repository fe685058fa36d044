"""The one index-tuple format that miners produce and tuple-based losses consume."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dmlbench.distances import same_label_mask


@dataclass(frozen=True)
class Triplets:
    """Index triplets into a batch: ``labels[anchors] == labels[positives] != labels[negatives]``."""

    anchors: Tensor
    positives: Tensor
    negatives: Tensor

    def __len__(self) -> int:
        return int(self.anchors.numel())


@dataclass(frozen=True)
class Pairs:
    """Index pairs into a batch: positive pairs ``(positive_anchors, positives)`` and negative
    pairs ``(negative_anchors, negatives)``."""

    positive_anchors: Tensor
    positives: Tensor
    negative_anchors: Tensor
    negatives: Tensor

    def __len__(self) -> int:
        return int(self.positive_anchors.numel() + self.negative_anchors.numel())


Tuples = Triplets | Pairs


def all_triplets(labels: Tensor) -> Triplets:
    """Every valid (anchor, positive, negative) of the batch, anchor != positive, in index order."""
    same = same_label_mask(labels)
    positive = same & ~torch.eye(len(labels), dtype=torch.bool, device=labels.device)
    anchors, positives = positive.nonzero(as_tuple=True)
    # one row per positive pair instead of a batch^3 mask: ~batch/classes times less memory and time
    pair_index, negatives = (~same[anchors]).nonzero(as_tuple=True)
    return Triplets(anchors[pair_index], positives[pair_index], negatives)


def all_pairs(labels: Tensor) -> Pairs:
    """Every ordered positive pair (i != j) and every ordered negative pair of the batch."""
    same = same_label_mask(labels)
    positive = same & ~torch.eye(len(labels), dtype=torch.bool, device=labels.device)
    positive_anchors, positives = positive.nonzero(as_tuple=True)
    negative_anchors, negatives = (~same).nonzero(as_tuple=True)
    return Pairs(positive_anchors, positives, negative_anchors, negatives)


def to_pairs(tuples: Tuples) -> Pairs:
    """Pairs view of ``tuples``: a triplet contributes its (a, p) and its (a, n) pair."""
    if isinstance(tuples, Pairs):
        return tuples
    return Pairs(tuples.anchors, tuples.positives, tuples.anchors, tuples.negatives)


def to_triplets(tuples: Tuples) -> Triplets:
    """Triplets view of ``tuples``: every positive pair combined with every negative pair of the same anchor."""
    if isinstance(tuples, Triplets):
        return tuples
    match = tuples.positive_anchors.unsqueeze(1) == tuples.negative_anchors.unsqueeze(0)
    positive_index, negative_index = match.nonzero(as_tuple=True)
    return Triplets(
        tuples.positive_anchors[positive_index],
        tuples.positives[positive_index],
        tuples.negatives[negative_index],
    )
