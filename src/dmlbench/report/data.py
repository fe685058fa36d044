"""What a report is made of, read from a benchmark's stored studies and ``benchmark.json`` only.

Per method its search trials (objective, parameters, validation curves, cost) and its reproductions
(test scores, validation curves, cost), and the untrained baseline; from them the failures, the
curves' lag-one autocorrelation, the paired comparisons and the seeds' claims (``report.analysis``).
Nothing else is read, so the report is the same whichever worker writes it and on whichever machine.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from dmlbench import provenance
from dmlbench.analysis.correlations import mean_lag_one_autocorrelation
from dmlbench.analysis.statistics import PairedComparison
from dmlbench.analysis.verdicts import LEADERBOARD_METRICS
from dmlbench.errors import UserInputError
from dmlbench.protocol.design.benchmark_file import BenchmarkRecord, read_benchmark
from dmlbench.protocol.layout import BASELINES, SEARCH_REPEAT_MARK, reproduction_study
from dmlbench.protocol.queue import attempts
from dmlbench.protocol.queue import storage as storage_module
from dmlbench.protocol.units.results import MethodReproductions, compared_modes, read_reproductions, stored_class_sums
from dmlbench.protocol.units.search import failed_search_text
from dmlbench.report.analysis import Claims, analyse

CURVE_METRICS = ("precision_at_1", "map_at_r")


@dataclass
class ReportData:
    output_dir: Path
    benchmark: BenchmarkRecord
    methods: list[str]
    trials: dict[str, list[dict[str, Any]]]
    results: dict[str, MethodReproductions] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    curves: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)  # method -> stage -> curves of MAP@R
    autocorrelation: dict[str, dict[str, float]] = field(default_factory=dict)
    comparisons: list[tuple[str, str, list[PairedComparison] | str]] = field(default_factory=list)
    reproduction_costs: dict[str, list[dict[str, Any] | None]] = field(default_factory=dict)
    reproduction_curves: dict[str, list[tuple[int, list[dict[str, list[float]]]]]] = field(default_factory=dict)  # (slot, folds)
    claims: Claims = field(default_factory=Claims)
    report_commit: str | None = None  # read once, before any file is written
    # method -> reproduction seed -> per-class test sums (``analysis.class_bootstrap.class_sums``)
    class_scores: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    # method -> the names of its repeated searches (``METHOD@searchK``); their trials are in ``trials`` and
    # their costs in ``reproduction_costs`` under those names, their reproductions in ``repeat_results``
    repeats: dict[str, list[str]] = field(default_factory=dict)
    repeat_results: dict[str, MethodReproductions] = field(default_factory=dict)


def load_report_data(output_dir: Path, storage: str | None = None) -> ReportData:
    """Read a benchmark from its storage (and ``benchmark.json``); a one-line ``UserInputError`` if
    there is none. Everything comes from the studies, so any worker's directory gives the same report.
    ``storage``: the URL to read (by default the one ``benchmark.json`` records, without password)."""
    output_dir = Path(output_dir)
    benchmark = read_benchmark(output_dir)
    methods = list(benchmark.methods)
    url = storage or benchmark.storage
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    names, opened = storage_module.open_for_reading(url)
    trials = {method: _search_trials(opened, method) if method in names else [] for method in methods}
    if not any(trials.values()):
        raise UserInputError(f"{output_dir} holds no benchmark study (no trials in {storage_module.redact(url)})")
    data = ReportData(output_dir, benchmark, methods, trials)
    for method in [*methods, *BASELINES]:
        if reproduction_study(method) in names:
            _read_reproductions(data, opened, method)
    _read_repeats(data, opened, names)
    for method in methods:
        _note_failure(data, method)
        _curve_statistics(data, method)
    data.claims = analyse(data.results, benchmark.analysis_spec(), data.autocorrelation, computed_metrics(data))
    data.comparisons = _comparisons(data)
    data.report_commit = provenance.git_commit()
    return data


def computed_metrics(data: ReportData) -> list[str]:
    """The metrics the reproductions were scored on (those of the first scored outcome)."""
    for result in data.results.values():
        for outcome in result.outcomes:
            if outcome.scores:
                return list(next(iter(outcome.scores.values())))
    return []


def _search_trials(storage: Any, method: str) -> list[dict[str, Any]]:
    """The search trials that used the budget, one dictionary each, numbered by slot."""
    study = optuna.load_study(study_name=method, storage=storage)
    return [
        {"number": attempts.slot_of(trial), "state": trial.state.name, "value": trial.value, "params": dict(trial.params),
         "interrupted": False, "epochs_run": trial.user_attrs.get("epochs_run"),
         "curves": trial.user_attrs.get("curves", []), "cost": _cost(trial),
         "fail_reason": trial.user_attrs.get("fail_reason")}
        for trial in attempts.counted(study)
    ]


def _cost(trial: FrozenTrial) -> dict[str, Any] | None:
    """A unit's stored cost record with the interval it ran in (``started``, ``completed``: POSIX
    seconds of the storage's clock), for the report's running time; a trial of fold units
    (``protocol.fold_units``) records its folds' interval in its cost, and that one is kept."""
    cost = trial.user_attrs.get("cost")
    if not cost or trial.datetime_start is None or trial.datetime_complete is None:
        return cost
    return {"started": trial.datetime_start.timestamp(), "completed": trial.datetime_complete.timestamp(), **cost}


