"""What the toy experiment trains and what it found: its settings, each trained model, the result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from dmlbench.errors import UserInputError
from dmlbench.toy.lines import VARIANTS, LineData, check_variant
from dmlbench.validation import check_probability

DEFAULT_SEEDS = 10
DEFAULT_P_SWITCH = 0.001
ITERATIONS = 200


@dataclass(frozen=True)
class ToySettings:
    """What ``run`` trains; the module docstring gives the fixed choices."""

    variants: tuple[str, ...] = VARIANTS
    seeds: int = DEFAULT_SEEDS
    p_switches: tuple[float, ...] = (DEFAULT_P_SWITCH,)
    iterations: int = ITERATIONS

    def __post_init__(self) -> None:
        variants = tuple(dict.fromkeys(check_variant(v) for v in self.variants))
        if not variants:
            raise UserInputError("give at least one toy variant")
        if isinstance(self.seeds, bool) or not isinstance(self.seeds, int) or self.seeds < 2:
            raise UserInputError(f"seeds must be an integer >= 2 (a 95% interval needs two runs), got {self.seeds!r}")
        if isinstance(self.iterations, bool) or not isinstance(self.iterations, int) or self.iterations < 1:
            raise UserInputError(f"iterations must be an integer >= 1, got {self.iterations!r}")
        p_switches = tuple(sorted(set(float(check_probability("p_switch", p)) for p in self.p_switches) - {0.0}))
        object.__setattr__(self, "variants", variants)
        object.__setattr__(self, "p_switches", p_switches)

    @property
    def models(self) -> tuple[float, ...]:
        """The p_switch of every model: 0 (plain) first, then the regularised ones in increasing order."""
        return (0.0, *self.p_switches)


@dataclass
class ModelRun:
    """One trained model: its embeddings, rho and spectrum of the training data, test Recall@1."""

    p_switch: float
    seed: int
    data: LineData
    train_embeddings: Tensor
    test_embeddings: Tensor
    rho: float
    singular_values: list[float]
    recall_at_1: float
    switched_tuples: int
    final_loss: float


@dataclass
class ToyResult:
    settings: ToySettings
    runs: dict[str, dict[float, list[ModelRun]]] = field(default_factory=dict)  # variant -> p_switch -> per seed
    summary: dict[str, Any] = field(default_factory=dict)
