"""Any pytorch-metric-learning miner as a dmlbench miner: ``miner.name: pml:<ClassName>`` (extra ``pml``),
and what the loss bridge (``losses.pml``) shares with it.

``miner.params`` go to the class's constructor. PML's tuples become ``mining.tuples``: four index
tensors are pairs ``(a1, p, a2, n)``, three are triplets ``(a, p, n)``. PML miners that sample draw
from torch's global generator; the bridge seeds it from the miner's own generator around every
call (and restores it), so mining stays reproducible and leaves no trace on other randomness.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from dmlbench.errors import UserInputError
from dmlbench.mining.base import MINERS, Miner
from dmlbench.mining.tuples import Pairs, Triplets, Tuples

PREFIX = "pml"
EXTRA_HINT = "pip install 'dmlbench[pml]'"


class PMLMiner(Miner):
    """A pytorch-metric-learning miner behind ``Miner.mine(embeddings, labels) -> Triplets | Pairs``."""

    def __init__(self, miner: torch.nn.Module, generator: torch.Generator | None = None) -> None:
        super().__init__(generator)
        self.miner = miner

    def mine(self, embeddings: Tensor, labels: Tensor) -> Tuples:
        seed = int(torch.randint(0, 2**62, (1,), generator=self.generator))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            found = self.miner(embeddings, labels)
        if len(found) == 3:
            return Triplets(*found)
        return Pairs(*found)


def pml_indices(tuples: Tuples | None) -> tuple[Tensor, ...] | None:
    """``mining.tuples`` in PML's ``indices_tuple`` layout."""
    if tuples is None:
        return None
    if isinstance(tuples, Triplets):
        return tuples.anchors, tuples.positives, tuples.negatives
    assert isinstance(tuples, Pairs)
    return tuples.positive_anchors, tuples.positives, tuples.negative_anchors, tuples.negatives


def constructor_parameters(cls: type) -> list[inspect.Parameter]:
    """The keyword parameters of ``cls`` and of the base classes its ``**kwargs`` reach, first one wins."""
    found: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        for parameter in inspect.signature(init).parameters.values():
            if parameter.name != "self" and parameter.kind in (
                    inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
                found.setdefault(parameter.name, parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY))
    return list(found.values())


def pml_class(module_name: str, class_name: str, kind: str) -> type:
    """The class ``class_name`` of ``pytorch_metric_learning.<module_name>``, or a one-line error."""
    try:
        module = importlib.import_module(f"pytorch_metric_learning.{module_name}")
    except ImportError:
        raise UserInputError(f"{kind} '{PREFIX}:{class_name}' needs pytorch-metric-learning: {EXTRA_HINT}") from None
    found = getattr(module, class_name, None)
    if not isinstance(found, type):
        import difflib

        names = [name for name in dir(module) if isinstance(getattr(module, name), type) and not name.startswith("Base")]
        close = difflib.get_close_matches(class_name, names, n=1)
        hint = f"; did you mean '{PREFIX}:{close[0]}'?" if close else ""
        raise UserInputError(f"unknown {kind} '{PREFIX}:{class_name}': pytorch-metric-learning has no {class_name}{hint}")
    return found


def _resolve(class_name: str) -> Callable[..., Miner]:
    cls = pml_class("miners", class_name, "miner")
    parameters = constructor_parameters(cls)

    def build(generator: torch.Generator | None = None, **params: Any) -> Miner:
        try:
            miner = cls(**params)
        except (TypeError, ValueError) as error:
            raise UserInputError(f"miner '{PREFIX}:{class_name}': {error}") from None
        return PMLMiner(miner, generator)

    generator = inspect.Parameter("generator", inspect.Parameter.KEYWORD_ONLY, default=None)
    build.__signature__ = inspect.Signature([generator, *parameters])  # type: ignore[attr-defined]
    build.__doc__ = f"pytorch-metric-learning's {class_name}."
    return build


MINERS.register_prefix(PREFIX, _resolve)
