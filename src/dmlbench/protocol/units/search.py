"""Hyper-parameter search: one Optuna study per method, each trial a class-disjoint k-fold cross-validation.

Musgrave et al. 2020 (seed 001) §3.3: "we run 50 iterations of bayesian optimization. Each iteration
consists of 4-fold cross validation [...] Training stops when validation accuracy plateaus.
Hyperparameters are optimized to maximize the average validation accuracy." Here:

* one study per method (``study_name`` = method name) in an Optuna storage (``protocol.queue.storage``: by
  default SQLite ``OUTPUT_DIR/study.db``); sampler ``gp`` (``optuna.samplers.GPSampler``, Bayesian
  optimisation with a Gaussian process, the default) or ``tpe``, seeded per slot (``trial_seed``) and
  shown only the done trials of the earlier slots (``MethodSearch._propose``);
* a trial suggests an assignment of the method's search space (``protocol.design.search_space``) and trains
  one run per fold of ``protocol.folds.fold_layout`` with ``data.train_classes`` / ``data.val_classes``
  set to the fold's classes (the training loop never holds a test image) and early stopping with
  ``patience`` evaluations without improvement; its value is the mean over folds of the validation
  selection metric (MAP@R) of each run's best checkpoint;
* a trial that raises (e.g. a diverged loss) or yields a non-finite score is told to Optuna as FAILED
  with its reason in the user attribute ``fail_reason``: it never gets a value;
* every method gets the same number of trials and epochs; both are recorded in the study's user
  attributes (``settings``), with the fold layout and its hash;
* many workers, one study: trials are units of work (``protocol.queue.work``): the budget counts slots, a
  worker takes the next slot under a lock, a trial of a stopped or killed worker is failed
  (``interrupted``, or by Optuna's heartbeat) and its slot re-enqueued once with the same parameters;
  resuming is the same thing as joining late. With ``protocol.parallel_trials: 1`` (the default)
  slot ``k`` waits for every earlier slot, so the search is what one worker would do, whoever runs it;
* with ``protocol.fold_units: true`` every fold run of a trial is a unit of its own, which any worker
  may take, and the trial is their fold mean once they are done (``protocol.fold_units``).

With ``protocol.frozen_trunk`` a fold run trains only the head on the fold's cached trunk features
(``protocol.units.feature_cache``; the trunks in ``OUTPUT_DIR/trunks``, the features in ``OUTPUT_DIR/features``).

Every run directory is ``OUTPUT_DIR/METHOD/trial_SSSS/fold_I`` (``SSSS``: the slot) and its ``run.json`` records ``method``,
``stage`` (``search``), ``trial``, ``fold``, ``fold_layout_hash``, ``train_classes`` and ``val_classes``.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from dmlbench.protocol import layout
from dmlbench.protocol.design.folds import ClassFold, FoldLayout
from dmlbench.protocol.design.plan import Context, MethodPlan, SearchSettings
from dmlbench.protocol.queue import attempts, work
from dmlbench.protocol.queue.storage import redact
from dmlbench.protocol.units.feature_cache import FeatureCache
from dmlbench.protocol.units.fold_units import FoldRun, FoldRunner, FoldUnits
from dmlbench.protocol.units.unit import Attempt, Unit, run_samples, validation_curves
from dmlbench.training import train_or_resume


@dataclass
class SearchResult:
    """The state of one method's study: trial counts, the best trial's value and parameters."""

    method: str
    storage: str
    completed: int
    failed: int
    pruned: int
    best_value: float | None
    best_params: dict[str, Any] | None
    fold_layout_hash: str
    trials: list[dict[str, Any]] = field(default_factory=list)


class TrialFailed(RuntimeError):
    """A trial that has no score (a failed run, a non-finite validation score)."""


def make_sampler(settings: SearchSettings, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The seeded sampler: ``GPSampler`` (Bayesian optimisation, seed 001 §3.3) or ``TPESampler``;
    ``seed`` replaces ``settings.seed`` (one sampler is seeded per trial, ``trial_seed``)."""
    seed = settings.seed if seed is None else seed
    startup = {} if settings.startup_trials is None else {"n_startup_trials": settings.startup_trials}
    if settings.sampler == "gp":
        _one_acquisition_optimiser()
        return optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False, **startup)
    return optuna.samplers.TPESampler(seed=seed, **startup)


