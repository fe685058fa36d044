"""Hyper-parameter search: one Optuna study per method, each trial a class-disjoint k-fold cross-validation.

Musgrave et al. 2020 (seed 001) §3.3: "we run 50 iterations of bayesian optimization. Each iteration
consists of 4-fold cross validation [...] Training stops when validation accuracy plateaus.
Hyperparameters are optimized to maximize the average validation accuracy." Here:

* one study per method (``study_name`` = method name) in an Optuna storage (``protocol.storage``: by
  default SQLite ``OUTPUT_DIR/study.db``); sampler ``gp`` (``optuna.samplers.GPSampler``, Bayesian
  optimisation with a Gaussian process, the default) or ``tpe``, seeded per slot (``trial_seed``) and
  shown only the done trials of the earlier slots (``MethodSearch._propose``);
* a trial suggests an assignment of the method's search space (``protocol.search_space``) and trains
  one run per fold of ``protocol.folds.fold_layout`` with ``data.train_classes`` / ``data.val_classes``
  set to the fold's classes (the training loop never holds a test image) and early stopping with
  ``patience`` evaluations without improvement; its value is the mean over folds of the validation
  selection metric (MAP@R) of each run's best checkpoint;
* a trial that raises (e.g. a diverged loss) or yields a non-finite score is told to Optuna as FAILED
  with its reason in the user attribute ``fail_reason``: it never gets a value;
* every method gets the same number of trials and epochs; both are recorded in the study's user
  attributes (``settings``), with the fold layout and its hash;
* many workers, one study: trials are units of work (``protocol.work``): the budget counts slots, a
  worker takes the next slot under a lock, a trial of a stopped or killed worker is failed
  (``interrupted``, or by Optuna's heartbeat) and its slot re-enqueued once with the same parameters;
  resuming is the same thing as joining late. With ``protocol.parallel_trials: 1`` (the default)
  slot ``k`` waits for every earlier slot, so the search is what one worker would do, whoever runs it.

With ``protocol.frozen_trunk`` a fold run trains only the head on the fold's cached trunk features
(``protocol.feature_cache``; the trunks in ``OUTPUT_DIR/trunks``, the features in ``OUTPUT_DIR/features``).

Every run directory is ``OUTPUT_DIR/METHOD/trial_SSSS/fold_I`` (``SSSS``: the slot) and its ``run.json`` records ``method``,
``stage`` (``search``), ``trial``, ``fold``, ``fold_layout_hash``, ``train_classes`` and ``val_classes``.
"""

from __future__ import annotations

import copy
import hashlib
import math
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from dmlbench import config as config_module
from dmlbench.errors import RunInterrupted, UserInputError
from dmlbench.files import storage_error
from dmlbench.protocol.benchmark import BenchmarkSpec
from dmlbench.protocol import work
from dmlbench.protocol.folds import DEFAULT_K, FOLD_MODES, FoldLayout, fold_layout
from dmlbench.protocol.feature_cache import FeatureCache
from dmlbench.protocol.storage import redact
from dmlbench.protocol.search_space import SearchSpace, apply_assignment, parse_search_space
from dmlbench.training import records, train
from dmlbench.training.features import train_head
from dmlbench.training.setup import load_dataset

