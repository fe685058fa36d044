"""Reproductions with the best hyper-parameters, scored once on the test classes (Musgrave et al. 2020 §3.3).

Seed 001 §3.3: "For the best hyperparameters, the highest-accuracy checkpoint for each training set
partition is loaded, and its embeddings for the test set are computed and L2 normalized. Then we
compute accuracy using two methods: Concatenated [...] Separated [...]. We do 10 training runs using
the best hyperparameters, and report the average across these runs, as well as confidence intervals."

Here reproduction ``r`` of every method uses seed ``first_seed + r`` (so reproductions pair across
methods by seed, ``protocol.statistics.compare_methods``) and trains one run per fold of the same
class-disjoint layout as the search. Once all its folds are trained, the fold models' best checkpoints
embed the standard test split and ``evaluation.evaluate_many`` scores them ``concatenated`` and
``separated``; the scores are stored in ``METHOD/reproduction_RR/test_metrics.json`` and read from there
afterwards, so the test classes are embedded once per reproduction. ``results.csv`` holds, per method,
mode and metric, the mean and 95% Student-t interval over the reproductions
(``method,mode,metric,mean,ci_low,ci_high,n``); ``runs.csv`` each reproduction's value
(``method,reproduction,mode,metric,value``). A reproduction whose training fails has no score; it is
reported in ``ReproductionOutcome.reason`` and left out of ``n``.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from dmlbench import config as config_module
from dmlbench.errors import RunInterrupted, UserInputError
from dmlbench.files import storage_error
from dmlbench.evaluation import COUNT_KEYS, embedding_space, evaluate_many
from dmlbench.protocol.benchmark import BenchmarkSpec
from dmlbench.protocol.folds import DEFAULT_K, fold_layout
from dmlbench.protocol import work
from dmlbench.protocol.search import (
    apply_budget,
    check_budget,
    method_raw_config,
    run_samples,
    run_units,
    storage_url,
    validation_curves,
)
from dmlbench.protocol.storage import redact
from dmlbench.protocol.search_space import apply_assignment
from dmlbench.protocol.statistics import PairedComparison, compare_methods, mean_interval
from dmlbench.training import records, train
from dmlbench.training.runs import embed_run, embed_test_split, query_mask, test_query_mask
from dmlbench.training.setup import load_dataset

STAGE = "reproduction"
SUMMARY_FILE = "reproductions.json"
MODES = ("concatenated", "separated")
TEST_ACCESS_FILE = "test_access.jsonl"
UNTRAINED = "untrained"
RESULTS_COLUMNS = ("method", "mode", "metric", "mean", "ci_low", "ci_high", "n")
RUNS_COLUMNS = ("method", "reproduction", "mode", "metric", "value")


@dataclass(frozen=True)
class ReproductionSettings:
    """How many reproductions, their seeds and the shared training budget (as in the search)."""

    reproductions: int = 10
    first_seed: int = 0
    folds: int = DEFAULT_K
    fold_mode: str = "contiguous"
    epochs: int | None = None
    patience: int | None = None
    storage: str | None = None

    def check(self) -> None:
        check_budget("reproduction", counts={"reproductions": self.reproductions, "folds": self.folds},
                     epochs=self.epochs, patience=self.patience, seed=self.first_seed, fold_mode=self.fold_mode)


@dataclass
class ReproductionOutcome:
    """One reproduction of one method: its seed, fold runs and test scores (``None`` if it failed)."""

    reproduction: int
    seed: int
    run_dirs: list[str]
    scores: dict[str, dict[str, float]] | None = None  # mode -> metric -> value
    reason: str | None = None
    # Per fold model: rho, pi_intra, pi_inter, pi_ratio on its training classes (``training_space``).
    embedding_space: list[dict[str, float]] = field(default_factory=list)


@dataclass
class MethodReproductions:
    method: str
    params: dict[str, Any]
    fold_layout_hash: str
    outcomes: list[ReproductionOutcome] = field(default_factory=list)


def reproduce_method(
    method: str,
    raw_config: Mapping[str, Any],
    params: Mapping[str, Any],
    output_dir: Path,
    settings: ReproductionSettings,
    *,
    progress: bool = False,
    reporter: Callable[[dict[str, Any]], None] | None = None,
    worker: work.Worker | None = None,
) -> MethodReproductions:
    """Train (or finish, or help other workers finish) every reproduction of one method with
    ``params`` and score it on the test classes.

    ``raw_config``: the method's raw config mapping (``search.method_raw_config``); ``params``: the
    best trial's ``{dotted key: value}`` assignment. Finished runs are kept; an interrupted run resumes
    from its last checkpoint.
    """
    units = MethodReproduction(method, raw_config, params, output_dir, settings, progress=progress, reporter=reporter,
                               worker=worker)
    run_units([units.step])
    return units.result()


def study_name(method: str) -> str:
    """The study of a method's reproductions (``untrained``: the baseline's)."""
    return f"reproductions:{method}"


class MethodReproduction:
    """One method's reproductions as units of work (slot ``r``: reproduction ``r``, seed
    ``first_seed + r``, all folds, then its test scores), shared by any number of workers."""

    def __init__(
        self,
        method: str,
        raw_config: Mapping[str, Any],
        params: Mapping[str, Any],
        output_dir: Path,
        settings: ReproductionSettings,
        *,
        progress: bool = False,
        reporter: Callable[[dict[str, Any]], None] | None = None,
        worker: work.Worker | None = None,
        config_hash: str | None = None,
    ) -> None:
        settings.check()
        self.method, self.params, self.settings = method, dict(params), settings
        self.output_dir = Path(output_dir)
        self.progress, self.reporter = progress, reporter
        self.base = apply_budget(apply_assignment(dict(raw_config), params), settings.epochs, settings.patience)
        try:
            self.config = config_module.from_dict(copy.deepcopy(self.base))
        except UserInputError as error:
            raise UserInputError(f"method {method!r}: {error}") from None
        self.layout = fold_layout(load_dataset(self.config), k=settings.folds, mode=settings.fold_mode)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.worker = worker or work.Worker(storage_url(self.output_dir, settings.storage))
        self.study = open_unit_study(self.worker, study_name(method), {
            "method": method, "params": self.params, "reproductions": settings.reproductions,
            "first_seed": settings.first_seed, "fold_layout_hash": self.layout.hash, "config_hash": config_hash,
        })

    def step(self) -> str:
        outcome = _claim_reproduction(self.study, self.worker, self.settings)
        if isinstance(outcome, str):
            return outcome
        trial, reproduction = outcome.trial, outcome.slot
        seed = self.settings.first_seed + reproduction
        directory = self.output_dir / self.method / f"reproduction_{reproduction:02d}"
        run_dirs = [directory / f"fold_{fold.index}" for fold in self.layout.folds]
        started = work.Cost.start()
        attributes: dict[str, Any] = {"seed": seed, "params": self.params,
                                      "run_dirs": [str(run_dir.relative_to(self.output_dir)) for run_dir in run_dirs]}
        with work.Beating(self.study, trial, self.worker):
            try:
                curves = []
                for fold, run_dir in zip(self.layout.folds, run_dirs):
                    if self.reporter is not None:
                        self.reporter({"method": self.method, "stage": STAGE, "reproduction": reproduction,
                                       "fold": fold.index, "run_dir": str(run_dir)})
                    config = config_module.from_dict(apply_assignment(self.base, {
                        "seed": seed,
                        "data.train_classes": list(fold.train_classes),
                        "data.val_classes": list(fold.val_classes),
                    }))
                    _train_once(config, run_dir, self.progress, {
                        "method": self.method, "stage": STAGE, "reproduction": reproduction, "fold": fold.index,
                        "fold_layout_hash": self.layout.hash, "params": dict(self.params),
                        "test_classes": list(self.layout.test_classes),
                    })
                    curves.append(validation_curves(run_dir))
                attributes["curves"] = curves
                attributes["embedding_space"] = [training_space(run_dir) for run_dir in run_dirs]
                scores = _test_scores(directory, run_dirs, seed, self.config.evaluation.metrics)
            except (RunInterrupted, KeyboardInterrupt):
                work.interrupt(self.study, trial)
                raise
            except Exception as error:  # one failed reproduction must not lose the others
                if storage_error(error) is not None:  # the disk failed, not the method: re-run next time
                    work.interrupt(self.study, trial)
                    raise
                reason = f"{type(error).__name__}: {error}".strip()
                attributes.update(fail_reason=reason, cost=self._cost(started, run_dirs))
                work.finish(self.study, trial, state=TrialState.FAIL, attributes=attributes)
                if self.progress:
                    print(f"== {self.method} reproduction {reproduction}: failed ({reason})", flush=True)
                return "worked"
            attributes.update(scores=scores, cost=self._cost(started, run_dirs))
            work.finish(self.study, trial, value=_objective(scores), attributes=attributes)
        return "worked"

    @staticmethod
    def _cost(started: tuple[float, float], run_dirs: list[Path]) -> dict[str, Any]:
        return asdict(work.Cost.since(started, sum(run_samples(run_dir) for run_dir in run_dirs)))

    def result(self) -> MethodReproductions:
        return read_reproductions(self.study, self.method, self.params, self.layout.hash, self.output_dir)


class UntrainedBaseline:
    """The ``untrained`` row as units of work: reproduction ``r`` of the reference method (the first
    method of the benchmark with best parameters) with its models as initialised (same seeds, no
    training step), scored on the test classes like every method. Needs no run directory."""

    def __init__(self, reference: str, raw_config: Mapping[str, Any], params: Mapping[str, Any], output_dir: Path,
                 settings: ReproductionSettings, *, worker: work.Worker, config_hash: str | None = None) -> None:
        self.reference, self.settings, self.worker = reference, settings, worker
        self.output_dir = Path(output_dir)
        self.base = apply_budget(apply_assignment(dict(raw_config), params), settings.epochs, settings.patience)
        self.config = config_module.from_dict(copy.deepcopy(self.base))
        self.layout = fold_layout(load_dataset(self.config), k=settings.folds, mode=settings.fold_mode)
        self.study = open_unit_study(worker, study_name(UNTRAINED), {
            "method": UNTRAINED, "reference": reference, "params": dict(params), "reproductions": settings.reproductions,
            "first_seed": settings.first_seed, "fold_layout_hash": self.layout.hash, "config_hash": config_hash,
        })

    def step(self) -> str:
        outcome = _claim_reproduction(self.study, self.worker, self.settings)
        if isinstance(outcome, str):
            return outcome
        trial, reproduction = outcome.trial, outcome.slot
        seed = self.settings.first_seed + reproduction
        started = work.Cost.start()
        with work.Beating(self.study, trial, self.worker):
            try:
                scores = _untrained_scores(self, reproduction, seed)
            except (RunInterrupted, KeyboardInterrupt):
                work.interrupt(self.study, trial)
                raise
            except Exception as error:
                if storage_error(error) is not None:  # the disk failed, not the method: re-run next time
                    work.interrupt(self.study, trial)
                    raise
                work.finish(self.study, trial, state=TrialState.FAIL,
                            attributes={"seed": seed, "fail_reason": f"{type(error).__name__}: {error}".strip()})
                return "worked"
            work.finish(self.study, trial, value=_objective(scores), attributes={
                "seed": seed, "scores": scores, "run_dirs": [], "cost": asdict(work.Cost.since(started, 0))})
        return "worked"

    def result(self) -> MethodReproductions:
        return read_reproductions(self.study, UNTRAINED, {}, self.layout.hash, self.output_dir)


def open_unit_study(worker: work.Worker, name: str, recorded: Mapping[str, Any]) -> optuna.Study:
    """Create or load a study of fixed units; refuse one that was made for other work."""
    with worker.lock.held():
        study = optuna.create_study(storage=worker.storage, study_name=name, direction="maximize",
                                    sampler=optuna.samplers.RandomSampler(seed=0), load_if_exists=True)
        stored = study.user_attrs
        if not any(key in stored for key in recorded):
            for key, value in recorded.items():
                study.set_user_attr(key, value)
            return study
        for key, value in recorded.items():
            if stored.get(key) != value:
                raise UserInputError(f"study {name!r} was started with {key} = {stored.get(key)!r}, now {value!r}: "
                                     "use a new output directory or storage")
    return study


def read_reproductions(study: optuna.Study, method: str, params: Mapping[str, Any], layout_hash: str,
                       output_dir: Path) -> MethodReproductions:
    """A method's reproductions as stored in its study: one outcome per done slot, in order."""
    result = MethodReproductions(method, dict(params), layout_hash)
    for trial in work.counted(study):
        attrs = trial.user_attrs
        run_dirs = [str(Path(output_dir) / run_dir) for run_dir in attrs.get("run_dirs", [])]
        scores = attrs.get("scores") if trial.state == TrialState.COMPLETE else None
        result.outcomes.append(ReproductionOutcome(int(attrs["slot"]), int(attrs["seed"]), run_dirs, scores,
                                                   None if scores is not None else attrs.get("fail_reason"),
                                                   list(attrs.get("embedding_space", []))))
    return result


