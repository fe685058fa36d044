"""The whole protocol of seed 001 §3 over the methods of a benchmark YAML, resumable, in one call.

``prepare`` checks everything a user can get wrong before anything is written (the methods' configs
and search spaces, the shared budget, the folds against the development classes, the seeds, the
storage); ``run_benchmark`` then runs, per method, the Optuna search (``protocol.search``: the same
number of trials and epochs for every method), the reproductions with the best parameters on new
seeds (``protocol.reproductions``: test scored concatenated and separated), the untrained baseline
row, and writes the report (``dmlbench.report``). Every stage keeps what it finished, so running the
same command again after an interruption (Ctrl-C or ``kill -9``) continues where it stopped.

Storage layout of ``OUTPUT_DIR``: ``benchmark.json`` (the spec, overrides, protocol, fold layout,
dataset hash, git commit: what the report and the audit read), ``study.db`` (one Optuna study per
method, unless ``--storage``), ``METHOD/trial_NNNN/fold_I`` and ``METHOD/reproduction_RR/fold_I`` run
directories, ``search.json``, ``reproductions.json``, ``results.json`` (every method's reproductions
with the baseline and the failures), ``test_access.jsonl`` (every opening of the test data).
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dmlbench import config as config_module
from dmlbench.errors import RunInterrupted, StorageFailed, UserInputError
from dmlbench.protocol.benchmark import BenchmarkSpec, apply_spec_overrides
from dmlbench.protocol.folds import FoldLayout, fold_layout
from dmlbench.protocol import storage as storage_module
from dmlbench.protocol import work
from dmlbench.protocol.reproductions import (
    UNTRAINED,
    MethodReproduction,
    MethodReproductions,
    ReproductionSettings,
    UntrainedBaseline,
    study_name,
    write_results,
)
from dmlbench.protocol.search import (
    POLL_SECONDS,
    PROTOCOL_KEYS,
    MethodSearch,
    SearchSettings,
    apply_budget,
    best_trial,
    method_raw_config,
    search_methods,
)
from dmlbench.protocol.search_space import SearchSpace, parse_search_space
from dmlbench.training import records
from dmlbench.training.setup import load_dataset

BENCHMARK_FILE = "benchmark.json"
RESULTS_FILE = "results.json"


# A lost database server is waited for storage.DEFAULT_RETRY_SECONDS per outage (``--db-retry``),
# doubling the pause between tries up to MAX_RETRY_DELAY; an attempt that worked this long ends an outage.
MAX_RETRY_DELAY = 30.0
RETRY_RESET_SECONDS = 60.0


@dataclass
class Prepared:
    """A checked benchmark, ready to run: nothing has been written yet."""

    spec: BenchmarkSpec
    overrides: list[str]
    output_dir: Path
    search: SearchSettings
    reproduction: ReproductionSettings
    spaces: dict[str, SearchSpace]
    configs: dict[str, config_module.Config]
    layout: FoldLayout
    dataset_hash: str
    storage: str  # as given (it may hold a password): never stored or printed, see ``redacted``
    jobs: int = 1
    heartbeat: int = 30
    retry_seconds: int = storage_module.DEFAULT_RETRY_SECONDS

    @property
    def redacted(self) -> str:
        return storage_module.redact(self.storage)

    @property
    def config_hash(self) -> str:
        """Identifies the benchmark in a shared storage: two workers with different configs never mix."""
        text = json.dumps(self.description(), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def study_names(self) -> list[str]:
        return [*self.configs, *(study_name(name) for name in self.configs), study_name(UNTRAINED)]

    def description(self) -> dict[str, Any]:
        """What ``benchmark.json`` records; a resumed benchmark must describe itself identically.
        The report-only ``analysis`` section is left out, and so is an unset ``startup_trials``, so that
        benchmarks started before that key existed keep their description and config hash."""
        unset = {"startup_trials"} if self.spec.protocol.startup_trials is None else set()
        return {
            "spec": self.spec.model_dump(mode="json", exclude={"analysis": True, "protocol": unset}),
            "overrides": list(self.overrides),
            "protocol": self.spec.protocol.model_dump(mode="json", exclude=unset),
            "methods": [method.name for method in self.spec.methods],
            "metrics": list(next(iter(self.configs.values())).evaluation.metrics),
            "fold_layout": self.layout.as_dict(),
            "fold_layout_hash": self.layout.hash,
            "dataset": {"name": next(iter(self.configs.values())).data.name, "content_hash": self.dataset_hash},
        }


@dataclass
class BenchmarkOutcome:
    output_dir: Path
    results: dict[str, MethodReproductions]
    failed: dict[str, str] = field(default_factory=dict)


def prepare(
    spec: BenchmarkSpec, output_dir: Path, overrides: list[str] | None = None, storage: str | None = None,
    *, jobs: int = 1, heartbeat: int = 30, retry_seconds: int = storage_module.DEFAULT_RETRY_SECONDS,
) -> Prepared:
    """Check the whole benchmark; a ``UserInputError`` (one line) names the first problem. Writes nothing.

    ``jobs``: local worker processes (more than one needs a storage for concurrent writers);
    ``heartbeat``: seconds between a PostgreSQL worker's heartbeats (stale after three missed);
    ``retry_seconds``: how long a worker waits for a lost database server before it stops."""
    spec, overrides = apply_spec_overrides(spec, list(overrides or []))
    output_dir = Path(output_dir)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise UserInputError(f"--jobs must be a positive integer, got {jobs!r}")
    if isinstance(heartbeat, bool) or not isinstance(heartbeat, int) or heartbeat < 1:
        raise UserInputError(f"--heartbeat must be a positive number of seconds, got {heartbeat!r}")
    if isinstance(retry_seconds, bool) or not isinstance(retry_seconds, int) or retry_seconds < 0:
        raise UserInputError(f"--db-retry must be a number of seconds >= 0, got {retry_seconds!r}")
    if output_dir.exists() and not output_dir.is_dir():
        raise UserInputError(f"output {output_dir} is a file, not a directory")
    url = resolve_storage(output_dir, storage, jobs)
    protocol = spec.protocol
    search = SearchSettings(
        trials=protocol.trials, folds=protocol.folds, fold_mode=protocol.fold_mode, epochs=protocol.epochs,
        patience=protocol.patience, sampler=protocol.sampler, seed=protocol.search_seed, storage=url,
        pruner=protocol.pruner, startup_trials=protocol.startup_trials, parallel_trials=protocol.parallel_trials,
        frozen_trunk=protocol.frozen_trunk,
    )
    reproduction = ReproductionSettings(
        reproductions=protocol.reproductions, first_seed=protocol.first_seed, folds=protocol.folds,
        fold_mode=protocol.fold_mode, epochs=protocol.epochs, patience=protocol.patience, storage=url,
    )
    search.check()
    reproduction.check()
    spaces, configs = {}, {}
    for method in spec.methods:
        raw = method_raw_config(spec, method.name, overrides)
        space = parse_search_space(method.search, raw, method=method.name)
        taken = sorted(set(space.keys()) & set(PROTOCOL_KEYS))
        if taken:
            raise UserInputError(f"method {method.name!r}: search key {taken[0]!r} is set by the protocol, not searched")
        try:
            budgeted = apply_budget(raw, search.epochs, search.patience)
            configs[method.name] = config_module.from_dict(copy.deepcopy(budgeted))
        except UserInputError as error:
            raise UserInputError(f"method {method.name!r}: {error}") from None
        spaces[method.name] = space
    epochs = {name: config.training.epochs for name, config in configs.items()}
    if len(set(epochs.values())) > 1:
        raise UserInputError(f"methods train for different numbers of epochs {epochs}: set protocol.epochs")
    first_name, first = next(iter(configs.items()))
    for name, config in configs.items():
        if config.data != first.data:
            raise UserInputError(f"method {name!r} uses other data than {first_name!r}: every method must use the same data")
        if config.evaluation.metrics != first.evaluation.metrics:
            raise UserInputError(f"method {name!r} computes other metrics than {first_name!r}")
    search_seeds = {config.seed for config in configs.values()}
    reproduction_seeds = set(range(protocol.first_seed, protocol.first_seed + protocol.reproductions))
    if search_seeds & reproduction_seeds:
        raise UserInputError(
            f"reproduction seeds {protocol.first_seed}..{protocol.first_seed + protocol.reproductions - 1} include "
            f"the search's training seed {min(search_seeds & reproduction_seeds)}: set protocol.first_seed"
        )
    dataset = load_dataset(first)
    layout = fold_layout(dataset, k=protocol.folds, mode=protocol.fold_mode)
    _check_samplers(configs, dataset.labels, layout)
    storage_module.check_storage(url, default=storage is None, jobs=jobs)
    prepared = Prepared(spec, overrides, output_dir, search, reproduction, spaces, configs, layout,
                        dataset.content_hash, url, jobs, heartbeat, retry_seconds)
    stored_path = output_dir / BENCHMARK_FILE
    if stored_path.exists():
        stored = records.read_json(stored_path)
        description = prepared.description()
        for key, value in description.items():
            if stored.get(key) != value:
                raise UserInputError(
                    f"{output_dir} holds a benchmark with another {key}: re-run the same command, or use a new output directory"
                )
    _check_studies(prepared)
    return prepared


def _check_samplers(configs: Mapping[str, config_module.Config], labels: Any, layout: FoldLayout) -> None:
    """Every method's batch sampler can fill its batches from a fold's training classes (the check
    ``train`` makes), before anything trains: a batch size the sampler cannot fill is exit 2 now,
    not a failed trial in storage an hour later."""
    import numpy as np

    from dmlbench.training.setup import build_sampler

    fold = layout.folds[0]
    train_labels = np.asarray(labels)[np.isin(np.asarray(labels), list(fold.train_classes))]
    for name, config in configs.items():
        try:
            build_sampler(config, train_labels)
        except UserInputError as error:
            raise UserInputError(f"method {name!r}: {error}") from None


def resolve_storage(output_dir: Path, storage: str | None, jobs: int) -> str:
    """``--storage``, else the storage an existing benchmark in ``output_dir`` records, else the
    default for ``jobs`` workers (``storage.default_url``)."""
    if storage:
        storage_module.kind(storage)
        return storage
    stored = Path(output_dir) / BENCHMARK_FILE
    if stored.is_file():
        recorded = records.read_json(stored).get("storage")
        if recorded:
            return str(recorded)
    return storage_module.default_url(output_dir, jobs)


def _check_studies(prepared: Prepared) -> None:
    """Refuse a storage whose studies of the same names belong to another benchmark config."""
    import optuna

    names = set(storage_module.study_names(prepared.storage)) & set(prepared.study_names())
    if not names:
        return
    storage = storage_module.open_storage(prepared.storage)
    for name in sorted(names):
        stored = optuna.load_study(study_name=name, storage=storage).user_attrs.get("config_hash")
        if stored is not None and stored != prepared.config_hash:
            raise UserInputError(
                f"storage {prepared.redacted}: study {name!r} belongs to a benchmark with another config "
                f"(hash {stored}, this one {prepared.config_hash}); start every worker with the same config and "
                "overrides, or use another storage"
            )


class Progress:
    """Plain progress lines: method, stage, trial or reproduction, fold, elapsed and estimated time left."""

    def __init__(self, total_runs: int, done_runs: int, enabled: bool) -> None:
        self.total, self.done_before, self.enabled = total_runs, done_runs, enabled
        self.started = 0
        self.start = time.monotonic()

    def __call__(self, event: Mapping[str, Any]) -> None:
        self.started += 1
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        finished_here = self.started - 1
        remaining = max(self.total - self.done_before - finished_here, 0)
        left = _clock(elapsed / finished_here * remaining) if finished_here else "?"
        step = f"search trial {event['trial']}" if "trial" in event else f"reproduction {event['reproduction']}"
        print(
            f"== {event['method']}: {step} fold {event['fold']} "
            f"(run {min(self.done_before + self.started, self.total)}/{self.total}, elapsed {_clock(elapsed)}, left ~{left})",
            file=sys.stderr, flush=True,
        )


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _completed_runs(output_dir: Path) -> int:
    count = 0
    for path in output_dir.glob("*/*/fold_*/" + records.RUN_FILE):
        try:
            count += records.read_json(path).get("status") == "completed"
        except (OSError, ValueError):
            continue
    return count


def _start(prepared: Prepared) -> None:
    prepared.output_dir.mkdir(parents=True, exist_ok=True)
    path = prepared.output_dir / BENCHMARK_FILE
    analysis = prepared.spec.analysis.model_dump(mode="json")
    if not path.exists():
        records.write_json(path, {**prepared.description(), "analysis": analysis, "storage": prepared.redacted,
                                  "config_hash": prepared.config_hash,
                                  "git_commit": records.git_commit(), "created": records.now(),
                                  # the machine of the worker that started it (each run.json has its own)
                                  "environment": records.environment()})
        return
    stored = records.read_json(path)
    if stored.get("analysis") != analysis:  # report-only settings: the latest config's apply
        records.write_json(path, {**stored, "analysis": analysis})


def run_search_stage(prepared: Prepared, *, progress: bool = True) -> dict[str, Any]:
    """The search stage alone (``dmlbench search``): every method's study, ``search.json``."""
    _start(prepared)
    protocol = prepared.spec.protocol
    reporter = Progress(len(prepared.configs) * protocol.trials * protocol.folds, 0, progress)
    try:
        return search_methods(prepared.spec, prepared.output_dir, prepared.search, prepared.overrides,
                              progress=progress, reporter=reporter,
                              worker=work.Worker(prepared.storage, heartbeat=prepared.heartbeat),
                              config_hash=prepared.config_hash)
    except RunInterrupted:
        raise RunInterrupted(f"search {prepared.output_dir} stopped; re-run the same command to continue") from None


