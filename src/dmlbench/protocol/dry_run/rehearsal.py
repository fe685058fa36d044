"""A benchmark stored as its workers store it, with made-up results, for the dry run (``protocol.dry_run.cost``)
to time the report's real work at the benchmark's real size.

``rehearse`` writes ``benchmark.json`` and drives the real ``schedule.Schedule`` over a throw-away
storage of the kind the workers default to: every study, search trial, reproduction and baseline
the benchmark will store is claimed by its real unit, in the real order (Optuna's sampler proposes
the search's parameters), and completed at once with results of the real shape instead of
training: validation curves of every fold, test scores in every mode, the per-class sums, the
embedding-space quantities. The test scores come from the real scoring (``scoring.score_modes``,
``class_bootstrap.class_sums``) of random embeddings of the test split's size, once, jittered per
reproduction; the values are noise, their number and shape are the real ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dmlbench.analysis.class_bootstrap import class_sums
from dmlbench.evaluation import COUNT_KEYS
from dmlbench.protocol import layout
from dmlbench.protocol.design.prepare import Prepared
from dmlbench.protocol.queue import storage, work
from dmlbench.protocol.run.record import write_benchmark_file
from dmlbench.protocol.run.schedule import Schedule, context_of, drive
from dmlbench.protocol.units.baseline import Baseline
from dmlbench.protocol.units.reproductions import MethodReproduction
from dmlbench.protocol.units.scoring import objective, score_modes
from dmlbench.protocol.units.search import MethodSearch
from dmlbench.protocol.units.unit import Attempt, Unit

SPACE_KEYS = ("rho", "pi_intra", "pi_inter", "pi_ratio")  # reproductions.training_space's
JITTER = 0.01  # spread of a reproduction's made-up scores around its method's


@dataclass(frozen=True)
class SplitSize:
    """The size of the test split the made-up results are scored on (``domains``: how many domains its
    images come from when it is scored cross-domain, else 0)."""

    images: int
    classes: int
    width: int
    domains: int = 0


def made_up_test_split(test: SplitSize, seed: int, folds: int) -> tuple[dict[str, Any], Any, Any]:
    """Random unit embeddings of ``test``'s size for each of ``folds`` fold models, labels spread evenly
    over its classes and, with domains, the k-th image of each class from domain k mod ``test.domains``
    (so that every class has matches in other domains); seeded by ``seed``."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    embeddings = {f"fold {fold}": torch.nn.functional.normalize(torch.randn(test.images, test.width, generator=generator), dim=1)
                  for fold in range(folds)}
    classes = max(test.classes, 1)
    labels = torch.arange(test.images) % classes
    domains = (torch.arange(test.images) // classes) % test.domains if test.domains > 1 else None
    return embeddings, labels, domains


def rehearse(prepared: Prepared, directory: Path, test: SplitSize) -> Prepared:
    """Store the benchmark ``prepared`` describes in ``directory`` with made-up results (see the module
    docstring); the prepared benchmark of that directory and its storage, ready for the report."""
    # Its trials complete whole, without fold units (``protocol.fold_units``): the report reads none.
    rehearsed = replace(prepared, output_dir=directory, storage=storage.default_url(directory, prepared.jobs),
                        search=replace(prepared.search, fold_units=False))
    write_benchmark_file(rehearsed)
    schedule = Schedule(rehearsed, context_of(rehearsed))
    results = _MadeUpResults(prepared, test)

    def units() -> Iterator[_Completed]:
        return (_Completed(unit, results) for unit in schedule.units())

    drive(units)
    return rehearsed


class _MadeUpResults:
    """Results of the real shape for every kind of unit; seeded, so a rehearsal is the same every time."""

    def __init__(self, prepared: Prepared, test: SplitSize) -> None:
        config = next(iter(prepared.configs.values()))
        self.metrics, self.seed = list(config.evaluation.metrics), config.seed
        self.rerank = config.evaluation.rerank.method() if config.evaluation.rerank.kind != "none" else None
        self.folds, self.test = prepared.spec.protocol.folds, test
        epochs, every = config.training.epochs, config.training.eval_every
        self.validations = 1 + epochs // every + (epochs % every != 0)  # epoch 0, the schedule, the last epoch
        self.generator = np.random.default_rng(config.seed)
        self.scored: tuple[dict[str, dict[str, float]], dict[str, Any] | None] | None = None

    def search(self, unit: MethodSearch, claimed: work.Claim, attributes: dict[str, Any]) -> float:
        unit.plan.space.suggest(claimed.trial)  # the trial's parameters, as a search trial's first fold run asks them
        values = self.generator.random(self.folds).tolist()
        directory = layout.trial_dir(unit.context.output_dir, unit.method, claimed.slot)
        attributes.update(fold_values=values, epochs_run=[self.validations - 1] * self.folds, curves=self._curves(),
                          run_dirs=[str(layout.fold_dir(directory, fold)) for fold in range(self.folds)])
        return float(np.mean(values))

    def reproduction(self, unit: MethodReproduction | Baseline, slot: int, attributes: dict[str, Any]) -> float:
        scores, per_class = self._scored()
        jittered = {mode: {metric: float(np.clip(value + self.generator.normal(0.0, JITTER), 0.0, 1.0))
                           for metric, value in metrics.items()} for mode, metrics in scores.items()}
        attributes.update(seed=unit.settings.first_seed + slot, scores=jittered, run_dirs=[])
        if isinstance(unit, MethodReproduction):
            directory = layout.reproduction_dir(Path(), unit.method, slot)  # relative to the output folder
            attributes.update(params=unit.params, curves=self._curves(), embedding_space=[
                dict(zip(SPACE_KEYS, self.generator.random(len(SPACE_KEYS)).tolist())) for _ in range(self.folds)],
                run_dirs=[str(layout.fold_dir(directory, fold)) for fold in range(self.folds)])
            if per_class is not None:
                attributes["class_scores"] = per_class
        return objective(jittered)

    def _curves(self) -> list[dict[str, list[float]]]:
        """Every fold's validation records: each metric and the query counts ``evaluate`` adds."""
        return [{metric: self.generator.random(self.validations).tolist() for metric in [*self.metrics, *COUNT_KEYS]}
                for _ in range(self.folds)]

    def _scored(self) -> tuple[dict[str, dict[str, float]], dict[str, Any] | None]:
        """Test scores and per-class sums, scored for real on random embeddings of the fold models (once:
        the dry run's time goes on the report, not on scoring noise again)."""
        if self.scored is None:
            embeddings, labels, domains = made_up_test_split(self.test, self.seed, self.folds)
            self.scored = (score_modes(embeddings, labels, self.metrics, self.seed, None, domains, self.rerank),
                           class_sums(embeddings, labels, self.metrics, None, domains))
        return self.scored


class _Completed(Unit):
    """A real unit whose claimed slots complete at once with made-up results instead of its work."""

    def __init__(self, unit: Unit, results: _MadeUpResults) -> None:
        self.unit, self.results = unit, results
        self.study, self.context = unit.study, unit.context

    def claim(self) -> work.Claim | str:
        return self.unit.claim()

    def attempt(self, claimed: work.Claim) -> Attempt:
        unit = self.unit
        if isinstance(unit, MethodSearch):
            return Attempt(lambda attributes: self.results.search(unit, claimed, attributes), lambda: 0)
        assert isinstance(unit, (MethodReproduction, Baseline)), type(unit)
        return Attempt(lambda attributes: self.results.reproduction(unit, claimed.slot, attributes), lambda: 0)

    def step(self) -> str:
        state = super().step()
        self.unit.done = self.done  # what the stages read to make the units that wait on this one
        return state
