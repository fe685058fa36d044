"""Audit a benchmark directory: prove from its records that the test classes were untouched until the end.

``audit`` reads ``benchmark.json`` (the fold layout and its test classes), every run's ``run.json``,
``config.yaml`` and ``metrics.jsonl``, the Optuna studies and ``test_access.jsonl``, and returns one
line per problem (empty: the audit passed):

* a search-stage run that saw a test class (in its train or validation classes) or records test classes;
* a checkpoint selected with test data: a per-epoch record with test metrics, a selection metric
  other than validation, or a test opening of a run that was not a finished reproduction run
  (or that happened before the run finished);
* train, validation and test classes not disjoint within a run;
* methods with different budgets (trials, epochs, folds, reproductions, search settings);
* an analysis changed after the runs (accepted with ``--accept-analysis-change``): not the declared one;
* a frozen-trunk run (``trunks/fold_K``) whose train or validation classes are not exactly its
  fold's or that is not recorded as stage ``trunk`` of its fold; a head trained on another fold's trunk.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import optuna
import yaml

from dmlbench import files, plugins
from dmlbench.errors import UserInputError
from dmlbench.protocol.design.benchmark_file import BenchmarkRecord, StoredFoldLayout, read_benchmark
from dmlbench.protocol.layout import (
    BENCHMARK_FILE,
    REPRODUCTION_STAGE,
    SEARCH_STAGE,
    TEST_ACCESS_FILE,
    TRUNK_STAGE,
    fold_dir,
    method_fold_dirs,
    reproduction_study,
    search_repeat_dirs,
    trunk_run_dirs,
    trunks_dir,
)
from dmlbench.protocol.queue import attempts
from dmlbench.protocol.queue import storage as storage_module
from dmlbench.training import records


def audit(output_dir: Path, storage: str | None = None) -> list[str]:
    """Every problem found in ``output_dir`` (one line each, naming the run); ``[]`` if none.
    ``storage``: the URL to read (by default the one ``benchmark.json`` records, without password)."""
    output_dir = Path(output_dir)
    benchmark = read_benchmark(output_dir)
    if benchmark.fold_layout is None:
        raise UserInputError(f"{output_dir}: {BENCHMARK_FILE} records no fold layout, so its test classes cannot be checked")
    test_classes = set(benchmark.fold_layout.test_classes)
    problems: list[str] = []
    runs: dict[str, dict[str, Any]] = {}
    epochs: dict[str, set[int]] = {}
    # The runs of the repeated searches (``protocol.search_repeats``) are audited like their method's.
    repeats = [path.name for method in benchmark.methods for path in search_repeat_dirs(output_dir, method)]
    for method in [*benchmark.methods, *repeats]:
        epochs[method] = set()
        for name, run_dir, record in _run_records(output_dir, method_fold_dirs(output_dir, method), problems):
            runs[name] = record
            problems += _audit_run(name, run_dir, record, method, test_classes, epochs[method])
            problems += _audit_plugins(name, record, benchmark)
    problems += _audit_trunks(output_dir, benchmark.fold_layout, test_classes, runs)
    problems += _audit_test_access(output_dir / TEST_ACCESS_FILE, runs)
    problems += _audit_budgets(benchmark, epochs, storage or benchmark.storage)
    problems += _audit_analysis(benchmark)
    return problems


def _audit_run(
    name: str, run_dir: Path, record: dict[str, Any], method: str, test_classes: set[int], epochs: set[int]
) -> list[str]:
    """One run of ``method``: its stage, its classes, its per-epoch records and its selection metric.

    Adds the epochs of a completed run to ``epochs`` (the budget check compares them across methods).
    """
    problems: list[str] = []
    stage = record.get("stage")
    train = set(record.get("train_classes") or [])
    val = set(record.get("val_classes") or [])
    recorded_test = set(record.get("test_classes") or [])
    if record.get("method") != method:
        problems.append(f"{name}: {records.RUN_FILE} names method {record.get('method')!r}")
    if stage == SEARCH_STAGE:
        seen = sorted((train | val) & test_classes)
        if seen:
            problems.append(f"{name}: search-stage run saw test classes {seen[:10]}")
        if "test_classes" in record:
            problems.append(f"{name}: search-stage run records test classes")
    elif stage == REPRODUCTION_STAGE:
        if recorded_test and recorded_test != test_classes:
            problems.append(f"{name}: recorded test classes differ from the fold layout's")
    else:
        problems.append(f"{name}: unknown stage {stage!r}")
    run_test = recorded_test or test_classes
    for a, b, words in ((train, val, "train and validation"), (train, run_test, "train and test"),
                        (val, run_test, "validation and test")):
        common = sorted(a & b)
        if common:
            problems.append(f"{name}: {words} classes overlap {common[:10]}")
    for entry in records.read_metrics(run_dir):
        if any(key.startswith("test") for key in entry):
            problems.append(f"{name}: epoch {entry.get('epoch')} records test metrics")
            break
    config_path = run_dir / records.CONFIG_FILE
    if config_path.is_file():
        config = yaml.safe_load(config_path.read_text()) or {}
        selection = (config.get("evaluation") or {}).get("selection_metric", "map_at_r")
        if str(selection).startswith("test"):
            problems.append(f"{name}: checkpoint selected on {selection!r}")
        if record.get("status") == "completed":
            epochs.add(int((config.get("training") or {}).get("epochs", 0)))
    return problems


def _audit_plugins(name: str, record: dict[str, Any], benchmark: BenchmarkRecord) -> list[str]:
    """A run used the plugin code the benchmark started with, or code whose change was accepted on purpose."""
    allowed = [benchmark.plugins, *(entry.plugins for entry in benchmark.plugin_changes_accepted)]
    used = plugins.identity(record.get("plugins", []))
    if "plugins" in record and used not in allowed:
        changes = plugins.changed(benchmark.plugins, used)
        return [f"{name}: {changes[0] if changes else 'other plugins than the benchmark recorded'}"]
    return []


def _audit_test_access(accesses: Path, runs: dict[str, dict[str, Any]]) -> list[str]:
    """Every opening of the test data was for a reproduction run, after that run finished."""
    problems: list[str] = []
    if not accesses.is_file():
        return problems
    for number, line in enumerate(accesses.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:  # not JSON, or not UTF-8
            entry = None
        if not isinstance(entry, dict):
            problems.append(f"{TEST_ACCESS_FILE} line {number}: not a record (a write cut short?), "
                            "so the opening it logged cannot be checked")
            continue
        if entry.get("stage") != REPRODUCTION_STAGE:
            problems.append(f"{TEST_ACCESS_FILE} line {number}: test data opened in stage {entry.get('stage')!r}")
        for name in entry.get("runs", []):
            record = runs.get(name)
            if record is None or record.get("stage") != REPRODUCTION_STAGE:
                problems.append(f"{TEST_ACCESS_FILE} line {number}: test data opened for {name}, not a reproduction run")
            elif str(record.get("finished", "~")) > str(entry.get("time", "")):
                problems.append(f"{TEST_ACCESS_FILE} line {number}: test data opened for {name} before it finished")
    return problems


def _audit_analysis(benchmark: BenchmarkRecord) -> list[str]:
    """The analysis in force must be the one declared before the runs (``benchmark.json``'s ``analysis``,
    covered by the config hash); each change accepted with ``--accept-analysis-change`` is named."""
    if not benchmark.analysis_in_hash:
        return []  # started before the analysis was fixed: nothing was declared to check against
    return [f"analysis changed after the runs ({change.time}): "
            f"{', '.join('analysis.' + key for key in change.changed)}, accepted with --accept-analysis-change"
            for change in benchmark.analysis_changes_accepted]


def _audit_budgets(benchmark: BenchmarkRecord, epochs: dict[str, set[int]], url: str) -> list[str]:
    """Each method's study in storage ``url`` spent the protocol's trials, and all methods spent the same budgets."""
    problems: list[str] = []
    protocol = benchmark.protocol
    budgets: dict[str, tuple[Any, ...]] = {}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    names, storage = storage_module.open_for_reading(url)
    for method in benchmark.methods:
        if method not in names:
            problems.append(f"method {method}: no study in {storage_module.redact(url)}")
            continue
        study = optuna.load_study(study_name=method, storage=storage)
        budgeted = len(attempts.counted(study))
        settings = study.user_attrs.get("settings", {})
        reproductions = (len(attempts.counted(optuna.load_study(study_name=reproduction_study(method), storage=storage)))
                         if reproduction_study(method) in names else 0)
        # The counts are checked against the protocol one method at a time (an unfinished benchmark is
        # short of them); what the methods must share besides is compared across them.
        budgets[method] = (study.user_attrs.get("epochs"), settings.get("folds"), tuple(sorted(epochs[method])),
                           tuple(sorted((k, str(v)) for k, v in settings.items())))
        if budgeted != protocol.trials:
            problems.append(f"method {method}: {budgeted} search trials, the protocol says {protocol.trials}")
        if reproductions != protocol.reproductions:
            problems.append(f"method {method}: {reproductions} reproductions, the protocol says {protocol.reproductions}"
                            f"{' (not finished yet?)' if reproductions < protocol.reproductions else ''}")
    if len(set(budgets.values())) > 1:
        detail = "; ".join(f"{m}: epochs {b[0]}, folds {b[1]}, run epochs {list(b[2])}" for m, b in budgets.items())
        problems.append(f"methods used different budgets ({detail})")
    return problems


def _run_records(output_dir: Path, run_dirs: Iterable[Path], problems: list[str]) -> Iterator[tuple[str, Path, dict[str, Any]]]:
    """Each run directory that holds a record: its name (relative to the benchmark), the directory and the
    record; a record that cannot be read is appended to ``problems`` and skipped."""
    for run_dir in run_dirs:
        run_file = run_dir / records.RUN_FILE
        if not run_file.is_file():
            continue
        name = str(run_dir.relative_to(output_dir))
        try:
            record = files.read_json(run_file)
        except (OSError, ValueError) as error:
            problems.append(f"{name}: {records.RUN_FILE} cannot be read ({error})")
            continue
        yield name, run_dir, record


def _audit_trunks(
    output_dir: Path, fold_layout: StoredFoldLayout, test_classes: set[int], runs: dict[str, dict[str, Any]]
) -> list[str]:
    """The frozen-trunk runs: each trained on exactly its fold's train classes, selected on its val classes."""
    problems: list[str] = []
    folds = {fold.index: fold for fold in fold_layout.folds}
    for name, run_dir, record in _run_records(output_dir, trunk_run_dirs(output_dir), problems):
        fold = folds.get(record.get("fold")) if isinstance(record.get("fold"), int) else None
        if record.get("stage") != TRUNK_STAGE or fold is None or run_dir != fold_dir(trunks_dir(output_dir), fold.index):
            problems.append(f"{name}: not recorded as the trunk run of a fold (stage {record.get('stage')!r}, fold {record.get('fold')!r})")
            continue
        train, val = set(record.get("train_classes") or []), set(record.get("val_classes") or [])
        seen = sorted((train | val) & test_classes)
        if seen:
            problems.append(f"{name}: trunk run saw test classes {seen[:10]}")
        if train != set(fold.train_classes):
            problems.append(f"{name}: trunk run's train classes are not exactly fold {fold.index}'s train classes")
        if val != set(fold.val_classes):
            problems.append(f"{name}: trunk run's validation classes are not exactly fold {fold.index}'s")
    for name, record in runs.items():
        trunk_run = (record.get("frozen_trunk") or {}).get("trunk_run")
        fold = record.get("fold")
        expected = fold_dir(trunks_dir(Path()), fold).parts if isinstance(fold, int) else None  # ("trunks", "fold_K")
        if trunk_run is not None and Path(trunk_run).parts[-2:] != expected:
            problems.append(f"{name}: head trained on the features of another fold's trunk ({trunk_run})")
    return problems