def _objective(scores: Mapping[str, Mapping[str, float]]) -> float:
    """The value Optuna shows for a reproduction: concatenated MAP@R (or the first metric)."""
    concatenated = scores["concatenated"]
    return float(concatenated.get("map_at_r", next(iter(concatenated.values()))))


def _untrained_scores(baseline: UntrainedBaseline, reproduction: int, seed: int) -> dict[str, dict[str, float]]:
    from dmlbench.training.embed import embed, resolve_device
    from dmlbench.training.setup import build_model, make_splits

    directory = baseline.output_dir / UNTRAINED / f"reproduction_{reproduction:02d}"
    record_test_access(baseline.output_dir, {
        "stage": STAGE, "method": UNTRAINED, "reproduction": directory.name, "model": "untrained",
        "reference": baseline.reference, "runs": [],
    })
    embeddings, labels = {}, None
    for fold in baseline.layout.folds:
        config = config_module.from_dict(apply_assignment(baseline.base, {
            "seed": seed, "data.train_classes": list(fold.train_classes), "data.val_classes": list(fold.val_classes),
        }))
        dataset = load_dataset(config)
        device = resolve_device(config.training.device)
        # The model exactly as reproduction ``r`` of the reference started training it (same seed).
        model = build_model(config).to(device)
        test = make_splits(config, dataset).test
        fold_embeddings, labels = embed(model, dataset.subset(test), config.evaluation.batch_size, device)
        embeddings[f"fold_{fold.index}"] = fold_embeddings
        mask = query_mask(dataset, test)  # queries against the gallery for a dataset with roles
    assert labels is not None
    scores = {}
    for mode in MODES:
        values = evaluate_many(
            embeddings, labels, mode=mode, metrics=baseline.config.evaluation.metrics, seed=seed, query_mask=mask
        )
        scores[mode] = {name: float(value) for name, value in values.items() if name not in COUNT_KEYS}
    directory.mkdir(parents=True, exist_ok=True)
    records.write_json(directory / records.TEST_METRICS_FILE, {"evaluated": records.now(), "scores": scores})
    return scores