def run_benchmark(prepared: Prepared, *, progress: bool = True) -> BenchmarkOutcome | None:
    """Work on the benchmark until every unit is done (search trials, reproductions, the untrained
    baseline), with any number of other workers on the same storage; then the first worker to find
    everything done writes the report and gets the outcome. ``None``: another worker wrote it.
    Resumable; see the module docstring.

    A database server that goes away (a restart, a fail-over) is waited for: the worker retries
    with a doubling back-off for up to ``prepared.retry_seconds`` per outage, then stops with a
    ``StorageFailed`` (the same command continues later). A unit whose result could not be stored is
    taken up again through the heartbeat, its finished fold runs kept."""
    delay, outage_started = 1.0, None
    while True:
        attempt_started = time.monotonic()
        try:
            return _work_on_benchmark(prepared, progress=progress)
        except Exception as error:
            lost = storage_module.connection_lost(error) if storage_module.kind(prepared.storage) == "postgresql" else None
            if lost is None:
                raise
            now = time.monotonic()
            if outage_started is None or now - attempt_started > RETRY_RESET_SECONDS:
                delay, outage_started = 1.0, now  # a new outage: the last one was followed by work
            if now - outage_started >= prepared.retry_seconds:
                raise StorageFailed(
                    f"storage {prepared.redacted} unreachable for {prepared.retry_seconds} s ({lost}); "
                    "the work done is stored: run the same command again to continue") from error
            print(f"dmlbench: warning: storage {prepared.redacted} unreachable ({lost}); retrying in {delay:.0f} s",
                  file=sys.stderr, flush=True)
            time.sleep(delay)
            delay = min(2 * delay, MAX_RETRY_DELAY)