class _GreenletUnused:
    """Stands in for Optuna's record of whether ``greenlet`` imported: it never did."""

    @staticmethod
    def is_successful() -> bool:
        return False


def _one_acquisition_optimiser() -> None:
    """Make the GP sampler's proposals independent of whether ``greenlet`` is installed.

    Optuna's GP sampler maximises its acquisition function from several start points; with the
    ``greenlet`` package importable (other packages install it) it evaluates them in batches, without
    it one at a time. The two round differently: the proposals differ in the 14th digit, the runs
    they train differ, and so do the trials proposed after them. One path, the one-at-a-time one (the
    committed studies took it), keeps a search the same on every machine and across a resume. An
    Optuna without that module has no batched path to avoid (tests/test_protocol_search.py runs the
    search with and without greenlet, so a renamed one is caught there). The module's warning on
    import without greenlet ("may lead to slower suggestions") is held back: the path is chosen."""
    logger = logging.getLogger("optuna._gp.batched_lbfgsb")
    logger.addFilter(_without_greenlet_warning)
    try:
        from optuna._gp import batched_lbfgsb
    except ImportError:
        return
    finally:
        logger.removeFilter(_without_greenlet_warning)
    batched_lbfgsb._greenlet_imports = _GreenletUnused()  # type: ignore[assignment]


def _without_greenlet_warning(record: logging.LogRecord) -> bool:
    return "'greenlet' package is unavailable" not in record.getMessage()


def make_pruner(settings: SearchSettings) -> optuna.pruners.BasePruner:
    """``median``: stop a trial after a fold when its running fold-mean is below the median of the
    earlier trials' running means at that fold (after 2 finished trials); ``none``: every trial runs
    all its folds. Deterministic, so a resumed study prunes as an uninterrupted one would."""
    if settings.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    return optuna.pruners.NopPruner()


