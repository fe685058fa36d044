"""Any pytorch-metric-learning loss as a dmlbench loss: ``loss.name: pml:<ClassName>`` (extra ``pml``).

``loss.params`` go to the class's constructor (those of its base classes included, e.g. ``distance``
is not settable from YAML, ``pos_margin`` is); ``num_classes`` and ``embedding_size`` are filled in
by the run like ``num_classes``/``embedding_dim`` of the built-in losses. Mined tuples reach the
loss as PML's ``indices_tuple`` (pairs ``(a1, p, a2, n)``, triplets ``(a, p, n)``: the order of
``mining.tuples``). The loss keeps PML's own reduction (often the mean over the non-zero terms),
which differs from the built-in losses' mean over all tuples (docs/decisions.md, Losses).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from dmlbench.errors import UserInputError
from dmlbench.losses.base import LOSSES, MetricLoss
from dmlbench.mining.pml import PREFIX, constructor_parameters, pml_class, pml_indices
from dmlbench.mining.tuples import Tuples


class PMLLoss(MetricLoss):
    """A pytorch-metric-learning loss module behind ``MetricLoss.forward(embeddings, labels, tuples)``."""

    def __init__(self, loss: nn.Module, uses_tuples: bool) -> None:
        super().__init__()
        self.loss = loss
        self.uses_tuples = uses_tuples  # type: ignore[misc]  # per bridged class, not per dmlbench class

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        return self.loss(embeddings, labels, indices_tuple=pml_indices(tuples))


def _resolve(class_name: str) -> Callable[..., MetricLoss]:
    cls = pml_class("losses", class_name, "loss")
    parameters = constructor_parameters(cls)
    names = {parameter.name for parameter in parameters}
    # Classification-style losses (a weight or a proxy per class) ignore mined tuples.
    uses_tuples = "num_classes" not in names

    def build(**params: Any) -> MetricLoss:
        if "embedding_dim" in params:
            params["embedding_size"] = params.pop("embedding_dim")
        try:
            loss = cls(**params)
        except (TypeError, ValueError) as error:
            raise UserInputError(f"loss '{PREFIX}:{class_name}': {error}") from None
        return PMLLoss(loss, uses_tuples)

    exposed = [parameter.replace(name="embedding_dim") if parameter.name == "embedding_size" else parameter
               for parameter in parameters]
    build.__signature__ = inspect.Signature(exposed)  # type: ignore[attr-defined]
    build.__doc__ = f"pytorch-metric-learning's {class_name} (PML's reduction)."
    build.uses_tuples = uses_tuples  # type: ignore[attr-defined]  # read by the config check, like a class attribute
    return build


LOSSES.register_prefix(PREFIX, _resolve)