def _claim_reproduction(study: optuna.Study, worker: work.Worker, settings: ReproductionSettings) -> Any:
    """Reproduction slot ``r`` (seed ``first_seed + r``) for this worker, or ``work.WAIT`` / ``work.DONE``."""
    return work.claim(study, worker, budget=settings.reproductions, ready=lambda slot, finished: True,
                      propose=lambda slot, finished: ({}, {"seed": settings.first_seed + slot}))


def record_test_access(output_dir: Path, entry: Mapping[str, Any]) -> None:
    """Append one opening of the test data to ``OUTPUT_DIR/test_access.jsonl`` (read by ``protocol.audit``)."""
    line = json.dumps({"time": records.now(), **entry}) + "\n"
    with open(Path(output_dir) / TEST_ACCESS_FILE, "a") as stream:
        stream.write(line)
        stream.flush()
        os.fsync(stream.fileno())


def _train_once(config: config_module.Config, run_dir: Path, progress: bool, record: dict[str, Any]) -> None:
    """Train ``run_dir`` unless it is already completed; continue it if it was interrupted."""
    run_file = run_dir / records.RUN_FILE
    if run_file.exists() and records.read_json(run_file).get("status") == "completed":
        return
    train(config, run_dir, resume=run_file.exists(), progress=progress, record=record)


