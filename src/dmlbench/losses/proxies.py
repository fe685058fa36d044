"""What the losses with class weights (proxies, softmax centres) share: input checks and seeded initialisation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dmlbench.errors import UserInputError
from dmlbench.losses.base import check_labels
from dmlbench.mining.base import check_batch
from dmlbench.validation import check_positive_int


def check_class_batch(embeddings: Tensor, labels: Tensor, num_classes: int, embedding_dim: int) -> None:
    """A batch for a loss with class weights: ``[b, embedding_dim]`` embeddings, labels in ``[0, num_classes)``."""
    check_batch(embeddings, labels)
    if embeddings.shape[1] != embedding_dim:
        raise UserInputError(
            f"embeddings have dimension {embeddings.shape[1]} but the loss was built with embedding_dim={embedding_dim}"
        )
    check_labels(labels, num_classes)


def check_num_classes(num_classes: int, name: str = "num_classes") -> int:
    """A softmax/proxy loss needs at least two classes (its denominator sums over the other classes)."""
    check_positive_int(name, num_classes)
    if num_classes < 2:
        raise UserInputError(f"{name} must be at least 2, got {num_classes}")
    return num_classes


def init_proxies(shape: tuple[int, ...], seed: int) -> nn.Parameter:
    """Unit-norm proxies with uniformly random directions (normalised Gaussians), drawn from ``seed``.

    Every loss here normalises its proxies before use, so only their directions matter for the
    loss; unit norm at start keeps the effective proxy learning rate independent of the dimension.
    """
    generator = torch.Generator().manual_seed(seed)
    return nn.Parameter(F.normalize(torch.randn(*shape, generator=generator), dim=-1))