STUDY_FILE = "study.db"
SUMMARY_FILE = "search.json"
SAMPLERS = ("gp", "tpe")
PRUNERS = ("none", "median")
STAGE = "search"
# How often a worker whose remaining work is running elsewhere looks again (seconds).
POLL_SECONDS = 1.0
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
    startup_trials: int | None = None
    parallel_trials: int = 1
    frozen_trunk: bool = False

    def check(self) -> None:
        """One-line ``UserInputError`` for a setting out of range."""
        check_budget("search", counts={"trials": self.trials, "folds": self.folds, "parallel_trials": self.parallel_trials}, epochs=self.epochs,
                     patience=self.patience, seed=self.seed, fold_mode=self.fold_mode)
        if self.sampler not in SAMPLERS:
            raise UserInputError(f"search sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        if self.pruner not in PRUNERS:
            raise UserInputError(f"search pruner must be one of {', '.join(PRUNERS)}, got {self.pruner!r}")
        if not isinstance(self.frozen_trunk, bool):
            raise UserInputError(f"protocol.frozen_trunk must be true or false, got {self.frozen_trunk!r}")

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
    startup = {} if settings.startup_trials is None else {"n_startup_trials": settings.startup_trials}
    if settings.sampler == "gp":
        return optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False, **startup)
    return optuna.samplers.TPESampler(seed=seed, **startup)


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
    worker: work.Worker | None = None,
    config_hash: str | None = None,
) -> dict[str, SearchResult]:
    """``run_search`` for every method of ``spec`` (a worker takes units of any method), after checking every method's config and search
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
    trunk_raw = apply_budget(next(iter(prepared.values()))[0], settings.epochs, settings.patience)
    if settings.frozen_trunk:
        _check_one_trunk({name: raw for name, (raw, _) in prepared.items()})
    searches = [MethodSearch(name, raw, space, output_dir, settings, progress=progress, reporter=reporter, worker=worker,
                             config_hash=config_hash, trunk_raw=trunk_raw)
                for name, (raw, space) in prepared.items()]
    run_units([search.step for search in searches])
    results = {search.method: search.result() for search in searches}
    records.write_json(Path(output_dir) / SUMMARY_FILE, {
        "settings": {**asdict(settings), "storage": None if settings.storage is None else redact(settings.storage)},
        "methods": {
            name: {"best_value": result.best_value, "best_params": result.best_params, "completed": result.completed,
                   "failed": result.failed, "pruned": result.pruned, "fold_layout_hash": result.fold_layout_hash, "storage": result.storage}
            for name, result in results.items()
        },
    })
    return results


def _check_one_trunk(raws: Mapping[str, Mapping[str, Any]]) -> None:
    """With a frozen trunk every method trains its head on the same trunk: their trunk settings must agree."""
    def trunk_of(raw: Mapping[str, Any]) -> tuple[Any, ...]:
        model = config_module.from_dict(copy.deepcopy(dict(raw))).model
        return model.trunk, model.options, model.pretrained, model.pooling, model.freeze_bn
    (first, first_raw), *others = raws.items()
    for name, raw in others:
        if trunk_of(raw) != trunk_of(first_raw):
            raise UserInputError(f"protocol.frozen_trunk: method {name!r} uses another trunk than {first!r} "
                                 "(model.trunk, options, pretrained, pooling and freeze_bn must agree)")


def run_units(steps: list[Callable[[], str]]) -> None:
    """Call the first step that has work until every one is ``work.DONE``; while the only work left
    runs in other workers, look again every ``POLL_SECONDS`` (a stale one may come back to us)."""
    while True:
        states = []
        for step in steps:
            state = step()
            states.append(state)
            if state not in (work.WAIT, work.DONE):
                break
        else:
            if all(state == work.DONE for state in states):
                return
            time.sleep(POLL_SECONDS)


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
    worker: work.Worker | None = None,
) -> SearchResult:
    """Run (or continue, or help other workers with) the study of one method until its
    ``settings.trials`` slots are done.

    ``raw_config`` is the method's raw config mapping (``method_raw_config``); ``space`` its parsed
    search space. Interrupting (Ctrl-C, a killed process) leaves the study resumable.
    """
    search = MethodSearch(method, raw_config, space, output_dir, settings, progress=progress, reporter=reporter,
                          worker=worker)
    while (state := search.step()) != work.DONE:
        if state == work.WAIT:
            time.sleep(POLL_SECONDS)
    return search.result()


class MethodSearch:
    """One method's study as units of work: ``step()`` runs one trial this worker took, or says
    ``work.WAIT`` (the rest is running elsewhere) or ``work.DONE``."""

    def __init__(
        self,
        method: str,
        raw_config: Mapping[str, Any],
        space: SearchSpace,
        output_dir: Path,
        settings: SearchSettings,
        *,
        progress: bool = False,
        reporter: Callable[[dict[str, Any]], None] | None = None,
        worker: work.Worker | None = None,
        config_hash: str | None = None,
        trunk_raw: Mapping[str, Any] | None = None,
    ) -> None:
        settings.check()
        taken = sorted(set(space.keys()) & set(PROTOCOL_KEYS))
        if taken:
            raise UserInputError(f"method {method!r}: search key {taken[0]!r} is set by the protocol, not searched")
        self.method, self.space, self.settings = method, space, settings
        self.output_dir = Path(output_dir)
        self.progress, self.reporter = progress, reporter
        self.base = apply_budget(raw_config, settings.epochs, settings.patience)
        try:
            self.config = config_module.from_dict(copy.deepcopy(self.base))
        except UserInputError as error:
            raise UserInputError(f"method {method!r}: {error}") from None
        dataset = load_dataset(self.config)
        self.layout = fold_layout(dataset, k=settings.folds, mode=settings.fold_mode)
        # The search's trunks (one per fold, shared by every method): the first method's config by default.
        self.features = (FeatureCache(trunk_raw if trunk_raw is not None else self.base, self.output_dir, dataset.content_hash,
                                      progress) if settings.frozen_trunk else None)
        if self.features is not None and self.config.model.ensemble != 1:
            raise UserInputError(f"method {method!r}: protocol.frozen_trunk needs a single trunk (model.ensemble=1)")
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.url = storage_url(self.output_dir, settings.storage)
        self.worker = worker or work.Worker(self.url)
        with self.worker.lock.held():
            # Every suggestion is made in a separate seeded study (``propose``): this one's sampler
            # never samples, it only hands out the enqueued parameters.
            self.study = optuna.create_study(
                storage=self.worker.storage, study_name=method, direction="maximize",
                sampler=optuna.samplers.RandomSampler(seed=0), pruner=make_pruner(settings), load_if_exists=True,
            )
            _check_or_record_settings(self.study, method, settings, self.layout, self.config, config_hash)
            if self.study.user_attrs.get("trials") != settings.trials:
                self.study.set_user_attr("trials", settings.trials)  # the budget ``dmlbench status`` counts against

    def step(self) -> str:
        outcome = work.claim(self.study, self.worker, budget=self.settings.trials, ready=self._ready, propose=self._propose)
        if isinstance(outcome, str):
            return outcome
        trial, slot = outcome.trial, outcome.slot
        started = work.Cost.start()
        samples: list[int] = []
        with work.Beating(self.study, trial, self.worker):
            try:
                value, attributes = _cross_validate(trial, self.method, self.base, self.space, self.layout, self.output_dir,
                                                    self.progress, self.reporter, slot, samples, self.features)
            except (RunInterrupted, KeyboardInterrupt):
                work.interrupt(self.study, trial)
                raise
            except optuna.TrialPruned as pruned:
                work.finish(self.study, trial, state=TrialState.PRUNED, attributes={
                    "pruned": str(pruned), "cost": asdict(work.Cost.since(started, sum(samples)))})
                if self.progress:
                    print(f"== {self.method} trial {slot}: pruned ({pruned})", flush=True)
                return "worked"
            except Exception as error:  # any failure of a trial is a FAILED trial; Ctrl-C / exit propagate
                if storage_error(error) is not None:  # the disk failed, not the method: re-run next time
                    work.interrupt(self.study, trial)
                    raise
                work.finish(self.study, trial, state=TrialState.FAIL, attributes={
                    "fail_reason": f"{type(error).__name__}: {error}".strip(),
                    "cost": asdict(work.Cost.since(started, sum(samples)))})
                if self.progress:
                    print(f"== {self.method} trial {slot}: failed ({type(error).__name__}: {error})", flush=True)
                return "worked"
            attributes["cost"] = asdict(work.Cost.since(started, sum(samples)))
            work.finish(self.study, trial, value=value, attributes=attributes)
        if self.progress:
            print(f"== {self.method} trial {slot}: {value:.4f} {trial.params}", flush=True)
        return "worked"

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
        assignment = self.space.suggest(suggestion)
        return dict(suggestion.params), {"params": assignment}

    def result(self) -> SearchResult:
        return _result(self.study, self.method, self.url, self.layout)


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
    slot: int = 0,
    samples: list[int] | None = None,
    features: FeatureCache | None = None,
) -> tuple[float, dict[str, Any]]:
    """Train one run per fold with the trial's assignment; the fold-mean best validation score.

    The run directories are the slot's (``trial_SSSS``): a retried slot continues the fold runs its
    killed attempt left (completed ones are kept, a partial one resumes from its checkpoint)."""
    assignment = space.suggest(trial)
    raw = apply_assignment(base, assignment)
    scores, run_dirs, epochs_run, curves = [], [], [], []
    for fold in layout.folds:
        fold_raw = apply_assignment(raw, {
            "data.train_classes": list(fold.train_classes), "data.val_classes": list(fold.val_classes),
        })
        config = config_module.from_dict(fold_raw)
        run_dir = output_dir / method / f"trial_{slot:04d}" / f"fold_{fold.index}"
        record = {"method": method, "stage": STAGE, "trial": slot, "fold": fold.index,
                  "fold_layout_hash": layout.hash}
        if reporter is not None:
            reporter({"method": method, "stage": STAGE, "trial": slot, "fold": fold.index, "run_dir": str(run_dir)})
        if features is None:
            result = train_fold(config, run_dir, progress, record)
        else:
            result = train_head(config, run_dir, features.features(fold), record)
        if samples is not None:
            samples.append(run_samples(run_dir))
        curves.append(validation_curves(run_dir))
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
    return value, {"fold_values": scores, "run_dirs": run_dirs, "epochs_run": epochs_run, "curves": curves}


def train_fold(config: config_module.Config, run_dir: Path, progress: bool, record: dict[str, Any]) -> Any:
    """Train a fold run, or continue the one an interrupted attempt left, or return a completed one."""
    if (run_dir / records.RUN_FILE).is_file():
        return train(config, run_dir, resume=True, progress=progress, record=record)
    if run_dir.exists():
        shutil.rmtree(run_dir)  # killed before its first record: nothing worth keeping
    return train(config, run_dir, progress=progress, record=record)


def run_samples(run_dir: Path) -> int:
    """Training samples a run has seen (0 for a run that recorded none)."""
    path = run_dir / records.RUN_FILE
    return int(records.read_json(path).get("samples_seen", 0)) if path.is_file() else 0


def validation_curves(run_dir: Path) -> dict[str, list[float]]:
    """The run's validation curve of each metric (epoch 0 = untrained), stored with its trial so the
    report needs no run directory (workers on other machines have their own)."""
    curves: dict[str, list[float]] = {}
    for entry in records.read_metrics(run_dir):
        for metric, value in (entry.get("validation") or {}).items():
            curves.setdefault(metric, []).append(float(value))
    return curves


def _check_or_record_settings(
    study: optuna.Study, method: str, settings: SearchSettings, layout: FoldLayout, config: config_module.Config,
    config_hash: str | None = None,
) -> None:
    """Record the shared budget and fold layout on a new study; refuse to resume one made differently."""
    recorded = {
        "settings": settings.recorded(),
        "epochs": config.training.epochs,
        "early_stopping_patience": config.training.early_stopping_patience,
        "selection_metric": config.evaluation.selection_metric,
        "fold_layout_hash": layout.hash,
    }
    if config_hash is not None:
        recorded["config_hash"] = config_hash
    stored = study.user_attrs
    if not any(key in stored for key in recorded):
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


def budgeted_trials(study: optuna.Study) -> int:
    """Slots that used the budget: complete, pruned and genuinely failed trials (interrupted ones are re-run)."""
    return len(work.counted(study))


def _result(study: optuna.Study, method: str, url: str, layout: FoldLayout) -> SearchResult:
    trials = study.get_trials(deepcopy=False)
    budgeted = work.counted(study)
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
        fold_layout_hash=layout.hash,
        trials=[
            {"number": trial.number, "state": trial.state.name, "value": trial.value, "params": dict(trial.params),
             "user_attrs": dict(trial.user_attrs)}
            for trial in trials
        ],
    )


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The counted COMPLETE trial with the highest value; ties go to the earliest slot, so every
    worker (and any order of finishing) picks the same one."""
    complete = [trial for trial in work.counted(study) if trial.state == TrialState.COMPLETE]
    return max(complete, key=lambda trial: (trial.value, -(work.slot_of(trial) or 0))) if complete else None
