"""Hyper-parameter search: one Optuna study per method, each trial a class-disjoint k-fold cross-validation.

Musgrave et al. 2020 (seed 001) §3.3: "we run 50 iterations of bayesian optimization. Each iteration
consists of 4-fold cross validation [...] Training stops when validation accuracy plateaus.
Hyperparameters are optimized to maximize the average validation accuracy." Here:

* one study per method (``study_name`` = method name) in an Optuna RDB storage, by default SQLite
  ``OUTPUT_DIR/study.db`` (any SQLAlchemy URL works); sampler ``gp`` (``optuna.samplers.GPSampler``,
  Bayesian optimisation with a Gaussian process, the default) or ``tpe``, both seeded;
* a trial suggests an assignment of the method's search space (``protocol.search_space``) and trains
  one run per fold of ``protocol.folds.fold_layout`` with ``data.train_classes`` / ``data.val_classes``
  set to the fold's classes (the training loop never holds a test image) and early stopping with
  ``patience`` evaluations without improvement; its value is the mean over folds of the validation
  selection metric (MAP@R) of each run's best checkpoint;
* a trial that raises (e.g. a diverged loss) or yields a non-finite score is told to Optuna as FAILED
  with its reason in the user attribute ``fail_reason``: it never gets a value;
* every method gets the same number of trials and epochs; both are recorded in the study's user
  attributes (``settings``), with the fold layout and its hash;
* resume: calling again continues the study. Finished trials (complete or failed) are kept and count
  towards the budget; a trial left RUNNING by a killed process is marked FAILED (``interrupted``) and
  its parameters are enqueued once (``study.enqueue_trial``) to be run again; it does not count.
  A study therefore has one writer at a time: two processes searching the same study at once would
  take each other's running trials for interrupted ones.

Every run directory is ``OUTPUT_DIR/METHOD/trial_NNNN/fold_I`` and its ``run.json`` records ``method``,
``stage`` (``search``), ``trial``, ``fold``, ``fold_layout_hash``, ``train_classes`` and ``val_classes``.
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from dmlbench import config as config_module
from dmlbench.errors import RunInterrupted, UserInputError
from dmlbench.protocol.benchmark import BenchmarkSpec
from dmlbench.protocol.folds import DEFAULT_K, FOLD_MODES, FoldLayout, fold_layout
from dmlbench.protocol.search_space import SearchSpace, apply_assignment, parse_search_space
from dmlbench.training import records, train
from dmlbench.training.setup import load_dataset

STUDY_FILE = "study.db"
SUMMARY_FILE = "search.json"
SAMPLERS = ("gp", "tpe")
PRUNERS = ("none", "median")
STAGE = "search"
# Keys the protocol sets for every method alike; a search space may not search them.
PROTOCOL_KEYS = ("seed", "training.epochs", "training.early_stopping_patience", "data.train_classes", "data.val_classes")


@dataclass(frozen=True)
class SearchSettings:
    """The budget and machinery of a search, the same for every method (recorded in each study).

    ``epochs``: maximum epochs of every run (``None``: the methods' common ``training.epochs``);
    ``patience``: early stopping after this many evaluations without improvement (``None``: none).
    """

    trials: int = 10
    folds: int = DEFAULT_K
    fold_mode: str = "contiguous"
    epochs: int | None = None
    patience: int | None = None
    sampler: str = "gp"
    seed: int = 0
    storage: str | None = None
    pruner: str = "none"

    def check(self) -> None:
        """One-line ``UserInputError`` for a setting out of range."""
        check_budget("search", counts={"trials": self.trials, "folds": self.folds}, epochs=self.epochs,
                     patience=self.patience, seed=self.seed, fold_mode=self.fold_mode)
        if self.sampler not in SAMPLERS:
            raise UserInputError(f"search sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        if self.pruner not in PRUNERS:
            raise UserInputError(f"search pruner must be one of {', '.join(PRUNERS)}, got {self.pruner!r}")

    def recorded(self) -> dict[str, Any]:
        """What must not change when a study is resumed (everything but ``trials`` and ``storage``)."""
        return {key: value for key, value in asdict(self).items() if key not in ("trials", "storage")}


@dataclass
class SearchResult:
    """The state of one method's study after ``run_search``."""

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


def storage_url(output_dir: Path, storage: str | None = None) -> str:
    """``storage`` if given (any SQLAlchemy URL), else SQLite ``OUTPUT_DIR/study.db``."""
    return storage if storage else f"sqlite:///{Path(output_dir).resolve() / STUDY_FILE}"


def make_sampler(settings: SearchSettings, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The seeded sampler: ``GPSampler`` (Bayesian optimisation, seed 001 §3.3) or ``TPESampler``;
    ``seed`` replaces ``settings.seed`` (``run_search`` seeds one sampler per trial, ``trial_seed``)."""
    seed = settings.seed if seed is None else seed
    if settings.sampler == "gp":
        return optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False)
    return optuna.samplers.TPESampler(seed=seed)


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


def method_raw_config(spec: BenchmarkSpec, method_name: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """The raw config mapping of one method: the benchmark's ``base``, the method's overrides, then
    the command-line ``overrides`` (validated; errors name the method)."""
    method = next((m for m in spec.methods if m.name == method_name), None)
    if method is None:
        raise UserInputError(f"unknown method {method_name!r}")
    raw = apply_assignment(copy.deepcopy(spec.base), method.overrides)
    raw = config_module.apply_overrides(raw, list(overrides or []))
    try:
        config_module.from_dict(copy.deepcopy(raw))
    except UserInputError as error:
        raise UserInputError(f"method {method_name!r}: {error}") from None
    return raw


def search_methods(
    spec: BenchmarkSpec,
    output_dir: Path,
    settings: SearchSettings,
    overrides: list[str] | None = None,
    *,
    progress: bool = False,
    reporter: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, SearchResult]:
    """``run_search`` for every method of ``spec``, after checking every method's config and search
    space (and that all methods train for the same number of epochs) before anything trains.

    Writes ``OUTPUT_DIR/search.json``: the settings and, per method, the best value and parameters
    (the input of ``protocol.reproductions``), trial counts and the fold layout hash."""
    settings.check()
    prepared = {}
    for method in spec.methods:
        raw = method_raw_config(spec, method.name, overrides)
        space = parse_search_space(method.search, raw, method=method.name)
        prepared[method.name] = (raw, space)
    if settings.epochs is None:
        epochs = {name: config_module.from_dict(copy.deepcopy(raw)).training.epochs for name, (raw, _) in prepared.items()}
        if len(set(epochs.values())) > 1:
            raise UserInputError(f"methods train for different numbers of epochs {epochs}: set the search epochs")
    results = {
        name: run_search(name, raw, space, output_dir, settings, progress=progress, reporter=reporter)
        for name, (raw, space) in prepared.items()
    }
    records.write_json(Path(output_dir) / SUMMARY_FILE, {
        "settings": asdict(settings),
        "methods": {
            name: {"best_value": result.best_value, "best_params": result.best_params, "completed": result.completed,
                   "failed": result.failed, "pruned": result.pruned, "fold_layout_hash": result.fold_layout_hash, "storage": result.storage}
            for name, result in results.items()
        },
    })
    return results


def best_params(results: Mapping[str, SearchResult]) -> dict[str, dict[str, Any]]:
    """Every method's best parameters, the input of ``reproductions.reproduce_methods``.

    A method without a completed trial is a ``UserInputError``: it is never reproduced with defaults.
    """
    chosen = {}
    for method, result in results.items():
        if result.best_params is None:
            raise UserInputError(f"method {method!r}: no search trial completed ({result.failed} failed); nothing to reproduce")
        chosen[method] = dict(result.best_params)
    return chosen


def run_search(
    method: str,
    raw_config: Mapping[str, Any],
    space: SearchSpace,
    output_dir: Path,
    settings: SearchSettings,
    *,
    progress: bool = False,
    reporter: Callable[[dict[str, Any]], None] | None = None,
) -> SearchResult:
    """Run (or continue) the study of one method until ``settings.trials`` trials have finished.

    ``raw_config`` is the method's raw config mapping (``method_raw_config``); ``space`` its parsed
    search space. Interrupting (Ctrl-C, a killed process) leaves the study resumable.
    """
    settings.check()
    taken = sorted(set(space.keys()) & set(PROTOCOL_KEYS))
    if taken:
        raise UserInputError(f"method {method!r}: search key {taken[0]!r} is set by the protocol, not searched")
    output_dir = Path(output_dir)
    base = apply_budget(raw_config, settings.epochs, settings.patience)
    try:
        base_config = config_module.from_dict(copy.deepcopy(base))
    except UserInputError as error:
        raise UserInputError(f"method {method!r}: {error}") from None
    layout = fold_layout(load_dataset(base_config), k=settings.folds, mode=settings.fold_mode)
    output_dir.mkdir(parents=True, exist_ok=True)
    url = storage_url(output_dir, settings.storage)
    study = optuna.create_study(
        storage=url, study_name=method, direction="maximize", sampler=make_sampler(settings),
        pruner=make_pruner(settings), load_if_exists=True,
    )
    _check_or_record_settings(study, method, settings, layout, base_config)
    _requeue_interrupted(study)
    while (index := budgeted_trials(study)) < settings.trials:
        study.sampler = make_sampler(settings, trial_seed(settings.seed, index))
        trial = study.ask()
        try:
            value, attributes = _cross_validate(trial, method, base, space, layout, output_dir, progress, reporter, index)
        except RunInterrupted:
            raise  # Ctrl-C: the trial stays RUNNING and is re-run on resume
        except optuna.TrialPruned as pruned:
            trial.set_user_attr("pruned", str(pruned))
            study.tell(trial, state=TrialState.PRUNED)
            if progress:
                print(f"== {method} trial {trial.number}: pruned ({pruned})", flush=True)
            continue
        except Exception as error:  # any failure of a trial is a FAILED trial; Ctrl-C / exit propagate
            trial.set_user_attr("fail_reason", f"{type(error).__name__}: {error}".strip())
            study.tell(trial, state=TrialState.FAIL)
            if progress:
                print(f"== {method} trial {trial.number}: failed ({type(error).__name__}: {error})", flush=True)
            continue
        for key, attribute in attributes.items():
            trial.set_user_attr(key, attribute)
        study.tell(trial, value)
        if progress:
            print(f"== {method} trial {trial.number}: {value:.4f} {trial.params}", flush=True)
    return _result(study, method, url, layout)


def apply_budget(raw_config: Mapping[str, Any], epochs: int | None, patience: int | None) -> dict[str, Any]:
    """The method's raw config with the protocol's shared budget (epochs, early stopping) applied;
    the same for the search and the reproductions."""
    fixed: dict[str, Any] = {}
    if epochs is not None:
        fixed["training.epochs"] = epochs
    if patience is not None:
        fixed["training.early_stopping_patience"] = patience
    return apply_assignment(dict(raw_config), fixed)


def check_budget(
    stage: str, *, counts: Mapping[str, Any], epochs: Any, patience: Any, seed: Any, fold_mode: Any
) -> None:
    """The settings the search and the reproductions share: positive counts, optional positive
    epochs and patience, a non-negative seed, a known fold mode (one-line ``UserInputError``)."""
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserInputError(f"{stage} {name} must be a positive integer, got {value!r}")
    for name, value in (("epochs", epochs), ("patience", patience)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UserInputError(f"{stage} {name} must be a positive integer or unset, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UserInputError(f"{stage} seed must be a non-negative integer, got {seed!r}")
    if fold_mode not in FOLD_MODES:
        raise UserInputError(f"fold mode must be one of {', '.join(FOLD_MODES)}, got {fold_mode!r}")


def _cross_validate(
    trial: optuna.trial.Trial,
    method: str,
    base: dict[str, Any],
    space: SearchSpace,
    layout: FoldLayout,
    output_dir: Path,
    progress: bool,
    reporter: Callable[[dict[str, Any]], None] | None = None,
    index: int = 0,
) -> tuple[float, dict[str, Any]]:
    """Train one run per fold with the trial's assignment; the fold-mean best validation score."""
    assignment = space.suggest(trial)
    raw = apply_assignment(base, assignment)
    scores, run_dirs, epochs_run = [], [], []
    for fold in layout.folds:
        fold_raw = apply_assignment(raw, {
            "data.train_classes": list(fold.train_classes), "data.val_classes": list(fold.val_classes),
        })
        config = config_module.from_dict(fold_raw)
        run_dir = output_dir / method / f"trial_{trial.number:04d}" / f"fold_{fold.index}"
        record = {"method": method, "stage": STAGE, "trial": trial.number, "fold": fold.index,
                  "fold_layout_hash": layout.hash}
        if reporter is not None:
            reporter({"method": method, "stage": STAGE, "trial": index, "fold": fold.index, "run_dir": str(run_dir)})
        result = train(config, run_dir, progress=progress, record=record)
        key = config.evaluation.selection_metric
        score = None if result.best_validation is None else result.best_validation.get(key)
        if score is None or not math.isfinite(score):
            raise TrialFailed(f"fold {fold.index}: no finite validation {key} (best checkpoint: {result.best_epoch})")
        scores.append(float(score))
        run_dirs.append(str(run_dir))
        epochs_run.append(result.epochs_run)
        if len(scores) < len(layout.folds):
            trial.report(sum(scores) / len(scores), step=len(scores) - 1)
            if trial.should_prune():
                raise optuna.TrialPruned(f"fold-mean {sum(scores) / len(scores):.4f} after {len(scores)} fold(s)")
    value = sum(scores) / len(scores)
    return value, {"fold_values": scores, "run_dirs": run_dirs, "epochs_run": epochs_run}


def _check_or_record_settings(
    study: optuna.Study, method: str, settings: SearchSettings, layout: FoldLayout, config: config_module.Config
) -> None:
    """Record the shared budget and fold layout on a new study; refuse to resume one made differently."""
    recorded = {
        "settings": settings.recorded(),
        "epochs": config.training.epochs,
        "early_stopping_patience": config.training.early_stopping_patience,
        "selection_metric": config.evaluation.selection_metric,
        "fold_layout_hash": layout.hash,
    }
    stored = study.user_attrs
    if not stored:
        for key, value in recorded.items():
            study.set_user_attr(key, value)
        study.set_user_attr("fold_layout", layout.as_dict())
        return
    for key, value in recorded.items():
        if stored.get(key) != value:
            raise UserInputError(
                f"study {method!r} was started with {key} = {stored.get(key)!r}, now {value!r}: "
                "use a new output directory or storage"
            )


def _requeue_interrupted(study: optuna.Study) -> None:
    """Mark trials a killed process left RUNNING as FAILED (``interrupted``) and enqueue their
    parameters once, so they are run again with the same values; nothing is enqueued twice."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        optuna.trial.Trial(study, trial._trial_id).set_user_attr("interrupted", True)
        optuna.trial.Trial(study, trial._trial_id).set_user_attr("fail_reason", "interrupted: the process stopped")
        study.tell(trial.number, state=TrialState.FAIL)
    trials = study.get_trials(deepcopy=False)
    retried = {trial.user_attrs.get("retry_of") for trial in trials}
    for trial in trials:
        if trial.state == TrialState.FAIL and trial.user_attrs.get("interrupted") and trial.number not in retried:
            study.enqueue_trial(dict(trial.params), user_attrs={"retry_of": trial.number})


def budgeted_trials(study: optuna.Study) -> int:
    """Trials that used the budget: complete, pruned and genuinely failed ones (interrupted ones are re-run)."""
    return sum(
        1 for trial in study.get_trials(deepcopy=False)
        if trial.state in (TrialState.COMPLETE, TrialState.PRUNED)
        or (trial.state == TrialState.FAIL and not trial.user_attrs.get("interrupted"))
    )


def _result(study: optuna.Study, method: str, url: str, layout: FoldLayout) -> SearchResult:
    trials = study.get_trials(deepcopy=False)
    complete = [trial for trial in trials if trial.state == TrialState.COMPLETE]
    best = max(complete, key=lambda trial: (trial.value, -trial.number)) if complete else None
    return SearchResult(
        method=method,
        storage=url,
        completed=len(complete),
        failed=sum(1 for trial in trials if trial.state == TrialState.FAIL and not trial.user_attrs.get("interrupted")),
        pruned=sum(1 for trial in trials if trial.state == TrialState.PRUNED),
        best_value=None if best is None else float(best.value),  # type: ignore[arg-type]
        best_params=None if best is None else dict(best.params),
        fold_layout_hash=layout.hash,
        trials=[
            {"number": trial.number, "state": trial.state.name, "value": trial.value, "params": dict(trial.params),
             "user_attrs": dict(trial.user_attrs)}
            for trial in trials
        ],
    )
