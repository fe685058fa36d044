"""What every unit of the protocol works from, built once by ``protocol.design.prepare``: the settings of
the search and the reproductions (views of the validated ``protocol`` section), each method's plan
(its configs and search space) and the context the units share (output directory, fold layout,
worker). A unit never rebuilds any of it."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from dmlbench import config as config_module
from dmlbench.errors import UserInputError
from dmlbench.protocol.design.benchmark import FRESH_SEEDS, SEARCH_SEED_STRIDE, BenchmarkSpec, ProtocolSpec
from dmlbench.protocol.design.folds import ClassFold, FoldLayout, resplit
from dmlbench.protocol.design.search_space import SearchSpace
from dmlbench.protocol.layout import search_repeat_name
from dmlbench.protocol.queue import work
from dmlbench.training.placement import STANDALONE, Placement
from dmlbench.training.tracking import TrackerFailures

# Keys the protocol sets for every method alike; a search space may not search them.
PROTOCOL_KEYS = ("seed", "training.epochs", "training.early_stopping_patience", "data.train_classes", "data.val_classes")


@dataclass(frozen=True)
class SearchSettings:
    """The budget and machinery of a search, the same for every method (recorded in each study).

    ``epochs``: maximum epochs of every run (``None``: the methods' common ``training.epochs``);
    ``patience``: early stopping after this many evaluations without improvement (``None``: none);
    ``fold_units``: each fold run of a trial is its own unit of work (``protocol.fold_units``).
    """

    trials: int
    folds: int
    fold_mode: str
    epochs: int | None
    patience: int | None
    sampler: str
    seed: int
    storage: str
    pruner: str
    startup_trials: int | None
    parallel_trials: int
    frozen_trunk: bool
    fold_units: bool

    @classmethod
    def of(cls, protocol: ProtocolSpec, storage: str) -> SearchSettings:
        return cls(trials=protocol.trials, folds=protocol.folds, fold_mode=protocol.fold_mode, epochs=protocol.epochs,
                   patience=protocol.patience, sampler=protocol.sampler, seed=protocol.search_seed, storage=storage,
                   pruner=protocol.pruner, startup_trials=protocol.startup_trials,
                   parallel_trials=protocol.parallel_trials, frozen_trunk=protocol.frozen_trunk,
                   fold_units=protocol.fold_units)

    def recorded(self) -> dict[str, Any]:
        """What must not change when a study is resumed: everything but ``trials``, ``storage`` and
        ``fold_units`` (who runs a trial's folds changes none of its results; the config hash keeps
        workers scheduling them the two ways apart)."""
        return {key: value for key, value in asdict(self).items() if key not in ("trials", "storage", "fold_units")}


@dataclass(frozen=True)
class ReproductionSettings:
    """How many reproductions, their seeds and the shared training budget (as in the search)."""

    reproductions: int
    first_seed: int
    folds: int
    fold_mode: str
    epochs: int | None
    patience: int | None
    storage: str

    @classmethod
    def of(cls, protocol: ProtocolSpec, storage: str) -> ReproductionSettings:
        return cls(reproductions=protocol.reproductions, first_seed=protocol.first_seed, folds=protocol.folds,
                   fold_mode=protocol.fold_mode, epochs=protocol.epochs, patience=protocol.patience, storage=storage)


@dataclass(frozen=True)
class MethodPlan:
    """One method's configs: ``raw`` (the benchmark's base, the method's overrides, the command-line
    overrides), ``budgeted`` (``raw`` with the protocol's epochs and patience), its validated
    ``config`` and its search ``space``."""

    name: str
    raw: dict[str, Any]
    budgeted: dict[str, Any]
    config: config_module.Config
    space: SearchSpace

    @classmethod
    def build(cls, spec: BenchmarkSpec, name: str, overrides: list[str]) -> MethodPlan:
        """The plan of method ``name``; a one-line ``UserInputError`` naming the method."""
        from dmlbench.protocol.design.search_space import parse_search_space

        raw = method_raw_config(spec, name, overrides)
        method = next(method for method in spec.methods if method.name == name)
        space = parse_search_space(method.search, raw, method=name)
        taken = sorted(set(space.keys()) & set(PROTOCOL_KEYS))
        if taken:
            raise UserInputError(f"method {name!r}: search key {taken[0]!r} is set by the protocol, not searched")
        budget = {"training.epochs": spec.protocol.epochs, "training.early_stopping_patience": spec.protocol.patience}
        budgeted = config_module.assign(raw, {key: value for key, value in budget.items() if value is not None})
        try:
            config = config_module.from_dict(copy.deepcopy(budgeted))
        except UserInputError as error:
            raise UserInputError(f"method {name!r}: {error}") from None
        return cls(name, raw, budgeted, config, space)

    def with_seed(self, seed: int) -> MethodPlan:
        """This plan with its runs' training seed (``seed``) set to ``seed``."""
        budgeted = config_module.assign(self.budgeted, {"seed": seed})
        return replace(self, raw=config_module.assign(self.raw, {"seed": seed}), budgeted=budgeted,
                       config=config_module.from_dict(copy.deepcopy(budgeted)))

    def run_config(self, assignment: Mapping[str, Any], fold: ClassFold, seed: int | None = None) -> config_module.Config:
        """The config of one fold run: the budgeted config, the search assignment (or the best
        parameters), the fold's classes and, for a reproduction, its seed."""
        fixed: dict[str, Any] = {} if seed is None else {"seed": seed}
        fixed.update({"data.train_classes": list(fold.train_classes), "data.val_classes": list(fold.val_classes)})
        return config_module.from_dict(config_module.assign(self.budgeted, {**assignment, **fixed}))


@dataclass(frozen=True)
class RepeatedSearch:
    """Search ``k`` >= 1 of a method (``protocol.search_repeats``): its plan under the name ``METHOD@searchK``, its
    search settings (seed ``search_seed + k``), its reproductions' settings and its folds."""

    plan: MethodPlan
    search: SearchSettings
    reproduction: ReproductionSettings
    layout: FoldLayout


def search_seed_offset(protocol: ProtocolSpec, search: int) -> int:
    """What search ``search`` adds to every training seed of search 0: ``search * SEARCH_SEED_STRIDE`` under
    ``protocol.search_seeds: fresh``, nothing under ``shared`` (``ProtocolSpec``'s docstring)."""
    return search * SEARCH_SEED_STRIDE if protocol.search_seeds == FRESH_SEEDS else 0


def search_repeats(plans: Mapping[str, MethodPlan], protocol: ProtocolSpec, settings: SearchSettings,
                   reproduction: ReproductionSettings, layout: FoldLayout,
                   limits: Mapping[str, int] | None = None) -> dict[str, RepeatedSearch]:
    """The repeated searches of ``protocol.search_repeats``, ``METHOD@searchK -> RepeatedSearch`` for repeat ``k``
    >= 1 of each method of ``search_repeat_methods`` (empty: every method): the sampler seed ``search_seed + k``,
    the training seeds moved by ``search_seed_offset`` and, with ``protocol.resplits``, folds cut afresh with
    seed ``search_seed + k`` (the same for every method, which keeps the methods paired by search). ``limits``:
    the searches each method runs so far (a sequential study's rounds, ``protocol.run.rounds``), within those."""
    repeated = {}
    for name, repeat in repeated_searches(plans, protocol, limits):
        offset, plan = search_seed_offset(protocol, repeat), plans[name]
        if offset:
            plan = plan.with_seed(plan.config.seed + offset)
        repeated[search_repeat_name(name, repeat)] = RepeatedSearch(
            replace(plan, name=search_repeat_name(name, repeat)), replace(settings, seed=settings.seed + repeat),
            replace(reproduction, first_seed=reproduction.first_seed + offset),
            resplit(layout, settings.seed + repeat) if protocol.resplits else layout)
    return repeated


def repeated_searches(plans: Mapping[str, MethodPlan], protocol: ProtocolSpec,
                      limits: Mapping[str, int] | None = None) -> list[tuple[str, int]]:
    """``(method, k)`` for every repeat ``k`` >= 1 of ``protocol.search_repeats``, in the order they run;
    ``limits``: at most this many searches of each method (one, for a method it does not name)."""
    chosen = protocol.search_repeat_methods or list(plans)
    return [(name, repeat) for repeat in range(1, protocol.search_repeats) for name in plans
            if name in chosen and (limits is None or repeat < limits.get(name, 1))]


@dataclass
class Context:
    """What the units of one worker share: where they write, the folds, the worker, the benchmark's
    config hash (recorded in every study), how progress is shown, where the worker trains
    (``placement``: its device and threads) and the trackers that failed for its runs."""

    output_dir: Path
    layout: FoldLayout
    worker: work.Worker
    config_hash: str
    progress: bool = False
    reporter: Callable[[dict[str, Any]], None] | None = None
    placement: Placement = STANDALONE
    tracker_failures: TrackerFailures = field(default_factory=set)

    def report(self, event: dict[str, Any]) -> None:
        if self.reporter is not None:
            self.reporter(event)


def method_raw_config(spec: BenchmarkSpec, method_name: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """The raw config mapping of one method: the benchmark's ``base``, the method's overrides, then
    the command-line ``overrides`` (validated; errors name the method)."""
    method = next((m for m in spec.methods if m.name == method_name), None)
    if method is None:
        raise UserInputError(f"unknown method {method_name!r}")
    raw = config_module.apply_overrides(config_module.assign(spec.base, method.overrides), list(overrides or []))
    if spec.plugins:  # the benchmark's plugins go with every run, so that each run records them
        raw["plugins"] = list(dict.fromkeys([*spec.plugins, *raw.get("plugins", [])]))
    try:
        config_module.from_dict(copy.deepcopy(raw), previous=spec.base)
    except UserInputError as error:
        raise UserInputError(f"method {method_name!r}: {error}") from None
    return raw