def training_space(run_dir: Path) -> dict[str, float]:
    """rho and the pi ratios of a fold model's best checkpoint on its own training classes (Roth et
    al. 2020 §5 compute them on the embedded training data, not the test data; ``drop=1``, no centring)."""
    embeddings, labels = embed_run(run_dir, "train")
    space = embedding_space.analyze(embeddings, labels)
    return {key: float(space[key]) for key in ("rho", "pi_intra", "pi_inter", "pi_ratio")}


def _test_scores(
    directory: Path, run_dirs: list[Path], seed: int, metrics: list[str]
) -> dict[str, dict[str, float]]:
    """Concatenated and separated test metrics of the fold models, computed once and stored; every
    opening of the test data is appended to ``test_access.jsonl`` first."""
    stored_path = directory / records.TEST_METRICS_FILE
    key = {"seed": seed, "run_dirs": [run_dir.name for run_dir in run_dirs], "metrics": list(metrics)}
    if stored_path.exists():
        stored = records.read_json(stored_path)
        if stored.get("key") == key:
            return stored["scores"]
    output_dir = directory.parent.parent
    record_test_access(output_dir, {
        "stage": STAGE, "method": directory.parent.name, "reproduction": directory.name,
        "model": "best_checkpoint",
        "runs": [str(Path(run_dir).resolve().relative_to(output_dir.resolve())) for run_dir in run_dirs],
    })
    embeddings, labels = {}, None
    directory.mkdir(parents=True, exist_ok=True)
    for run_dir in run_dirs:
        fold_embeddings, fold_labels = embed_test_split(run_dir)
        if labels is not None and not bool((fold_labels == labels).all()):
            raise RuntimeError(f"{run_dir}: test labels differ between the folds of one reproduction")
        embeddings[run_dir.name], labels = fold_embeddings, fold_labels
    assert labels is not None
    mask = test_query_mask(run_dirs[0])  # queries against the gallery for a dataset with roles
    scores = {}
    for mode in MODES:
        values = evaluate_many(embeddings, labels, mode=mode, metrics=metrics, seed=seed, query_mask=mask)
        scores[mode] = {name: float(value) for name, value in values.items() if name not in COUNT_KEYS}
    records.write_json(stored_path, {"evaluated": records.now(), "key": key, "scores": scores})
    return scores