def trial_seed(seed: int, index: int) -> int:
    """The sampler seed of the ``index``-th budgeted trial of a study searched with ``seed``.

    A fresh sampler seeded from (seed, index) suggests each trial, so a suggestion depends only on
    the study's stored trials, never on the process history: a search resumed after a kill makes
    the same suggestions as one that ran through."""
    digest = hashlib.sha256(f"dmlbench-search:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % (2**31 - 1)


class MethodSearch(Unit):
    """One method's study as units of work (slot ``k``: trial ``k``, one run per fold); ``step()``
    runs one trial this worker took, or says ``work.WAIT`` (the rest is running elsewhere) or ``work.DONE``."""

    def __init__(self, plan: MethodPlan, settings: SearchSettings, context: Context,
                 features: FeatureCache | None = None) -> None:
        self.plan, self.settings, self.context, self.features = plan, settings, context, features
        self.done = False
        with context.worker.lock.held():
            # Every suggestion is made in a separate seeded study (``propose``): this one's sampler
            # never samples, it only hands out the enqueued parameters.
            self.study = optuna.create_study(
                storage=context.worker.storage, study_name=plan.name, direction="maximize",
                sampler=attempts.EnqueuedOnly(), pruner=make_pruner(settings), load_if_exists=True,
            )
            _check_or_record_settings(self.study, plan, settings, context.layout, context.config_hash)
            if self.study.user_attrs.get("trials") != settings.trials:
                self.study.set_user_attr("trials", settings.trials)  # the budget ``dmlbench status`` counts against
        # ``protocol.fold_units``: the trials' fold runs are units of their own, each trial their mean.
        self.folds = (FoldUnits(plan, settings, context, self.study, self._train, self._ready, self._propose)
                      if settings.fold_units else None)

    @property
    def method(self) -> str:
        return self.plan.name

    def step(self) -> str:
        """With fold units, one of them if there is one to take, else a trial whose folds are done."""
        if self.folds is not None and (state := self.folds.step()) not in (work.WAIT, work.DONE):
            return state
        return super().step()

    def claim(self) -> work.Claim | str:
        if self.folds is not None:
            return self.folds.claim_trial()
        return work.claim(self.study, self.context.worker, budget=self.settings.trials, ready=self._ready,
                          propose=self._propose)

    def attempt(self, claimed: work.Claim) -> Attempt:
        if self.folds is not None:
            return self.folds.trial_attempt(claimed, lambda fold_run: self._body(claimed, fold_run))
        samples: list[int] = []  # each fold run's, as it ends: a pruned or failed trial counts the folds it trained
        return Attempt(self._body(claimed, lambda fold, assignment: self._train(claimed.slot, fold, assignment, samples)),
                       lambda: sum(samples))

    def _train(self, slot: int, fold: ClassFold, assignment: Mapping[str, Any], samples: list[int]) -> FoldRun:
        return train_fold(self.plan, self.context, slot, fold, assignment, self.features, samples)

    def _body(self, claimed: work.Claim, fold_run: FoldRunner) -> Callable[[dict[str, Any]], float]:
        """The claimed trial's cross-validation with ``fold_run`` giving each fold's run."""
        def body(attributes: dict[str, Any]) -> float:
            mean, found = _cross_validate(claimed.trial, self.plan, self.context, fold_run)
            attributes.update(found)
            return mean

        return body

    def announce(self, claimed: work.Claim, outcome: str | None, value: float | None) -> None:
        if outcome is not None and outcome.startswith("failed"):
            work.announce_failure(f"{self.method} trial {claimed.slot}", outcome)
        elif self.context.progress:
            shown = outcome if outcome is not None else f"{value:.4f} {claimed.trial.params}"
            print(f"== {self.method} trial {claimed.slot}: {shown}", flush=True)

    def _ready(self, slot: int, finished: Mapping[int, FrozenTrial]) -> bool:
        """Slot ``k`` waits for every slot before its batch of ``parallel_trials`` (1: for every
        earlier slot, sequential Bayesian optimisation as in seed 001 §3.3)."""
        cutoff = slot - slot % self.settings.parallel_trials
        return all(earlier in finished for earlier in range(cutoff))

    def _propose(self, slot: int, finished: Mapping[int, FrozenTrial]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The parameters of slot ``k``: a sampler seeded with ``trial_seed(seed, k)`` that sees the
        done trials of the slots before its batch, in slot order, and nothing else, so what it
        suggests depends neither on timing nor on which worker asks, nor on interruptions."""
        cutoff = slot - slot % self.settings.parallel_trials
        history = optuna.create_study(direction="maximize", sampler=make_sampler(self.settings, trial_seed(self.settings.seed, slot)))
        for earlier in range(cutoff):
            trial = finished[earlier]
            history.add_trial(optuna.trial.create_trial(
                state=trial.state, value=trial.value if trial.state != TrialState.FAIL else None,
                params=dict(trial.params), distributions=dict(trial.distributions),
                intermediate_values=dict(trial.intermediate_values),
            ))
        suggestion = history.ask()
        assignment = self.plan.space.suggest(suggestion)
        return dict(suggestion.params), {"params": assignment}

    def result(self) -> SearchResult:
        return _result(self.study, self.method, self.settings.storage, self.context.layout)


def train_fold(plan: MethodPlan, context: Context, slot: int, fold: ClassFold, assignment: Mapping[str, Any],
               features: FeatureCache | None, samples: list[int]) -> FoldRun:
    """Train (or resume) fold ``fold``'s run of search slot ``slot`` with ``assignment``, scored by its
    best validation checkpoint; its training samples are appended to ``samples`` once it trained;
    ``TrialFailed`` without a finite validation score."""
    config = plan.run_config(assignment, fold)
    run_dir = layout.fold_dir(layout.trial_dir(context.output_dir, plan.name, slot), fold.index)
    record = {"method": plan.name, "stage": layout.SEARCH_STAGE, "trial": slot, "fold": fold.index,
              "fold_layout_hash": context.layout.hash, "config_hash": context.config_hash}
    context.report({**record, "run_dir": str(run_dir)})
    result = train_or_resume(config, run_dir, progress=context.progress, record=record,
                             features=None if features is None else features.features(fold), placement=context.placement,
                             tracker_failures=context.tracker_failures)
    samples.append(run_samples(run_dir))
    key = config.evaluation.selection_metric
    score = None if result.best_validation is None else result.best_validation.get(key)
    if score is None or not math.isfinite(score):
        raise TrialFailed(f"fold {fold.index}: no finite validation {key} (best checkpoint: {result.best_epoch})")
    return FoldRun(float(score), str(run_dir), result.epochs_run, validation_curves(run_dir))


def _cross_validate(
    trial: optuna.trial.Trial, plan: MethodPlan, context: Context, fold_run: FoldRunner,
) -> tuple[float, dict[str, Any]]:
    """One run per fold with the trial's assignment (``fold_run``: trained here, or read from the
    trial's fold units); the fold-mean best validation score.

    The run directories are the slot's (``trial_SSSS``): a retried slot continues the fold runs its
    killed attempt left (completed ones are kept, a partial one resumes from its checkpoint)."""
    assignment = plan.space.suggest(trial)
    folds = context.layout.folds
    runs: list[FoldRun] = []
    for fold in folds:
        runs.append(fold_run(fold, assignment))
        scores = [run.score for run in runs]
        if len(scores) < len(folds):
            trial.report(sum(scores) / len(scores), step=len(scores) - 1)
            if trial.should_prune():
                raise optuna.TrialPruned(f"fold-mean {sum(scores) / len(scores):.4f} after {len(scores)} fold(s)")
    scores = [run.score for run in runs]
    value = sum(scores) / len(scores)
    return value, {"fold_values": scores, "run_dirs": [run.run_dir for run in runs],
                   "epochs_run": [run.epochs_run for run in runs], "curves": [run.curves for run in runs]}


def _check_or_record_settings(
    study: optuna.Study, plan: MethodPlan, settings: SearchSettings, fold_layout: FoldLayout, config_hash: str,
) -> None:
    """Record the shared budget and fold layout on a new study; refuse to resume one made differently."""
    config = plan.config
    recorded = {
        "settings": settings.recorded(),
        "epochs": config.training.epochs,
        "early_stopping_patience": config.training.early_stopping_patience,
        "selection_metric": config.evaluation.selection_metric,
        "fold_layout_hash": fold_layout.hash,
        "config_hash": config_hash,
    }
    work.record_or_check(study, recorded)
    if "fold_layout" not in study.user_attrs:  # the layout itself, for the report; its hash is checked above
        study.set_user_attr("fold_layout", fold_layout.as_dict())


def _result(study: optuna.Study, method: str, url: str, fold_layout: FoldLayout) -> SearchResult:
    trials = study.get_trials(deepcopy=False)
    budgeted = attempts.counted(study)
    complete = [trial for trial in budgeted if trial.state == TrialState.COMPLETE]
    best = best_trial(study)
    return SearchResult(
        method=method,
        storage=redact(url),
        completed=len(complete),
        failed=sum(1 for trial in budgeted if trial.state == TrialState.FAIL),
        pruned=sum(1 for trial in budgeted if trial.state == TrialState.PRUNED),
        best_value=None if best is None else float(best.value),  # type: ignore[arg-type]
        best_params=None if best is None else dict(best.params),
        fold_layout_hash=fold_layout.hash,
        trials=[
            {"number": trial.number, "state": trial.state.name, "value": trial.value, "params": dict(trial.params),
             "user_attrs": dict(trial.user_attrs)}
            for trial in trials
        ],
    )


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The counted COMPLETE trial with the highest value; ties go to the earliest slot, so every
    worker (and any order of finishing) picks the same one."""
    complete = [trial for trial in attempts.counted(study) if trial.state == TrialState.COMPLETE]
    return max(complete, key=lambda trial: (trial.value, -(attempts.slot_of(trial) or 0))) if complete else None


def failed_search_text(reasons: Sequence[str | None]) -> str:
    """Why a method has no result when none of its search trials completed, with the first trial's own
    reason (a plugin's exception, named with its file and line): what to fix before --retry-failed."""
    first = next((reason for reason in reasons if reason), None)
    return f"no search trial completed ({len(reasons)} failed" + (f"; the first: {first})" if first else ")")