def _work_on_benchmark(prepared: Prepared, *, progress: bool) -> BenchmarkOutcome | None:
    _start(prepared)
    output_dir = prepared.output_dir
    protocol = prepared.spec.protocol
    total = len(prepared.configs) * (protocol.trials + protocol.reproductions) * protocol.folds
    reporter = Progress(total, _completed_runs(output_dir), progress)
    worker = work.Worker(prepared.storage, heartbeat=prepared.heartbeat)
    raws = {name: method_raw_config(prepared.spec, name, prepared.overrides) for name in prepared.configs}
    try:
        searches = {name: MethodSearch(name, raws[name], prepared.spaces[name], output_dir, prepared.search,
                                       progress=progress, reporter=reporter, worker=worker,
                                       config_hash=prepared.config_hash)
                    for name in prepared.configs}
        reproductions: dict[str, MethodReproduction] = {}
        baseline: list[UntrainedBaseline] = []
        while True:
            states, worked = [], False
            for name, search in searches.items():
                state = search.step()
                states.append(state)
                if state not in (work.WAIT, work.DONE):
                    worked = True
                    break
                if state == work.DONE and name not in reproductions and (best := best_trial(search.study)) is not None:
                    reproductions[name] = MethodReproduction(
                        name, raws[name], dict(best.params), output_dir, prepared.reproduction, progress=progress,
                        reporter=reporter, worker=worker, config_hash=prepared.config_hash)
            if worked:
                continue
            if all(state == work.DONE for state in states) and not baseline and reproductions:
                reference = next(name for name in prepared.configs if name in reproductions)
                baseline.append(UntrainedBaseline(reference, raws[reference], reproductions[reference].params, output_dir,
                                                  prepared.reproduction, worker=worker, config_hash=prepared.config_hash))
            for unit in [*reproductions.values(), *baseline]:
                state = unit.step()
                states.append(state)
                if state not in (work.WAIT, work.DONE):
                    worked = True
                    break
            if worked:
                continue
            if all(state == work.DONE for state in states):
                break
            time.sleep(POLL_SECONDS)
        with worker.lock.held():
            marker = searches[next(iter(searches))].study
            reported = marker.user_attrs.get("report")
            if reported is not None and (output_dir / "report.md").exists():
                print(f"dmlbench: nothing left to do: every trial and reproduction of this benchmark is done; "
                      f"worker {reported['worker']} wrote the report", file=sys.stderr, flush=True)
                return None
            outcome = _write_outcome(prepared, searches, reproductions, baseline)
            marker.set_user_attr("report", {"worker": worker.id, "time": records.now()})
    except RunInterrupted:
        raise RunInterrupted(f"benchmark {output_dir} stopped; re-run the same command to continue") from None
    except KeyboardInterrupt:
        raise RunInterrupted(f"benchmark {output_dir} stopped; re-run the same command to continue") from None
    return outcome