def reproduce_methods(
    spec: BenchmarkSpec,
    best_params: Mapping[str, Mapping[str, Any]],
    output_dir: Path,
    settings: ReproductionSettings,
    overrides: list[str] | None = None,
    *,
    progress: bool = False,
    reporter: Callable[[dict[str, Any]], None] | None = None,
    methods: list[str] | None = None,
    worker: work.Worker | None = None,
    config_hash: str | None = None,
) -> dict[str, MethodReproductions]:
    """``reproduce_method`` for every method of ``spec`` (``best_params[method]``, ``{}`` when nothing was
    searched; ``search.best_params`` gives them), then ``write_results`` and ``reproductions.json``
    (settings; per method its parameters, fold layout hash, seeds, run directories and failures).
    Every method's config is checked before anything trains."""
    settings.check()
    raws = {method.name: method_raw_config(spec, method.name, overrides) for method in spec.methods
            if methods is None or method.name in methods}
    for name, raw in raws.items():
        try:
            config_module.from_dict(apply_assignment(raw, dict(best_params.get(name, {}))))
        except UserInputError as error:
            raise UserInputError(f"method {name!r}: best parameters: {error}") from None
    worker = worker or work.Worker(storage_url(Path(output_dir), settings.storage))
    units = [MethodReproduction(name, raw, dict(best_params.get(name, {})), output_dir, settings, progress=progress,
                                reporter=reporter, worker=worker, config_hash=config_hash)
             for name, raw in raws.items()]
    run_units([unit.step for unit in units])
    results = {unit.method: unit.result() for unit in units}
    write_results(results, output_dir)
    records.write_json(Path(output_dir) / SUMMARY_FILE, {
        "settings": {**asdict(settings), "storage": None if settings.storage is None else redact(settings.storage)},
        "methods": {
            name: {"params": result.params, "fold_layout_hash": result.fold_layout_hash,
                   "outcomes": [asdict(outcome) for outcome in result.outcomes]}
            for name, result in results.items()
        },
    })
    return results