def _read_reproductions(data: ReportData, storage: Any, method: str) -> None:
    study = optuna.load_study(study_name=reproduction_study(method), storage=storage)
    attrs = study.user_attrs
    result = read_reproductions(study, method, attrs.get("params", {}), attrs.get("fold_layout_hash", ""), data.output_dir)
    if result.outcomes:
        counted = attempts.counted(study)
        data.results[method] = result
        data.reproduction_costs[method] = [_cost(t) for t in counted]
        data.reproduction_curves[method] = [(attempts.slot_of(t), t.user_attrs.get("curves", [])) for t in counted]
        sums = {int(t.user_attrs["seed"]): stored_class_sums(attrs, t) for t in counted if t.state.name == "COMPLETE"}
        data.class_scores[method] = {seed: record for seed, record in sums.items() if record is not None}


def _read_repeats(data: ReportData, storage: Any, names: set[str]) -> None:
    """The repeated searches of ``protocol.search_repeats`` (``METHOD@searchK`` studies) and their reproductions."""
    for method in data.methods:
        pattern = re.compile(re.escape(method + SEARCH_REPEAT_MARK) + "[0-9]+")
        repeats = sorted((name for name in names if pattern.fullmatch(name)), key=lambda name: int(name[len(method + SEARCH_REPEAT_MARK):]))
        for name in repeats:
            data.trials[name] = _search_trials(storage, name)
            if reproduction_study(name) in names:
                study = optuna.load_study(study_name=reproduction_study(name), storage=storage)
                data.repeat_results[name] = read_reproductions(study, name, study.user_attrs.get("params", {}),
                                                               study.user_attrs.get("fold_layout_hash", ""), data.output_dir)
                data.reproduction_costs[name] = [_cost(t) for t in attempts.counted(study)]
        if repeats:
            data.repeats[method] = repeats


def _note_failure(data: ReportData, method: str) -> None:
    """Why a method has no result: no search trial completed, or reproductions that failed."""
    trials = data.trials[method]
    if trials and not any(t["state"] == "COMPLETE" for t in trials):
        data.failed[method] = failed_search_text([t["fail_reason"] for t in trials if t["state"] == "FAIL"])
    result = data.results.get(method)
    reasons = [f"reproduction {o.reproduction}: {o.reason}" for o in result.outcomes if o.scores is None] if result else []
    if reasons:
        data.failed[method] = "; ".join(reasons)


def validation_curves(data: ReportData, method: str) -> list[tuple[str, int, int, dict[str, list[float]]]]:
    """Every validation curve of a method as ``(stage, trial or reproduction, fold, metric -> values)``,
    search trials first; value 0 of a curve is the untrained model's."""
    search = [("search", t["number"], fold, curve) for t in data.trials[method] for fold, curve in enumerate(t["curves"])]
    return search + [("reproduction", slot, fold, curve) for slot, folds in data.reproduction_curves.get(method, [])
                     for fold, curve in enumerate(folds)]


def _curve_statistics(data: ReportData, method: str) -> None:
    """The method's MAP@R validation curves per stage and the mean lag-one autocorrelation of its curves
    (evaluation 0, the untrained model, left out: it is the same start for every run, not noise)."""
    series: dict[str, list[list[float]]] = {metric: [] for metric in CURVE_METRICS}
    curves_of = validation_curves(data, method)
    for _, _, _, curves in curves_of:
        for metric in CURVE_METRICS:
            curve = [float(v) for v in curves.get(metric, [])][1:]
            if len(curve) >= 3:
                series[metric].append(curve)
    data.curves[method] = {stage: [c.get("map_at_r", []) for kind, _, _, c in curves_of if kind == stage]
                           for stage in ("search", "reproduction")}
    data.autocorrelation[method] = {
        metric: mean_lag_one_autocorrelation(curves) if curves else math.nan for metric, curves in series.items()
    }


def _comparisons(data: ReportData) -> list[tuple[str, str, list[PairedComparison] | str]]:
    """The one Holm family of declared comparisons per mode and leaderboard metric (``report.analysis``),
    or why they cannot be compared."""
    return [(mode, metric, data.claims.families[(mode, metric)]) for mode in compared_modes(data.results)
            for metric in LEADERBOARD_METRICS if (mode, metric) in data.claims.families]
