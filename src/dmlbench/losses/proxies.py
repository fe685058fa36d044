"""What the losses over a fixed set of classes share (proxy, softmax and SoftTriple losses, DREML):
the class-count and dimension checks, seeded class-weight initialisation and the batch preamble."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dmlbench.distances import check_batch
from dmlbench.errors import UserInputError
from dmlbench.losses.base import MetricLoss, check_labels, zero_loss
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_positive_int, check_seed


def check_num_classes(num_classes: int, name: str = "num_classes") -> int:
    """A softmax/proxy loss needs at least two classes (its denominator sums over the other classes)."""
    check_positive_int(name, num_classes)
    if num_classes < 2:
        raise UserInputError(f"{name} must be at least 2, got {num_classes}")
    return num_classes


def unit_weights(weights: Tensor, dtype: torch.dtype) -> Tensor:
    """Class weights L2-normalised along their last axis, in the embeddings' ``dtype``."""
    return F.normalize(weights.to(dtype), dim=-1)


class ClassLoss(MetricLoss):
    """A loss over ``num_classes`` (>= 2) classes of ``embedding_dim``-dimensional embeddings.

    Subclasses implement ``class_loss``; ``forward`` first checks the batch (``[b, embedding_dim]``
    embeddings, labels in ``[0, num_classes)``) and gives ``zero_loss`` for an empty one. Mined tuples
    are not used. ``class_weights`` draws the learnable per-class weights (proxies, softmax weights,
    centres) of the losses that have them.
    """

    def __init__(self, num_classes: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_classes = check_num_classes(num_classes)
        self.embedding_dim = check_positive_int("embedding_dim", embedding_dim)

    def class_weights(self, seed: int, per_class: int | None = None) -> nn.Parameter:
        """Unit-norm weights ``[num_classes, (per_class,) embedding_dim]`` with uniformly random
        directions (normalised Gaussians), drawn from ``seed``.

        Every loss here normalises its weights before use, so only their directions matter for the
        loss; unit norm at start keeps the effective weight learning rate independent of the dimension.
        """
        shape = (self.num_classes, self.embedding_dim)
        if per_class is not None:
            shape = (self.num_classes, per_class, self.embedding_dim)
        generator = torch.Generator().manual_seed(check_seed(seed))
        return nn.Parameter(F.normalize(torch.randn(*shape, generator=generator), dim=-1))

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_batch(embeddings, labels)
        if embeddings.shape[1] != self.embedding_dim:
            raise UserInputError(
                f"embeddings have dimension {embeddings.shape[1]} but the loss was built with "
                f"embedding_dim={self.embedding_dim}"
            )
        check_labels(labels, self.num_classes)
        if len(labels) == 0:
            return zero_loss(embeddings)
        return self.class_loss(embeddings, labels.long())

    def class_loss(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """The loss of a checked, non-empty batch; ``labels`` are int64."""
        raise NotImplementedError