def _write_outcome(
    prepared: Prepared,
    searches: Mapping[str, MethodSearch],
    reproductions: Mapping[str, MethodReproduction],
    baseline: list[UntrainedBaseline],
) -> BenchmarkOutcome:
    """``search.json``, ``reproductions.json``, ``results.json`` and the report, all from storage."""
    from dmlbench.report import write_report

    output_dir = prepared.output_dir
    failed: dict[str, str] = {}
    searched = {name: search.result() for name, search in searches.items()}
    records.write_json(output_dir / "search.json", {
        "settings": {**asdict(prepared.search), "storage": prepared.redacted},
        "methods": {name: {"best_value": r.best_value, "best_params": r.best_params, "completed": r.completed,
                           "failed": r.failed, "pruned": r.pruned, "fold_layout_hash": r.fold_layout_hash,
                           "storage": r.storage} for name, r in searched.items()},
    })
    for name, result in searched.items():
        if result.best_params is None:
            failed[name] = f"no search trial completed ({result.failed} failed)"
    results: dict[str, MethodReproductions] = {name: unit.result() for name, unit in reproductions.items()}
    for name, result in results.items():
        reasons = [f"reproduction {o.reproduction}: {o.reason}" for o in result.outcomes if o.scores is None]
        if reasons:
            failed[name] = "; ".join(reasons)
    if results:
        write_results(results, output_dir)
        records.write_json(output_dir / "reproductions.json", {
            "settings": {**asdict(prepared.reproduction), "storage": prepared.redacted},
            "methods": {name: {"params": r.params, "fold_layout_hash": r.fold_layout_hash,
                               "outcomes": [asdict(o) for o in r.outcomes]} for name, r in results.items()},
        })
    for unit in baseline:
        results[UNTRAINED] = unit.result()
    records.write_json(output_dir / RESULTS_FILE, {
        "methods": {name: {"params": result.params, "fold_layout_hash": result.fold_layout_hash,
                           "outcomes": [asdict(outcome) for outcome in result.outcomes]}
                    for name, result in results.items()},
        "failed": failed,
    })
    write_report(output_dir, prepared.storage)
    return BenchmarkOutcome(output_dir, results, failed)
