"""The one shape of a unit of work (a method's search trial, one of its reproductions, one of the
untrained baseline's) and the helpers its kinds share. ``Unit.step`` claims a slot of the unit's
study (``claim``), runs it inside ``work.execute`` (``attempt``: its body and the training samples it
cost) and says what happened (``announce``); ``protocol.run.schedule`` steps the units in order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from dmlbench.errors import UserInputError
from dmlbench.protocol.design.plan import Context, ReproductionSettings
from dmlbench.protocol.queue import attempts, work
from dmlbench.training import records


@dataclass
class Attempt:
    """One claimed slot's work: ``body(attributes)`` runs it and returns its value (``work.execute``'s
    body); ``samples_seen()``, asked after the body ended (completed, pruned or failed), counts the
    training samples it cost; ``cost()``, where given, is its whole cost record instead of the one
    measured around the body (a trial of fold units: the sum of its folds', which other workers ran)."""

    body: Callable[[dict[str, Any]], float]
    samples_seen: Callable[[], int]
    cost: Callable[[], work.Cost] | None = None


class Unit(ABC):
    """A stream of units of work over one study: ``step()`` runs one slot this worker took, or says
    ``work.WAIT`` (the rest is running elsewhere) or ``work.DONE``; ``done`` once it said DONE."""

    study: optuna.Study
    context: Context
    done: bool = False

    @abstractmethod
    def claim(self) -> work.Claim | str:
        """A slot for this worker (``work.claim``), or ``work.WAIT`` / ``work.DONE``."""

    @abstractmethod
    def attempt(self, claimed: work.Claim) -> Attempt:
        """What running the claimed slot does and costs."""

    def announce(self, claimed: work.Claim, outcome: str | None, value: float | None) -> None:
        """Say what happened to the slot: ``outcome`` is ``work.execute``'s (``None``: completed with
        ``value``). Silent unless a kind of unit says otherwise."""

    def step(self) -> str:
        claimed = self.claim()
        if isinstance(claimed, str):
            self.done = claimed == work.DONE
            return claimed
        started = work.Cost.start()
        attempt = self.attempt(claimed)
        values: list[float] = []

        def body(attributes: dict[str, Any]) -> float:
            values.append(attempt.body(attributes))
            return values[-1]

        outcome = work.execute(self.study, claimed, self.context.worker, body,
                               attempt.cost or (lambda: work.Cost.since(started, attempt.samples_seen())))
        self.announce(claimed, outcome, values[-1] if values else None)
        return "worked"


def open_unit_study(worker: work.Worker, name: str, recorded: Mapping[str, Any]) -> optuna.Study:
    """Create or load a study of fixed units; refuse one that was made for other work."""
    with worker.lock.held():
        study = optuna.create_study(storage=worker.storage, study_name=name, direction="maximize",
                                    sampler=attempts.EnqueuedOnly(), load_if_exists=True)
        work.record_or_check(study, recorded)
    return study


def claim_reproduction(study: optuna.Study, worker: work.Worker, settings: ReproductionSettings) -> work.Claim | str:
    """Reproduction slot ``r`` (seed ``first_seed + r``) for this worker, or ``work.WAIT`` / ``work.DONE``."""
    return work.claim(study, worker, budget=settings.reproductions, ready=lambda slot, finished: True,
                      propose=lambda slot, finished: ({}, {"seed": settings.first_seed + slot}))


def run_samples(run_dir: Path) -> int:
    """Training samples a run has seen (0 for a run that recorded none, or whose record is damaged: the
    unit's failure names that file)."""
    try:
        return int(records.read_run_record(run_dir).get("samples_seen", 0)) if (run_dir / records.RUN_FILE).is_file() else 0
    except UserInputError:
        return 0


def validation_curves(run_dir: Path) -> dict[str, list[float]]:
    """The run's validation curve of each metric (epoch 0 = untrained), stored with its trial so the
    report needs no run directory (workers on other machines have their own)."""
    curves: dict[str, list[float]] = {}
    for entry in records.read_metrics(run_dir):
        for metric, value in (entry.get("validation") or {}).items():
            curves.setdefault(metric, []).append(float(value))
    return curves
