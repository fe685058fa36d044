"""What a benchmark writes beside its studies: ``benchmark.json`` when it starts (and the changes
accepted on purpose when it continues), the summaries ``search.json``, ``reproductions.json`` and
``results.json`` once every unit is done, and, with MLflow tracking, the report's files as artifacts
of the benchmark's parent run. The file names are ``protocol.layout``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dmlbench import files, provenance
from dmlbench.protocol import layout as output_layout
from dmlbench.protocol.baseline import UntrainedBaseline
from dmlbench.protocol.benchmark import analysis_in_force
from dmlbench.protocol.prepare import Prepared, plugin_identity
from dmlbench.protocol.reproductions import MethodReproduction
from dmlbench.protocol.results import MethodReproductions
from dmlbench.protocol.search import MethodSearch, SearchResult
from dmlbench.training import tracking


@dataclass
class BenchmarkOutcome:
    output_dir: Path
    results: dict[str, MethodReproductions]
    failed: dict[str, str] = field(default_factory=dict)


def write_benchmark_file(prepared: Prepared) -> None:
    """Create the output directory and ``benchmark.json`` (the description, the analysis, the storage
    redacted, the config hash, the commit, the start time and the machine); for a benchmark already
    started, record in it what this worker accepted on purpose (an analysis or plugin change) and,
    for one started before the analysis was fixed, the analysis of this spec."""
    prepared.output_dir.mkdir(parents=True, exist_ok=True)
    path = prepared.output_dir / output_layout.BENCHMARK_FILE
    analysis = prepared.spec.analysis.model_dump(mode="json")
    if not path.exists():
        files.write_json(path, {**prepared.description(), "analysis": analysis, "analysis_in_hash": True,
                                  "storage": prepared.redacted, "config_hash": prepared.config_hash,
                                  "git_commit": provenance.git_commit(), "created": provenance.now(),
                                  # the machine of the worker that started it (each run.json has its own)
                                  "environment": provenance.environment()})
        return
    stored = files.read_json(path)
    if not prepared.analysis_in_hash and stored.get("analysis") != analysis:  # started before the analysis was fixed
        stored = {**stored, "analysis": analysis}
        files.write_json(path, stored)
    if prepared.analysis_change and analysis_in_force(stored) != prepared.analysis_change["analysis"]:
        accepted = {"time": provenance.now(), **prepared.analysis_change}
        stored = {**stored, "analysis_changes_accepted": [*stored.get("analysis_changes_accepted", []), accepted]}
        files.write_json(path, stored)
    if prepared.plugin_changes:
        accepted = {"time": provenance.now(), "changes": prepared.plugin_changes,
                    "plugins": plugin_identity(prepared.spec, prepared.plans)}
        if accepted["plugins"] not in [entry["plugins"] for entry in stored.get("plugin_changes_accepted", [])]:
            files.write_json(path, {**stored, "plugin_changes_accepted": [*stored.get("plugin_changes_accepted", []), accepted]})


def track_report(prepared: Prepared, written: Any) -> None:
    """With MLflow tracking, the report files as artifacts of the benchmark's parent run: every file the
    report writer returned (``{name: path}``: report.md, report.html, the PNGs report.md links to, the
    tables) and ``benchmark.json``."""
    settings = next(iter(prepared.plans.values())).config.tracking
    if settings.backend != "mlflow":
        return
    reported = list(written.values()) if isinstance(written, Mapping) else []
    paths = [Path(path) for path in dict.fromkeys([*reported, prepared.output_dir / output_layout.BENCHMARK_FILE])
             if Path(path).is_file()]
    benchmark = files.read_json(prepared.output_dir / output_layout.BENCHMARK_FILE)
    tracking.MLflowTracker(settings).report(prepared.output_dir, paths, benchmark)


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
                    reproductions: Mapping[str, MethodReproduction], baseline: UntrainedBaseline | None) -> BenchmarkOutcome:
    """``search.json``, ``reproductions.json`` and ``results.json``, all from storage: the schedule's
    searches, reproductions and baseline (``None`` when it was never scheduled)."""
    output_dir = prepared.output_dir
    failed = {name: f"no search trial completed ({result.failed} failed)"
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
    if baseline is not None:
        results[output_layout.UNTRAINED] = baseline.result()
    files.write_json(output_dir / output_layout.RESULTS_FILE, {
        "methods": {name: {"params": result.params, "fold_layout_hash": result.fold_layout_hash,
                           "outcomes": [asdict(outcome) for outcome in result.outcomes]}
                    for name, result in results.items()},
        "failed": failed,
    })
    return BenchmarkOutcome(output_dir, results, failed)
