"""What every loss shares: the registry, the module interface and input checks."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from dmlbench.errors import UserInputError
from dmlbench.mining.tuples import Tuples
from dmlbench.registry import Registry

LOSSES: Registry[MetricLoss] = Registry("loss")


class MetricLoss(nn.Module):
    """A deep metric learning loss: ``forward(embeddings, labels, tuples=None) -> scalar``.

    ``uses_tuples`` says whether the loss consumes mined index tuples; without tuples such a loss
    uses every valid tuple of the batch. Parameters of the loss itself (proxies, beta) are trained
    with their own learning rate, see ``training``.
    """

    uses_tuples: ClassVar[bool] = False

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        raise NotImplementedError


def zero_loss(embeddings: Tensor) -> Tensor:
    """A zero that keeps the autograd graph (for empty tuple sets)."""
    return embeddings.sum() * 0.0


def check_labels(labels: Tensor, num_classes: int) -> None:
    """Labels of a classification-style loss must index its ``num_classes`` weights."""
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise UserInputError(
            f"labels must lie in [0, num_classes={num_classes}), got range "
            f"[{int(labels.min())}, {int(labels.max())}]"
        )


def build(name: str, *, num_classes: int | None = None, embedding_dim: int | None = None, **hparams: Any) -> MetricLoss:
    """Build loss ``name``; ``num_classes``/``embedding_dim`` go to losses that take them."""
    constructor = LOSSES.get(name)
    parameters = inspect.signature(constructor).parameters
    for key, value in (("num_classes", num_classes), ("embedding_dim", embedding_dim)):
        if key not in parameters or key in hparams:
            continue
        if value is not None:
            hparams[key] = value
        elif parameters[key].default is inspect.Parameter.empty:
            raise UserInputError(f"loss {name!r} needs {key}")
    return LOSSES.build(name, **hparams)


def loss_parameters(loss: nn.Module) -> list[torch.nn.Parameter]:
    """The loss's own learnable parameters (proxies, class weights, beta)."""
    return [parameter for parameter in loss.parameters() if parameter.requires_grad]
