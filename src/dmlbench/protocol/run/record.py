"""What a benchmark writes beside its studies: ``benchmark.json`` when it starts (and the changes
accepted on purpose when it continues), the summaries ``search.json``, ``reproductions.json`` and
``results.json`` once every unit is done, and, with MLflow tracking, the report's files as artifacts
of the benchmark's parent run. The file names are ``protocol.layout``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dmlbench import files, provenance
from dmlbench.protocol import layout as output_layout
from dmlbench.protocol.design.benchmark_file import (
    AnalysisChange,
    BenchmarkRecord,
    PluginChange,
    StoredAnalysis,
    benchmark_path,
    new_benchmark,
    read_benchmark,
    read_benchmark_if_any,
    write_benchmark,
)
from dmlbench.protocol.design.prepare import Prepared, hashed_analysis, plugin_identity
from dmlbench.protocol.units.baseline import Baseline
from dmlbench.protocol.units.reproductions import MethodReproduction
from dmlbench.protocol.units.results import MethodReproductions
from dmlbench.protocol.units.search import MethodSearch, SearchResult, failed_search_text
from dmlbench.training import threads, tracking
from dmlbench.training.placement import STANDALONE, Placement


# The report writer a benchmark is given (``report.write_report``): it returns ``{file name: path}`` of
# exactly the files it wrote, which ``track_report`` uploads.
ReportWriter = Callable[[Path, str], Mapping[str, Path]]


@dataclass
class BenchmarkOutcome:
    output_dir: Path
    results: dict[str, MethodReproductions]
    failed: dict[str, str] = field(default_factory=dict)


def _device(prepared: Prepared, placement: Placement) -> str:
    """The device this worker trains on: the first method's ``training.device`` as this machine
    resolves it for the worker (``auto`` is CUDA where there is one)."""
    return str(placement.device(next(iter(prepared.plans.values())).config.training.device))


def _threads_per_worker(prepared: Prepared, cores_per_worker: int | None = None) -> int:
    """The torch threads a run trains with: where a method leaves ``training.num_threads`` at ``auto``,
    the cores each worker is given (``cores_per_worker``, SLURM's ``--cpus-per-task``) or else ``auto``'s
    share of this machine for this worker; else the largest number the methods set."""
    settings = {plan.config.training.num_threads for plan in prepared.plans.values()}
    if threads.AUTO in settings:
        return cores_per_worker or threads.auto_threads(prepared.jobs)
    return max(int(setting) for setting in settings)


def write_benchmark_file(prepared: Prepared, placement: Placement = STANDALONE, *,
                         threads_per_worker: int | None = None) -> BenchmarkRecord:
    """Create the output directory and ``benchmark.json`` (the description, the analysis, the storage
    redacted, the config hash, the commit, the start time, the machine, the data's source and the
    threads of an ``auto`` run); for a benchmark already started, record in it what this worker accepted
    on purpose (an analysis or plugin change) and, for one started before the analysis was fixed or the
    data's source or the threads were recorded, the analysis of this spec, the data's source and this
    worker's threads. ``threads_per_worker``: the cores each worker is given, where they are not this
    machine's share (SLURM tasks). Returns the record as stored."""
    prepared.output_dir.mkdir(parents=True, exist_ok=True)
    analysis = hashed_analysis(prepared.spec.analysis.model_dump(mode="json"))
    stored = read_benchmark_if_any(prepared.output_dir)
    if stored is None:
        record = new_benchmark({
            **prepared.description(), "analysis": analysis, "analysis_in_hash": True, "storage": prepared.redacted,
            "config_hash": prepared.config_hash, "git_commit": provenance.git_commit(), "created": provenance.now(),
            # the machine of the worker that started it (each run.json has its own)
            "environment": provenance.environment(_device(prepared, placement)), "data_source": prepared.data_source,
            "threads_per_worker": _threads_per_worker(prepared, threads_per_worker),
            **({"config_file": prepared.spec.config_file, "command_overrides": prepared.given_overrides}
               if prepared.spec.config_file is not None else {}),
            **({"pretrained_weights": prepared.weights} if prepared.weights else {})})
        write_benchmark(prepared.output_dir, record)
        return record
    changed = False
    if stored.threads_per_worker is None:  # started before they were recorded (each run.json holds its own)
        stored.threads_per_worker, changed = _threads_per_worker(prepared, threads_per_worker), True
    if stored.data_source is None and prepared.data_source:  # started before it was recorded; the same data (hash checked)
        stored.data_source, changed = prepared.data_source, True
    if stored.pretrained_weights is None and prepared.weights:  # started before they were recorded
        stored.pretrained_weights, changed = prepared.weights, True
    if not prepared.analysis_in_hash and stored.declared_analysis() != analysis:  # started before the analysis was fixed
        stored.analysis, changed = StoredAnalysis.model_validate(analysis), True
    if prepared.analysis_change and stored.analysis_in_force() != prepared.analysis_change["analysis"]:
        accepted = AnalysisChange.model_validate({"time": provenance.now(), **prepared.analysis_change})
        stored.analysis_changes_accepted, changed = [*stored.analysis_changes_accepted, accepted], True
    if prepared.plugin_changes:
        accepted_plugins = PluginChange(time=provenance.now(), changes=prepared.plugin_changes,
                                        plugins=plugin_identity(prepared.spec, prepared.plans))
        if accepted_plugins.plugins not in [entry.plugins for entry in stored.plugin_changes_accepted]:
            stored.plugin_changes_accepted, changed = [*stored.plugin_changes_accepted, accepted_plugins], True
    if changed:
        write_benchmark(prepared.output_dir, stored)
    return stored


def track_report(prepared: Prepared, written: Mapping[str, Path]) -> None:
    """With MLflow tracking, the files the report writer returned (``{name: path}``: report.md,
    report.html, the figures report.md links to, the tables), exactly those, and the protocol's own
    record ``benchmark.json`` as artifacts of the benchmark's parent run."""
    settings = next(iter(prepared.plans.values())).config.tracking
    if settings.backend != "mlflow":
        return
    record = read_benchmark(prepared.output_dir)
    paths = list(dict.fromkeys([*map(Path, written.values()), benchmark_path(prepared.output_dir)]))
    tracking.MLflowTracker(settings).report(prepared.output_dir, paths, str(record.config_hash))


def write_search_summary(prepared: Prepared, searches: Mapping[str, MethodSearch]) -> dict[str, SearchResult]:
    """``search.json``: the settings and, per method, the best value and parameters, trial counts (the
    repeated searches, if any, under ``search_repeats``)."""
    searched = {name: search.result() for name, search in searches.items()}

    def summary(names: Iterable[str]) -> dict[str, Any]:
        return {name: {"best_value": r.best_value, "best_params": r.best_params, "completed": r.completed,
                       "failed": r.failed, "pruned": r.pruned, "fold_layout_hash": r.fold_layout_hash,
                       "storage": r.storage} for name, r in searched.items() if name in names}

    repeats = prepared.repeats
    files.write_json(prepared.output_dir / output_layout.SEARCH_FILE, {
        "settings": {**asdict(prepared.search), "storage": prepared.redacted}, "methods": summary(prepared.plans),
        **({"search_repeats": summary(repeats)} if repeats else {}),
    })
    return {name: result for name, result in searched.items() if name in prepared.plans}


def write_summaries(prepared: Prepared, searches: Mapping[str, MethodSearch],
                    reproductions: Mapping[str, MethodReproduction], baselines: Iterable[Baseline]) -> BenchmarkOutcome:
    """``search.json``, ``reproductions.json`` and ``results.json``, all from storage: the schedule's
    searches, reproductions and baselines (none when they were never scheduled)."""
    output_dir = prepared.output_dir
    failed = {name: failed_search_text([trial["user_attrs"].get("fail_reason") for trial in result.trials
                                         if trial["state"] == "FAIL"])
              for name, result in write_search_summary(prepared, searches).items() if result.best_params is None}
    # The reproductions of repeated searches are the report's (read from storage), not the leaderboard's.
    results: dict[str, MethodReproductions] = {name: unit.result() for name, unit in reproductions.items()
                                               if name in prepared.plans}
    for name, result in results.items():
        reasons = [f"reproduction {o.reproduction}: {o.reason}" for o in result.outcomes if o.scores is None]
        if reasons:
            failed[name] = "; ".join(reasons)
    if results:
        files.write_json(output_dir / output_layout.REPRODUCTIONS_FILE, {
            "settings": {**asdict(prepared.reproduction), "storage": prepared.redacted},
            "methods": {name: {"params": r.params, "fold_layout_hash": r.fold_layout_hash,
                               "outcomes": [asdict(o) for o in r.outcomes]} for name, r in results.items()},
        })
    for baseline in baselines:
        results[baseline.kind] = baseline.result()
    files.write_json(output_dir / output_layout.RESULTS_FILE, {
        "methods": {name: {"params": result.params, "fold_layout_hash": result.fold_layout_hash,
                           "outcomes": [asdict(outcome) for outcome in result.outcomes]}
                    for name, result in results.items()},
        "failed": failed,
    })
    return BenchmarkOutcome(output_dir, results, failed)
