"""Which attempt of a slot counts: a unit of work is a slot (``work`` module docstring) and its attempts
are the Optuna trials that carry that slot; the first attempt that is done counts, unless
``work.retry_failed`` asked for it again after a failure of its own."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

RETRY_OF_FAILED = "retry_of_failed"  # a new attempt of a failed slot, asked for by benchmark --retry-failed


def slot_of(trial: FrozenTrial) -> int | None:
    slot = trial.user_attrs.get("slot")
    return None if slot is None else int(slot)


def interrupted(trial: FrozenTrial) -> bool:
    """FAILED without a reason of its own: the worker stopped, the trial did not fail."""
    return trial.state == TrialState.FAIL and (bool(trial.user_attrs.get("interrupted")) or "fail_reason" not in trial.user_attrs)


def done(trial: FrozenTrial) -> bool:
    return trial.state in (TrialState.COMPLETE, TrialState.PRUNED) or (trial.state == TrialState.FAIL and not interrupted(trial))


def slots(trials: Iterable[FrozenTrial]) -> dict[int, list[FrozenTrial]]:
    grouped: dict[int, list[FrozenTrial]] = {}
    for trial in trials:
        if (slot := slot_of(trial)) is not None:
            grouped.setdefault(slot, []).append(trial)
    return grouped


def done_trial(attempts: list[FrozenTrial]) -> FrozenTrial | None:
    """The attempt of a slot that counts (the first one that is done and not retried by ``retry_failed``), if any."""
    retried = {int(t.user_attrs[RETRY_OF_FAILED]) for t in attempts if RETRY_OF_FAILED in t.user_attrs}
    return next((trial for trial in sorted(attempts, key=lambda t: t.number) if done(trial) and trial.number not in retried), None)


def finished(grouped: dict[int, list[FrozenTrial]]) -> dict[int, FrozenTrial]:
    """The done trial of every finished slot of ``slots(...)``'s grouping (what ``work.claim`` decides on)."""
    return {slot: trial for slot, attempts in grouped.items() if (trial := done_trial(attempts)) is not None}


def fixed_params(trial: FrozenTrial) -> dict[str, Any]:
    """The parameters an attempt of a slot was enqueued with (an attempt stopped before its unit
    suggested them has none in ``params``): what another attempt of the slot is enqueued with."""
    return {**trial.system_attrs.get("fixed_params", {}), **trial.params}


def counted(study: optuna.Study) -> list[FrozenTrial]:
    """One trial per done slot, in slot order: what the budget, the report and the audit count."""
    chosen = (done_trial(attempts) for _, attempts in sorted(slots(study.get_trials(deepcopy=False)).items()))
    return [trial for trial in chosen if trial is not None]


class EnqueuedOnly(optuna.samplers.BaseSampler):
    """The sampler of a study of units: it hands out the parameters each slot was enqueued with and
    never draws one. A unit asking for a parameter its slot was not enqueued with is a bug of the work
    queue (a retry that lost its parameters once took a fresh random draw here, silently): it fails."""

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        return {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, Any]) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: Any) -> Any:
        raise RuntimeError(f"{study.study_name} trial {trial.number}: parameter {param_name!r} was not fixed when its "
                           "slot was enqueued (units never sample; a dmlbench bug)")