def run_rows(results: Mapping[str, MethodReproductions]) -> list[dict[str, Any]]:
    """One row per method, scored reproduction, mode and metric (the columns of ``runs.csv``)."""
    rows = []
    for method, reproductions in results.items():
        for outcome in reproductions.outcomes:
            for mode, metrics in (outcome.scores or {}).items():
                for metric, value in metrics.items():
                    rows.append({"method": method, "reproduction": outcome.reproduction, "mode": mode,
                                 "metric": metric, "value": value})
    return rows


def result_rows(results: Mapping[str, MethodReproductions]) -> list[dict[str, Any]]:
    """Mean and 95% Student-t interval over reproductions per method, mode and metric (``results.csv``)."""
    grouped: dict[tuple[str, str, str], list[float]] = {}
    for row in run_rows(results):
        grouped.setdefault((row["method"], row["mode"], row["metric"]), []).append(row["value"])
    rows = []
    for (method, mode, metric), values in grouped.items():
        interval = mean_interval(values)
        rows.append({"method": method, "mode": mode, "metric": metric, "mean": interval.mean,
                     "ci_low": interval.low, "ci_high": interval.high, "n": interval.n})
    return rows


def compare_reproductions(
    results: Mapping[str, MethodReproductions], mode: str = "concatenated", metric: str = "map_at_r"
) -> list[PairedComparison]:
    """Every pair of methods on one mode and metric, reproductions paired by seed (``statistics.compare_methods``:
    paired t-test, Wilcoxon signed-rank, Holm across the pairs, Cohen's d_z). Only seeds that every
    method scored are compared, so a failed reproduction removes its seed from all methods."""
    return compare_methods(seed_scores(results, mode, metric))


def seed_scores(results: Mapping[str, MethodReproductions], mode: str, metric: str) -> dict[str, dict[int, float]]:
    """``method -> seed -> score`` on one mode and metric, for the seeds that every method scored
    (a failed reproduction removes its seed from all methods, so every comparison stays paired)."""
    if mode not in MODES:
        raise UserInputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    scores: dict[str, dict[int, float]] = {}
    for method, reproductions in results.items():
        scores[method] = {}
        for outcome in reproductions.outcomes:
            if outcome.scores is None:
                continue
            if metric not in outcome.scores[mode]:
                raise UserInputError(f"metric {metric!r} was not computed; computed: {', '.join(outcome.scores[mode])}")
            scores[method][outcome.seed] = outcome.scores[mode][metric]
    common = set.intersection(*(set(values) for values in scores.values())) if scores else set()
    return {method: {seed: values[seed] for seed in sorted(common)} for method, values in scores.items()}


def write_results(results: Mapping[str, MethodReproductions], output_dir: Path) -> tuple[Path, Path]:
    """Write ``results.csv`` and ``runs.csv`` atomically (an undefined interval, n = 1, is written ``nan``)."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = output_dir / "results.csv", output_dir / "runs.csv"
    for path, columns, rows in ((paths[0], RESULTS_COLUMNS, result_rows(results)), (paths[1], RUNS_COLUMNS, run_rows(results))):
        stream = io.StringIO()
        writer = csv.DictWriter(stream, fieldnames=list(columns), lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({key: _cell(value) for key, value in row.items()})
        records.atomic_write_text(path, stream.getvalue())
    return paths


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)
    return value
