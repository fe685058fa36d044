"""The stages of a benchmark, in the order ``schedule.Schedule`` takes their units: every method's
search, a method's reproductions once its search is done, the baselines once every search is done.

A stage is one class: ``make_ready()`` makes the units whose readiness condition now holds (each
once; they are kept) and ``units()`` lists the units made so far, in the order they are taken. A
stage that waits on another is given it when it is made. The schedule yields the stages' units in
order and asks every stage to ``make_ready`` after each unit it stepped, so a unit is made the
moment what it waits for is done, and takes its place in the order then.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace

from dmlbench.protocol.design.plan import Context
from dmlbench.protocol.design.prepare import Prepared
from dmlbench.protocol.units.baseline import Baseline, recorded_reference
from dmlbench.protocol.units.feature_cache import FeatureCache
from dmlbench.protocol.units.reproductions import MethodReproduction
from dmlbench.protocol.units.search import MethodSearch, best_trial
from dmlbench.protocol.units.unit import Unit


class Stage(ABC):
    """One kind of unit in the schedule and when its units are ready to be made."""

    @abstractmethod
    def make_ready(self) -> None:
        """Make the units whose readiness condition holds now and that were not made before."""

    @abstractmethod
    def units(self) -> list[Unit]:
        """The units made so far, in the order they are taken."""


class SearchStage(Stage):
    """Every method's Optuna search, and each repeat of a search after the methods' first: ready from
    the start (the frozen trunk's feature cache, one per fold, shared by all of them)."""

    def __init__(self, prepared: Prepared, context: Context) -> None:
        plans = prepared.plans
        # The search's trunks, one per fold, shared by every method: the first method's config.
        features = (FeatureCache(next(iter(plans.values())).budgeted, prepared.output_dir, prepared.dataset_hash,
                                 context.progress, context.placement) if prepared.search.frozen_trunk else None)
        self.searches = {name: MethodSearch(plan, prepared.search, context, features) for name, plan in plans.items()}
        # The repeated searches after every method's first, each with its own seeds, folds and reproductions.
        self.repeats = prepared.repeats
        self.searches.update({name: MethodSearch(repeat.plan, repeat.search, replace(context, layout=repeat.layout), features)
                              for name, repeat in self.repeats.items()})

    @property
    def done(self) -> bool:
        return all(search.done for search in self.searches.values())

    def make_ready(self) -> None:
        """Nothing: every search is made with the stage."""

    def units(self) -> list[Unit]:
        return list(self.searches.values())


class ReproductionStage(Stage):
    """A method's reproductions, ready once its search is done and has a best trial (whose parameters
    they train with); in the order of the searches."""

    def __init__(self, prepared: Prepared, context: Context, search: SearchStage) -> None:
        self.prepared, self.context, self.search = prepared, context, search
        self.reproductions: dict[str, MethodReproduction] = {}

    def make_ready(self) -> None:
        for name, search in self.search.searches.items():
            if search.done and name not in self.reproductions and (best := best_trial(search.study)) is not None:
                repeat = self.search.repeats.get(name)
                settings, context = ((self.prepared.reproduction, self.context) if repeat is None
                                     else (repeat.reproduction, replace(self.context, layout=repeat.layout)))
                self.reproductions[name] = MethodReproduction(search.plan, dict(best.params), settings, context)

    def units(self) -> list[Unit]:
        return list(self.reproductions.values())


class BaselineStage(Stage):
    """The baselines (``protocol.baselines``), ready once every search is done and a method has
    reproductions: the first method of the benchmark with reproductions is their reference."""

    def __init__(self, prepared: Prepared, context: Context, search: SearchStage,
                 reproduction: ReproductionStage) -> None:
        self.prepared, self.context, self.search, self.reproduction = prepared, context, search, reproduction
        self.baselines: list[Baseline] = []

    def make_ready(self) -> None:
        reproductions = self.reproduction.reproductions
        if self.baselines or not self.search.done:
            return
        # Only a method's own search can be the reference (not a repeat of it): none, no baselines.
        candidates = [name for name in self.prepared.plans if name in reproductions]
        recorded = recorded_reference(self.context, list(self.prepared.spec.protocol.baselines))
        reference = recorded if recorded in candidates else next(iter(candidates), None)
        if reference is not None:
            self.baselines = [Baseline(kind, self.prepared.plans[reference], reproductions[reference].params,
                                       self.prepared.reproduction, self.context)
                              for kind in self.prepared.spec.protocol.baselines]

    def units(self) -> list[Unit]:
        return list(self.baselines)
