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
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dmlbench import config as config_module
from dmlbench.errors import RunInterrupted, UserInputError
from dmlbench.protocol.benchmark import BenchmarkSpec
from dmlbench.protocol.folds import FoldLayout, fold_layout
from dmlbench.protocol.reproductions import (
    UNTRAINED,
    MethodReproductions,
    ReproductionSettings,
    reproduce_methods,
    score_untrained,
)
from dmlbench.protocol.search import (
    PROTOCOL_KEYS,
    apply_budget,
    SearchSettings,
    method_raw_config,
    search_methods,
    storage_url,
)
from dmlbench.protocol.search_space import SearchSpace, parse_search_space
from dmlbench.training import records
from dmlbench.training.setup import load_dataset

BENCHMARK_FILE = "benchmark.json"
RESULTS_FILE = "results.json"


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
    storage: str

    def description(self) -> dict[str, Any]:
        """What ``benchmark.json`` records; a resumed benchmark must describe itself identically."""
        return {
            "spec": self.spec.model_dump(mode="json"),
            "overrides": list(self.overrides),
            "protocol": self.spec.protocol.model_dump(mode="json"),
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
    spec: BenchmarkSpec, output_dir: Path, overrides: list[str] | None = None, storage: str | None = None
) -> Prepared:
    """Check the whole benchmark; a ``UserInputError`` (one line) names the first problem. Writes nothing."""
    overrides = list(overrides or [])
    output_dir = Path(output_dir)
    protocol = spec.protocol
    search = SearchSettings(
        trials=protocol.trials, folds=protocol.folds, fold_mode=protocol.fold_mode, epochs=protocol.epochs,
        patience=protocol.patience, sampler=protocol.sampler, seed=protocol.search_seed, storage=storage,
        pruner=protocol.pruner,
    )
    reproduction = ReproductionSettings(
        reproductions=protocol.reproductions, first_seed=protocol.first_seed, folds=protocol.folds,
        fold_mode=protocol.fold_mode, epochs=protocol.epochs, patience=protocol.patience,
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
    if output_dir.exists() and not output_dir.is_dir():
        raise UserInputError(f"output {output_dir} is a file, not a directory")
    url = storage_url(output_dir, storage)
    check_storage(url, default=storage is None)
    prepared = Prepared(spec, overrides, output_dir, search, reproduction, spaces, configs, layout,
                        dataset.content_hash, url)
    stored_path = output_dir / BENCHMARK_FILE
    if stored_path.exists():
        stored = records.read_json(stored_path)
        description = prepared.description()
        for key, value in description.items():
            if stored.get(key) != value:
                raise UserInputError(
                    f"{output_dir} holds a benchmark with another {key}: re-run the same command, or use a new output directory"
                )
    return prepared


def check_storage(url: str, *, default: bool) -> None:
    """A one-line ``UserInputError`` unless the Optuna storage ``url`` can be reached (nothing is created)."""
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///"):])
        if path.exists() and not path.is_file():
            raise UserInputError(f"storage {url}: {path} is not a file")
        if not default and not path.parent.is_dir():
            raise UserInputError(f"storage {url}: directory {path.parent} does not exist")
        return
    try:
        import optuna

        # No table creation, no version check: only a connection, so a failed check changes nothing.
        storage = optuna.storages.RDBStorage(url, skip_compatibility_check=True, skip_table_creation=True)
        with storage.engine.connect():
            pass
        storage.engine.dispose()
    except Exception as error:  # any failure to reach the database is the user's storage URL
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserInputError(f"storage {url} cannot be reached: {first_line}") from None


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
    if not path.exists():
        records.write_json(path, {**prepared.description(), "storage": prepared.storage,
                                  "git_commit": records.git_commit(), "created": records.now()})


def run_search_stage(prepared: Prepared, *, progress: bool = True) -> dict[str, Any]:
    """The search stage alone (``dmlbench search``): every method's study, ``search.json``."""
    _start(prepared)
    protocol = prepared.spec.protocol
    reporter = Progress(len(prepared.configs) * protocol.trials * protocol.folds, 0, progress)
    try:
        return search_methods(prepared.spec, prepared.output_dir, prepared.search, prepared.overrides,
                              progress=progress, reporter=reporter)
    except RunInterrupted:
        raise RunInterrupted(f"search {prepared.output_dir} stopped; re-run the same command to continue") from None


def run_benchmark(prepared: Prepared, *, progress: bool = True) -> BenchmarkOutcome:
    """Search, reproductions, baseline and report; see the module docstring. Resumable."""
    from dmlbench.report import write_report

    _start(prepared)
    output_dir = prepared.output_dir
    protocol = prepared.spec.protocol
    total = len(prepared.configs) * (protocol.trials + protocol.reproductions) * protocol.folds
    reporter = Progress(total, _completed_runs(output_dir), progress)
    failed: dict[str, str] = {}
    try:
        searched = search_methods(prepared.spec, output_dir, prepared.search, prepared.overrides,
                                  progress=progress, reporter=reporter)
        best = {}
        for name, result in searched.items():
            if result.best_params is None:
                failed[name] = f"no search trial completed ({result.failed} failed)"
            else:
                best[name] = dict(result.best_params)
        results: dict[str, MethodReproductions] = {}
        if best:
            results = reproduce_methods(prepared.spec, best, output_dir, prepared.reproduction, prepared.overrides,
                                        progress=progress, reporter=reporter, methods=list(best))
        for name, result in results.items():
            reasons = [f"reproduction {o.reproduction}: {o.reason}" for o in result.outcomes if o.scores is None]
            if reasons:
                failed[name] = "; ".join(reasons)
        reference = next((result for result in results.values() if any(o.scores for o in result.outcomes)), None)
        if reference is not None:
            metrics = prepared.configs[reference.method].evaluation.metrics
            results[UNTRAINED] = score_untrained(reference, output_dir, metrics)
    except RunInterrupted:
        raise RunInterrupted(f"benchmark {output_dir} stopped; re-run the same command to continue") from None
    records.write_json(output_dir / RESULTS_FILE, {
        "methods": {name: {"params": result.params, "fold_layout_hash": result.fold_layout_hash,
                           "outcomes": [asdict(outcome) for outcome in result.outcomes]}
                    for name, result in results.items()},
        "failed": failed,
    })
    write_report(output_dir)
    return BenchmarkOutcome(output_dir, results, failed)
