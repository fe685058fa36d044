"""Pairwise distances and similarities, label masks and the batch check, shared by miners, losses, samplers
and evaluation."""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.errors import UserInputError


def squared_euclidean(x: Tensor, y: Tensor | None = None) -> Tensor:
    """``||x_i - y_j||^2`` for all pairs, clamped at 0 against round-off (exactly 0 on the diagonal of x vs x)."""
    same = y is None
    y = x if y is None else y
    x_norm = (x * x).sum(dim=1, keepdim=True)
    y_norm = x_norm.T if same else (y * y).sum(dim=1, keepdim=True).T
    squared = (x_norm + y_norm - 2.0 * (x @ y.T)).clamp_min(0.0)
    if same:
        squared = squared.clone()
        squared.fill_diagonal_(0.0)
    return squared


def euclidean(x: Tensor, y: Tensor | None = None, eps: float = 1e-12) -> Tensor:
    """``||x_i - y_j||_2`` with a gradient that stays finite where the distance is 0.

    ``sqrt`` has an infinite derivative at 0; pairs closer than ``sqrt(eps)`` get distance 0 with
    zero gradient instead.
    """
    squared = squared_euclidean(x, y)
    positive = squared > eps
    safe = torch.where(positive, squared, torch.ones_like(squared))
    return torch.where(positive, safe.sqrt(), torch.zeros_like(squared))


def cosine_similarity(x: Tensor, y: Tensor | None = None, eps: float = 1e-12) -> Tensor:
    """``<x_i, y_j> / (||x_i|| ||y_j||)`` for all pairs."""
    x_unit = torch.nn.functional.normalize(x, dim=1, eps=eps)
    y_unit = x_unit if y is None else torch.nn.functional.normalize(y, dim=1, eps=eps)
    return x_unit @ y_unit.T


def same_label_mask(labels: Tensor, other: Tensor | None = None) -> Tensor:
    """Boolean matrix ``labels_i == other_j``."""
    other = labels if other is None else other
    return labels.unsqueeze(1) == other.unsqueeze(0)


def check_batch(embeddings: Tensor, labels: Tensor) -> None:
    """Embeddings ``[batch, dim]`` and integer labels ``[batch]`` of the same batch."""
    if not isinstance(embeddings, Tensor) or embeddings.dim() != 2 or not embeddings.is_floating_point():
        shape = tuple(embeddings.shape) if isinstance(embeddings, Tensor) else type(embeddings).__name__
        raise UserInputError(f"embeddings must be a float tensor of shape [batch, dim], got {shape}")
    if not isinstance(labels, Tensor) or labels.dim() != 1 or labels.is_floating_point() or labels.is_complex():
        shape = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
        raise UserInputError(f"labels must be an integer tensor of shape [batch], got {shape}")
    if len(labels) != len(embeddings):
        raise UserInputError(
            f"labels must have one entry per embedding: {len(labels)} labels for {len(embeddings)} embeddings"
        )


def label_masks(labels: Tensor) -> tuple[Tensor, Tensor]:
    """``(positive, negative)`` boolean matrices: same label and not itself / different label."""
    same = same_label_mask(labels)
    negative = ~same
    return same.fill_diagonal_(False), negative
