"""``protocol.fold_units: true``: every fold run of a search trial (``protocol.search``) is its own
unit of work that any worker may take, so that the search keeps up to methods x folds x
``parallel_trials`` workers busy instead of methods x ``parallel_trials`` (a trial that trains its
folds one after another holds one worker). ``FoldRun`` is what a trial keeps of a fold run either way.

A method's fold units are the fixed units of its fold study ``folds:METHOD`` (``layout.fold_study``),
in the benchmark's storage, so workers on other machines share them as they share the trials. Slot
``k * folds + i`` is fold ``i`` of trial ``k`` (slot ``k`` of the method's study). They are claimed,
retried and marked interrupted as every unit is (``protocol.queue.work``):

* fold 0 of trial ``k`` is enqueued once trial ``k`` may start (``MethodSearch._ready``), with the
  parameters the trial gets (``MethodSearch._propose``: a function of the earlier trials only); the
  trial's other folds copy them;
* a fold unit trains its run (``search.train_fold``) in the trial's directory
  (``METHOD/trial_SSSS/fold_I``: a killed attempt's run resumes from its checkpoint) and stores what
  the trial needs: the best validation score as its value, ``run_dir``, ``epochs_run``, ``curves``
  and, in ``cost``, the samples it saw. A fold after one of its trial that failed is skipped (failed
  as such): a trial stops at its first failing fold;
* trial ``k`` is claimed once its folds are *settled*, every one done or done up to the first that
  failed (``FoldUnits.outcomes``); its unit reads them in fold order and fails with the first failed
  fold's reason, so its value, attributes and failure are those of a trial that trained its folds
  itself, whoever ran which fold and in which order. Its cost is the sum of those folds' costs. A
  worker takes a method's fold units before its trials (``MethodSearch.step``).

The median pruner needs a trial's folds one after another; ``protocol.design.benchmark`` refuses it here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from dmlbench.protocol import layout
from dmlbench.protocol.design.folds import ClassFold
from dmlbench.protocol.design.plan import Context, MethodPlan, SearchSettings
from dmlbench.protocol.queue import attempts, work
from dmlbench.protocol.units.unit import Attempt, Unit, open_unit_study

Finished = Mapping[int, FrozenTrial]  # the done trial of every finished slot of a method's study
FoldRunner = Callable[[ClassFold, Mapping[str, Any]], "FoldRun"]  # a trial's fold run, given the trial's assignment
# Trains fold ``fold`` of trial ``slot`` with an assignment, adding its training samples to a list (``search.train_fold``).
Trainer = Callable[[int, ClassFold, Mapping[str, Any], list[int]], "FoldRun"]


@dataclass(frozen=True)
class FoldRun:
    """What a trial keeps of one of its fold runs: the best validation score of the selection metric,
    the run directory, the epochs it ran and its validation curves."""

    score: float
    run_dir: str
    epochs_run: int
    curves: dict[str, list[float]]


@dataclass
class FoldsCost(work.Cost):
    """A trial's cost as the sum of its fold units' (peak memory: the largest), with the interval
    they ran in (POSIX seconds of the storage's clock), which the report's running time reads."""

    started: float
    completed: float


class FoldUnits(Unit):
    """The fold runs of one method's search trials as units of work (the module docstring); ``step()``
    runs one fold this worker took. ``claim_trial`` and ``trial_attempt`` are the trials' side."""

    def __init__(self, plan: MethodPlan, settings: SearchSettings, context: Context, trials: optuna.Study, train: Trainer,
                 ready: Callable[[int, Finished], bool],
                 propose: Callable[[int, Finished], tuple[dict[str, Any], dict[str, Any]]]) -> None:
        self.plan, self.settings, self.context = plan, settings, context
        self.trials, self.train, self.ready, self.propose = trials, train, ready, propose
        self.folds = settings.folds
        self.done = False
        self.study = open_unit_study(context.worker, layout.fold_study(plan.name), {
            "method": plan.name, "folds": settings.folds, "fold_layout_hash": context.layout.hash,
            "config_hash": context.config_hash,
        })

    def claim(self) -> work.Claim | str:
        with self.context.worker.lock.held():
            done_trials = attempts.finished(attempts.slots(self.trials.get_trials(deepcopy=False)))
            return work.claim(self.study, self.context.worker, budget=self.settings.trials * self.folds,
                              ready=lambda slot, _: self.ready(slot // self.folds, done_trials),
                              propose=lambda slot, _: self._fold_params(slot, done_trials))

    def attempt(self, claimed: work.Claim) -> Attempt:
        trial, index = divmod(claimed.slot, self.folds)
        samples: list[int] = []

        def body(attributes: dict[str, Any]) -> float:
            done = self.outcomes(trial)
            if len(done) <= index and done and done[-1].state != TrialState.COMPLETE:  # the trial ends at that fold
                raise work.UnitFailed(f"skipped: fold {len(done) - 1} of trial {trial} failed")
            run = self.train(trial, self.context.layout.folds[index], self.plan.space.suggest(claimed.trial), samples)
            attributes.update(run_dir=run.run_dir, epochs_run=run.epochs_run, curves=run.curves)
            return run.score

        return Attempt(body, lambda: sum(samples))

    def claim_trial(self) -> work.Claim | str:
        """Slot ``k`` of the method's study once trial ``k``'s folds are settled, with their parameters;
        an attempt enqueued again (``benchmark --retry-failed``, an interrupted one) waits for them too."""
        with self.context.worker.lock.held():
            waiting = self.trials.get_trials(deepcopy=False, states=(TrialState.WAITING,))
            if not all(self.settled(int(trial.user_attrs["slot"])) for trial in waiting):
                return work.WAIT
            return work.claim(self.trials, self.context.worker, budget=self.settings.trials,
                              ready=lambda slot, _: self.settled(slot), propose=lambda slot, _: self._first_fold_params(slot))

    def trial_attempt(self, claimed: work.Claim, body_of: Callable[[FoldRunner], Callable[[dict[str, Any]], float]]) -> Attempt:
        """Trial ``claimed.slot`` from its settled folds: ``body_of(fold_run)`` is the trial's own loop
        over its folds (``search._cross_validate``), given ``fold_run``, which reads each fold's unit."""
        outcomes = self.outcomes(claimed.slot)
        read: list[FrozenTrial] = []

        def fold_run(fold: ClassFold, assignment: Mapping[str, Any]) -> FoldRun:
            if fold.index >= len(outcomes):  # enqueued again since the claim, by --retry-failed on another machine
                raise work.UnitFailed(f"fold {fold.index} has no result: its unit was enqueued again; "
                                      "run benchmark --retry-failed")
            outcome = outcomes[fold.index]
            read.append(outcome)
            if outcome.state != TrialState.COMPLETE:
                raise work.UnitFailed(outcome.user_attrs["fail_reason"])
            found = outcome.user_attrs
            return FoldRun(float(outcome.value), found["run_dir"], found["epochs_run"], found["curves"])  # type: ignore[arg-type]

        return Attempt(body_of(fold_run), lambda: 0, cost=lambda: _summed(read))

    def outcomes(self, trial: int) -> list[FrozenTrial]:
        """The counted attempts of ``trial``'s folds in fold order as far as they are done, ending at
        the first that failed (a trial stops at its first failing fold)."""
        grouped = attempts.slots(self.study.get_trials(deepcopy=False))
        found = []
        for index in range(self.folds):
            outcome = attempts.done_trial(grouped.get(trial * self.folds + index, []))
            if outcome is None:
                break
            found.append(outcome)
            if outcome.state != TrialState.COMPLETE:
                break
        return found

    def settled(self, trial: int) -> bool:
        """Every fold of ``trial`` is done, or every one up to the first that failed."""
        found = self.outcomes(trial)
        return len(found) == self.folds or (bool(found) and found[-1].state != TrialState.COMPLETE)

    def _fold_params(self, slot: int, finished: Finished) -> tuple[dict[str, Any], dict[str, Any]]:
        """Fold 0 of a trial: the trial's parameters (``propose``); its other folds: fold 0's."""
        trial, index = divmod(slot, self.folds)
        return self.propose(trial, finished) if index == 0 else self._first_fold_params(trial)

    def _first_fold_params(self, trial: int) -> tuple[dict[str, Any], dict[str, Any]]:
        first = min(attempts.slots(self.study.get_trials(deepcopy=False))[trial * self.folds], key=lambda t: t.number)
        return attempts.fixed_params(first), {"params": first.user_attrs["params"]}


def _summed(folds: list[FrozenTrial]) -> work.Cost:
    if not folds:  # the trial failed before its first fold (a parameter it was not enqueued with)
        return work.Cost(0.0, 0.0, 0, 0)
    costs = [fold.user_attrs["cost"] for fold in folds]
    return FoldsCost(
        wall_seconds=round(sum(cost["wall_seconds"] for cost in costs), 3),
        cpu_seconds=round(sum(cost["cpu_seconds"] for cost in costs), 3),
        peak_memory_kib=max(cost["peak_memory_kib"] for cost in costs),
        samples_seen=sum(cost["samples_seen"] for cost in costs),
        started=min(fold.datetime_start.timestamp() for fold in folds if fold.datetime_start is not None),
        completed=max(fold.datetime_complete.timestamp() for fold in folds if fold.datetime_complete is not None),
    )
