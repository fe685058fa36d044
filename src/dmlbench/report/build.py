"""Build every report file of a benchmark directory from what is stored there; no training, no test data.

Inputs: ``benchmark.json`` (spec, protocol, fold layout, dataset hash, git commit, the storage URL
without password) and the Optuna studies: per method its search trials (objective, parameters,
validation curves, cost) and its reproductions (test scores, validation curves, cost), and the
untrained baseline. Nothing else is read, so the report is the same whichever worker writes it and
on whichever machine (each worker of a multi-machine benchmark has its own run directories).
Outputs: ``results.csv`` and ``runs.csv`` (``protocol.results.write_results``: the same bytes
whoever writes them), ``comparisons.csv`` (every pair of methods), the claim files of
``report.analysis`` (``claim_comparisons.csv``, ``embedding_space.csv``, ``correlations.csv``,
``rankings.csv``), the figures of ``report.plots`` as PNG files, ``report.md`` (linking them),
``report.html`` (inline CSS, the figures embedded as base64 PNG), ``results.tex`` (booktabs).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dmlbench.errors import UserInputError
from dmlbench.protocol.layout import BENCHMARK_FILE, TEST_ACCESS_FILE, UNTRAINED, reproduction_study
from dmlbench.protocol.results import (
    MODES,
    MethodReproductions,
    compare_reproductions,
    read_reproductions,
    result_rows,
    write_results,
)
from dmlbench.protocol.statistics import Correlation, PairedComparison, mean_lag_one_autocorrelation
from dmlbench.report import plots
from dmlbench.report.analysis import ALPHA, Claims, ReferenceSummary, analyse, scored_methods
from dmlbench.training import records

LEADERBOARD_METRICS = ("precision_at_1", "r_precision", "map_at_r")
METRIC_TITLES = {"precision_at_1": "P@1", "r_precision": "R-Precision", "map_at_r": "MAP@R"}
CURVE_METRICS = ("precision_at_1", "map_at_r")
COMPARISON_COLUMNS = ("mode", "metric", "a", "b", "n", "mean_difference", "t_statistic", "t_pvalue_holm",
                      "wilcoxon_statistic", "wilcoxon_pvalue_holm", "cohen_dz", "difference_ci_low", "difference_ci_high")


@dataclass
class ReportData:
    output_dir: Path
    benchmark: dict[str, Any]
    methods: list[str]
    trials: dict[str, list[dict[str, Any]]]
    results: dict[str, MethodReproductions] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    curves: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)  # method -> stage -> curves of MAP@R
    autocorrelation: dict[str, dict[str, float]] = field(default_factory=dict)
    comparisons: list[tuple[str, str, list[PairedComparison] | str]] = field(default_factory=list)
    reproduction_costs: dict[str, list[dict[str, Any] | None]] = field(default_factory=dict)
    reproduction_curves: dict[str, list[dict[str, list[float]]]] = field(default_factory=dict)
    claims: Claims = field(default_factory=Claims)
    report_commit: str | None = None  # read once, before any file is written


def load_report_data(output_dir: Path, storage: str | None = None) -> ReportData:
    """Read a benchmark from its storage (and ``benchmark.json``); a one-line ``UserInputError`` if
    there is none. Everything comes from the studies, so any worker's directory gives the same report.
    ``storage``: the URL to read (by default the one ``benchmark.json`` records, without password)."""
    import optuna

    from dmlbench.protocol import storage as storage_module
    from dmlbench.protocol import work

    output_dir = Path(output_dir)
    path = output_dir / BENCHMARK_FILE
    if not path.is_file():
        raise UserInputError(f"{output_dir} holds no benchmark study (no {BENCHMARK_FILE})")
    benchmark = records.read_json(path)
    methods = list(benchmark["methods"])
    url = storage or str(benchmark["storage"])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        names = set(storage_module.study_names(url))
        storage = storage_module.open_storage(url)
    except UserInputError:
        raise
    except Exception as error:  # an unreachable or foreign storage
        raise UserInputError(f"storage {storage_module.redact(url)} cannot be read: {storage_module.scrub(str(error).splitlines()[0], url)}") from None
    trials: dict[str, list[dict[str, Any]]] = {}
    data = ReportData(output_dir, benchmark, methods, trials)
    for method in methods:
        if method not in names:
            trials[method] = []
            continue
        study = optuna.load_study(study_name=method, storage=storage)
        trials[method] = [
            {"number": work.slot_of(trial), "state": trial.state.name, "value": trial.value, "params": dict(trial.params),
             "interrupted": False, "epochs_run": trial.user_attrs.get("epochs_run"),
             "curves": trial.user_attrs.get("curves", []), "cost": trial.user_attrs.get("cost")}
            for trial in work.counted(study)
        ]
    if not any(trials.values()):
        raise UserInputError(f"{output_dir} holds no benchmark study (no trials in {storage_module.redact(url)})")
    for method in [*methods, UNTRAINED]:
        name = reproduction_study(method)
        if name not in names:
            continue
        study = optuna.load_study(study_name=name, storage=storage)
        attrs = study.user_attrs
        result = read_reproductions(study, method, attrs.get("params", {}), attrs.get("fold_layout_hash", ""), output_dir)
        if result.outcomes:
            data.results[method] = result
            data.reproduction_costs[method] = [t.user_attrs.get("cost") for t in work.counted(study)]
            data.reproduction_curves[method] = [curve for t in work.counted(study) for curve in t.user_attrs.get("curves", [])]
    for method in methods:
        if not any(t["state"] == "COMPLETE" for t in trials[method]) and trials[method]:
            data.failed[method] = f"no search trial completed ({sum(t['state'] == 'FAIL' for t in trials[method])} failed)"
        result = data.results.get(method)
        reasons = [f"reproduction {o.reproduction}: {o.reason}" for o in result.outcomes if o.scores is None] if result else []
        if reasons:
            data.failed[method] = "; ".join(reasons)
    for method in methods:
        series: dict[str, list[list[float]]] = {metric: [] for metric in CURVE_METRICS}
        search_curves = [curve for t in trials[method] for curve in t["curves"]]
        reproduction_curves = data.reproduction_curves.get(method, [])
        for curve_set in (search_curves, reproduction_curves):
            for curves in curve_set:
                for metric in CURVE_METRICS:
                    curve = [float(v) for v in curves.get(metric, [])]
                    if len(curve) >= 3:
                        series[metric].append(curve)
        data.curves[method] = {"search": [c.get("map_at_r", []) for c in search_curves],
                               "reproduction": [c.get("map_at_r", []) for c in reproduction_curves]}
        data.autocorrelation[method] = {
            metric: mean_lag_one_autocorrelation(curves) if curves else math.nan for metric, curves in series.items()
        }
    scored = list(scored_methods(data.results))
    if len(scored) >= 2:
        for mode in MODES:
            for metric in LEADERBOARD_METRICS:
                if metric not in _computed(data):
                    continue
                try:
                    with warnings.catch_warnings():  # scipy's precision notes on near-identical pairs
                        warnings.simplefilter("ignore", RuntimeWarning)
                        comparisons: list[PairedComparison] | str = compare_reproductions(
                            {name: data.results[name] for name in scored}, mode=mode, metric=metric)
                except UserInputError as error:
                    comparisons = str(error)
                data.comparisons.append((mode, metric, comparisons))
    data.claims = analyse(data.results, benchmark.get("analysis", {}), data.autocorrelation, _computed(data))
    data.report_commit = records.git_commit()
    return data


def _computed(data: ReportData) -> list[str]:
    for result in data.results.values():
        for outcome in result.outcomes:
            if outcome.scores:
                return list(next(iter(outcome.scores.values())))
    return []


def write_report(output_dir: Path, storage: str | None = None, destination: Path | None = None) -> dict[str, Path]:
    """Write every report file of the benchmark in ``output_dir`` (see the module docstring) into
    ``destination`` (default ``output_dir``, e.g. a folder to publish without checkpoints or the
    database); returns their paths."""
    data = load_report_data(output_dir, storage)
    source, output_dir = Path(output_dir), Path(destination or output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise UserInputError(f"report destination {output_dir} is a file, not a directory")
    output_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    if output_dir.resolve() != source.resolve():
        # The records that make a published report checkable: the spec, fold layout and dataset hash,
        # and every opening of the test data.
        for name in (BENCHMARK_FILE, TEST_ACCESS_FILE):
            if (source / name).is_file():
                paths[name] = output_dir / name
                records.atomic_write_text(paths[name], (source / name).read_text())
    if data.results:
        paths["results.csv"], paths["runs.csv"] = write_results(data.results, output_dir)
        paths["comparisons.csv"] = output_dir / "comparisons.csv"
        records.atomic_write_text(paths["comparisons.csv"], _comparisons_csv(data))
        paths["results.tex"] = output_dir / "results.tex"
        records.atomic_write_text(paths["results.tex"], _latex(data))
    for name, text in _claim_csvs(data).items():
        paths[name] = output_dir / name
        records.atomic_write_text(paths[name], text)
    figures = _figures(data)
    for _, name, png in figures:
        paths[name] = output_dir / name
        records.atomic_write(paths[name], lambda stream, png=png: stream.write(png))
    paths["report.md"] = output_dir / "report.md"
    records.atomic_write_text(paths["report.md"], _markdown(data, figures))
    paths["report.html"] = output_dir / "report.html"
    records.atomic_write_text(paths["report.html"], _html(data, figures))
    return paths


# ---------------------------------------------------------------- tables

def _leaderboard(data: ReportData) -> tuple[list[str], list[list[str]]]:
    """Header and rows: mean ± 95% CI half-width (in %) per method, mode and metric; the baseline last."""
    rows_by_key = {(row["method"], row["mode"], row["metric"]): row for row in result_rows(data.results)}
    metrics = [metric for metric in LEADERBOARD_METRICS if metric in _computed(data)]
    header = ["method"] + [f"{METRIC_TITLES[metric]} ({mode[:3]}.)" for mode in MODES for metric in metrics] + ["n"]
    rows = []
    for method in data.results:
        row = [method]
        n = 0
        for mode in MODES:
            for metric in metrics:
                entry = rows_by_key.get((method, mode, metric))
                row.append(_mean_ci(entry))
                n = max(n, entry["n"] if entry else 0)
        rows.append(row + [str(n)])
    return header, rows


def _mean_ci(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "-"
    mean, high = 100 * entry["mean"], 100 * entry["ci_high"]
    return f"{mean:.2f}" if math.isnan(high) else f"{mean:.2f} ± {high - mean:.2f}"


def _comparison_rows(data: ReportData) -> list[list[str]]:
    rows = []
    for mode, metric, comparisons in data.comparisons:
        if isinstance(comparisons, str):
            rows.append([mode, METRIC_TITLES[metric], comparisons, "", "", "", "", "", ""])
            continue
        for c in comparisons:
            rows.append([mode, METRIC_TITLES[metric], f"{c.a} vs {c.b}", str(c.n), f"{100 * c.mean_difference:+.2f}",
                         _p(c.t_pvalue_holm), _p(c.wilcoxon_pvalue_holm), f"{c.cohen_dz:.2f}"])
    return rows


COMPARISON_HEADER = ["mode", "metric", "pair", "n", "mean difference (%)", "paired t p (Holm)",
                     "Wilcoxon p (Holm)", "Cohen's d_z"]


COMPARISON_NOTE = ("Reproductions paired by seed; Holm correction across the pairs of each mode and metric; "
                   "Cohen's d_z of the differences.")
SHOWN_PAIRS = 15  # more pairs than this are left to comparisons.csv: the page stays readable


def _all_pairs_shown(data: ReportData) -> bool:
    methods = len(scored_methods(data.results))
    return methods * (methods - 1) // 2 <= SHOWN_PAIRS


def _pairs_in_csv(data: ReportData) -> str:
    methods = len(scored_methods(data.results))
    return (f"All {methods * (methods - 1) // 2} pairs of the {methods} methods, per mode and metric, are in "
            "`comparisons.csv` (Holm across all of them); the sections above compare with the references.")


def _p(value: float) -> str:
    return "nan" if math.isnan(value) else f"{value:.3g}"


def _comparisons_csv(data: ReportData) -> str:
    stream = io.StringIO()
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(COMPARISON_COLUMNS)
    for mode, metric, comparisons in data.comparisons:
        if isinstance(comparisons, str):
            continue
        for c in comparisons:
            writer.writerow([mode, metric, c.a, c.b, c.n, repr(c.mean_difference), repr(c.t_statistic),
                             repr(c.t_pvalue_holm), repr(c.wilcoxon_statistic), repr(c.wilcoxon_pvalue_holm),
                             repr(c.cohen_dz), repr(c.difference_low), repr(c.difference_high)])
    return stream.getvalue()


def _budget_rows(data: ReportData) -> list[list[str]]:
    protocol = data.benchmark["protocol"]
    rows = []
    for method in data.methods:
        trials = data.trials.get(method, [])
        budgeted = [t for t in trials if t["state"] in ("COMPLETE", "PRUNED", "FAIL")]
        complete = [t for t in trials if t["state"] == "COMPLETE"]
        result = data.results.get(method)
        scored = sum(1 for o in result.outcomes if o.scores) if result else 0
        best = max(complete, key=lambda t: (t["value"], -t["number"])) if complete else None
        rows.append([
            method, str(len(budgeted)),
            f"{sum(t['state'] == 'FAIL' for t in budgeted)} / {sum(t['state'] == 'PRUNED' for t in budgeted)}",
            "-" if best is None else f"{100 * best['value']:.2f}",
            "-" if best is None else ", ".join(f"{k}={_short(v)}{_edge(data, method, k, v)}" for k, v in best["params"].items()),
            f"{scored}/{protocol['reproductions']}",
            "-" if method not in data.autocorrelation else _r(data.autocorrelation[method]["precision_at_1"]),
            "-" if method not in data.autocorrelation else _r(data.autocorrelation[method]["map_at_r"]),
        ])
    return rows


def _cost_rows(data: ReportData) -> list[list[str]]:
    """Per method and in total: training runs, samples seen, wall and CPU hours, the largest peak memory."""
    rows = []
    totals = {"units": 0, "samples": 0, "wall": 0.0, "cpu": 0.0, "memory": 0}
    for method in [*data.methods, UNTRAINED]:
        costs = [t.get("cost") for t in data.trials.get(method, [])] + list(data.reproduction_costs.get(method, []))
        costs = [cost for cost in costs if cost]
        if not costs:
            continue
        row = {"units": len(costs), "samples": sum(c["samples_seen"] for c in costs),
               "wall": sum(c["wall_seconds"] for c in costs), "cpu": sum(c["cpu_seconds"] for c in costs),
               "memory": max(c["peak_memory_kib"] for c in costs)}
        for key in ("units", "samples", "wall", "cpu"):
            totals[key] += row[key]
        totals["memory"] = max(totals["memory"], row["memory"])
        rows.append([method, *_cost_cells(row)])
    if rows:
        rows.append(["total", *_cost_cells(totals)])
    return rows


def _cost_cells(row: dict[str, Any]) -> list[str]:
    return [str(row["units"]), f"{row['samples']:,}", f"{row['wall'] / 3600:.3f}", f"{row['cpu'] / 3600:.3f}",
            f"{row['memory'] / 1024:.0f}"]


COST_HEADER = ["method", "trials + reproductions", "training samples seen", "wall hours", "CPU hours",
               "peak memory (MiB)"]
COST_NOTE = ("Summed over the units of work, whichever worker ran them: wall time, CPU time of the worker "
             "process (all its threads) and the worker's peak resident memory (`ru_maxrss`) at the end of "
             "each unit; interrupted attempts are not counted.")


BUDGET_HEADER = ["method", "trials", "failed / pruned trials", "best val. MAP@R (%)", "best parameters",
                 "reproductions scored", "lag-1 autocorr. val. P@1", "lag-1 autocorr. val. MAP@R"]


def _edge(data: ReportData, method: str, key: str, value: Any) -> str:
    """`` (range edge)`` when a best value sits on a bound of its search range: the optimum may lie outside."""
    spaces = {m["name"]: m.get("search", {}) for m in data.benchmark.get("spec", {}).get("methods", [])}
    bounds = spaces.get(method, {}).get(key)
    if not isinstance(bounds, dict) or not isinstance(value, (int, float)) or "low" not in bounds:
        return ""
    return " (range edge)" if any(math.isclose(value, bounds[side], rel_tol=1e-9) for side in ("low", "high")) else ""


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _r(value: float) -> str:
    return "n/a (< 3 evaluations)" if math.isnan(value) else f"{value:.2f}"


def _parameters(data: ReportData) -> list[tuple[str, str]]:
    b = data.benchmark
    protocol = b["protocol"]
    epochs = protocol["epochs"] if protocol["epochs"] is not None else "each method's training.epochs"
    return [
        ("budget per method", f"{protocol['trials']} trials x {protocol['folds']} folds, then "
                              f"{protocol['reproductions']} reproductions x {protocol['folds']} folds; at most {epochs} epochs per run"),
        ("folds", f"{protocol['folds']} class-disjoint ({protocol['fold_mode']}) on the development classes"),
        ("search", f"Optuna {protocol['sampler']} sampler, seed {protocol['search_seed']}, "
                   f"{_startup(protocol.get('startup_trials'))} random start-up trials, objective fold-mean "
                   f"validation MAP@R, pruning: {protocol.get('pruner', 'none')}"),
        ("early stopping patience", str(protocol["patience"])),
        ("reproduction seeds", f"{protocol['first_seed']}..{protocol['first_seed'] + protocol['reproductions'] - 1}"),
        ("fold layout hash", b["fold_layout_hash"]),
        ("dataset", f"{b['dataset']['name']} (content hash {b['dataset']['content_hash']})"),
        ("git commit", str(b.get("git_commit"))),
        ("overrides", " ".join(b.get("overrides", [])) or "none"),
        ("storage", str(b.get("storage"))),
        ("parallel trials", str(protocol.get("parallel_trials", 1))),
        ("frozen-trunk feature cache", "used: the search trained only heads on cached trunk features (one trunk per fold); "
                                       "the reproductions trained full models" if protocol.get("frozen_trunk") else "not used"),
    ]


def _startup(startup_trials: int | None) -> str:
    return "Optuna's default number of" if startup_trials is None else str(startup_trials)


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    escape = lambda cell: str(cell).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(map(escape, header)) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(map(escape, row)) + " |" for row in rows]
    return lines


def _markdown(data: ReportData, figures: list[plots.Figure]) -> str:
    lines = ["# dmlbench benchmark report", "", _provenance(data), ""]
    lines += ["Test classes, mean ± 95% Student-t interval half-width over reproductions (in %); "
              "con. = concatenated fold models, sep. = separated (seed 001 §3.3). "
              "`untrained` is the baseline: the same models before any training step.", ""]
    if data.results:
        lines += _markdown_table(*_leaderboard(data)) + [""]
    else:
        lines += ["No reproduction has been scored yet (search stage only).", ""]
    if data.failed:
        lines += ["## Failed methods", ""] + [f"- {name}: {reason}" for name, reason in data.failed.items()] + [""]
    for title, paragraphs, tables in _claim_sections(data):
        lines += [f"## {title}", ""]
        for paragraph in paragraphs:
            lines += [paragraph, ""]
        for header, rows in tables:
            lines += _markdown_table(header, rows) + [""]
    if data.comparisons:
        lines += ["## Paired comparisons", "", COMPARISON_NOTE, ""]
        lines += _markdown_table(COMPARISON_HEADER, _comparison_rows(data)) + [""] if _all_pairs_shown(data) else [
            _pairs_in_csv(data), ""]
    lines += ["## Budget and search", ""] + _markdown_table(BUDGET_HEADER, _budget_rows(data)) + [""]
    if _cost_rows(data):
        lines += ["## Cost", "", COST_NOTE, ""] + _markdown_table(COST_HEADER, _cost_rows(data)) + [""]
    lines += ["## Protocol", ""] + _markdown_table(["parameter", "value"], [list(p) for p in _parameters(data)]) + [""]
    lines += ["## Plots", ""] + [f"![{title}]({name})\n" for title, name, _ in figures]
    return "\n".join(lines).rstrip("\n") + "\n"


def _provenance(data: ReportData) -> str:
    b = data.benchmark
    return (f"Benchmark started at git commit `{b.get('git_commit')}` on dataset `{b['dataset']['name']}` "
            f"(content hash `{b['dataset']['content_hash']}`); this report was written by git commit "
            f"`{data.report_commit}` from the stored studies.")


def _latex(data: ReportData) -> str:
    header, rows = _leaderboard(data)
    tex = lambda cell: str(cell).replace("_", "\\_").replace("±", "$\\pm$").replace("%", "\\%")  # noqa: E731
    lines = ["% dmlbench benchmark: test metrics in %, mean $\\pm$ 95% CI half-width over reproductions",
             "\\begin{tabular}{l" + "r" * (len(header) - 1) + "}", "\\toprule",
             " & ".join(tex(cell) for cell in header) + " \\\\", "\\midrule"]
    lines += [" & ".join(tex(cell) for cell in row) + " \\\\" for row in rows]
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- HTML and plots

CSS = """body{font-family:system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;margin:1rem 0;font-size:.9rem}th,td{border-bottom:1px solid #ccc;padding:.3rem .6rem;text-align:right}
th:first-child,td:first-child{text-align:left}th{border-bottom:2px solid #444}img{max-width:100%}code{background:#f3f3f3}"""


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(str(cell))}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _html(data: ReportData, figures: list[plots.Figure]) -> str:
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>dmlbench benchmark report</title>",
             f"<style>{CSS}</style></head><body><h1>dmlbench benchmark report</h1>",
             f"<p>{_inline_html(_provenance(data))}</p>",
             "<p>Test classes, mean ± 95% Student-t interval half-width over reproductions (in %); con. = concatenated, "
             "sep. = separated (seed 001 §3.3); <code>untrained</code> is the baseline.</p>"]
    if data.results:
        parts.append(_html_table(*_leaderboard(data)))
    if data.failed:
        parts.append("<h2>Failed methods</h2><ul>" + "".join(
            f"<li>{html.escape(name)}: {html.escape(reason)}</li>" for name, reason in data.failed.items()) + "</ul>")
    for title, paragraphs, tables in _claim_sections(data):
        parts.append(f"<h2>{html.escape(title)}</h2>")
        parts += [f"<p>{_inline_html(paragraph)}</p>" for paragraph in paragraphs]
        parts += [_html_table(header, rows) for header, rows in tables]
    if data.comparisons:
        parts.append(f"<h2>Paired comparisons</h2><p>{html.escape(COMPARISON_NOTE)}</p>")
        parts.append(_html_table(COMPARISON_HEADER, _comparison_rows(data)) if _all_pairs_shown(data)
                     else f"<p>{_inline_html(_pairs_in_csv(data))}</p>")
    parts.append("<h2>Budget and search</h2>" + _html_table(BUDGET_HEADER, _budget_rows(data)))
    if _cost_rows(data):
        parts.append(f"<h2>Cost</h2><p>{html.escape(COST_NOTE)}</p>" + _html_table(COST_HEADER, _cost_rows(data)))
    parts.append("<h2>Protocol</h2>" + _html_table(["parameter", "value"], [list(p) for p in _parameters(data)]))
    parts.append("<h2>Plots</h2>")
    for title, _, png in figures:
        image = base64.b64encode(png).decode()
        parts.append(f"<h3>{html.escape(title)}</h3><img alt='{html.escape(title)}' src='data:image/png;base64,{image}'>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _inline_html(text: str) -> str:
    """Markdown's inline code spans as ``<code>``, everything else escaped."""
    pieces = html.escape(text).split("`")
    return "".join(f"<code>{piece}</code>" if index % 2 else piece for index, piece in enumerate(pieces))


def _figures(data: ReportData) -> list[plots.Figure]:
    figures = [plots.search_figure(data.methods, data.trials),
               plots.curves_figure(data.methods, {m: c.get("reproduction", []) for m, c in data.curves.items()})]
    metrics = [metric for metric in ("precision_at_1", "map_at_r") if metric in _computed(data)]
    rows = result_rows(data.results)
    if rows and metrics:
        references = list(data.benchmark.get("analysis", {}).get("references", []))
        figures.append(plots.forest_figure(rows, metrics, METRIC_TITLES, references))
    if data.claims.points:
        figures.append(plots.space_figure(data.claims.points))
    return figures


# ---------------------------------------------------------------- the seeds' claims

CLAIM_COLUMNS = ("family", "mode", "metric", "a", "b", "n", "mean_difference", "difference_ci_low",
                 "difference_ci_high", "t_pvalue", "t_pvalue_holm", "wilcoxon_pvalue", "wilcoxon_pvalue_holm", "cohen_dz")
CORRELATION_COLUMNS = ("quantity", "test_metric", "mode", "level", "n", "kind", "estimate", "pvalue", "ci_low", "ci_high")
SPACE_COLUMNS = ("method", "reproduction", "seed", "fold", "rho", "pi_intra", "pi_inter", "pi_ratio")
RANKING_COLUMNS = ("metric", "method", "rank_concatenated", "rank_separated")


def _claim_csvs(data: ReportData) -> dict[str, str]:
    """``claim_comparisons.csv`` (against the references and the pairs), ``embedding_space.csv`` (every
    fold model's rho and pi on its training classes), ``correlations.csv``, ``rankings.csv``."""
    claims = data.claims
    comparisons = [(f"reference:{r.reference}", r.mode, r.metric, c) for r in claims.references for c in r.comparisons]
    comparisons += [("pairs", mode, metric, c) for mode, metric, pair in claims.pairs for c in pair]
    space = [[name, outcome.reproduction, outcome.seed, fold, *(repr(values[key]) for key in SPACE_COLUMNS[4:])]
             for name, result in data.results.items() for outcome in result.outcomes
             for fold, values in enumerate(outcome.embedding_space)]
    correlations = [[c.quantity, "precision_at_1", c.mode, c.level, statistic.n, statistic.kind, repr(statistic.estimate),
                     repr(statistic.pvalue), repr(statistic.low), repr(statistic.high)]
                    for c in claims.correlations for statistic in (c.pearson, c.spearman)]
    rankings = [[metric, name, first, second] for metric, agreement in claims.rankings
                for name, (first, second) in agreement.ranks.items()]
    tables = {
        "claim_comparisons.csv": (CLAIM_COLUMNS, [
            [family, mode, metric, c.a, c.b, c.n, *(repr(value) for value in (
                c.mean_difference, c.difference_low, c.difference_high, c.t_pvalue, c.t_pvalue_holm,
                c.wilcoxon_pvalue, c.wilcoxon_pvalue_holm, c.cohen_dz))] for family, mode, metric, c in comparisons]),
        "embedding_space.csv": (SPACE_COLUMNS, space),
        "correlations.csv": (CORRELATION_COLUMNS, correlations),
        "rankings.csv": (RANKING_COLUMNS, rankings),
    }
    texts = {}
    for name, (columns, rows) in tables.items():
        if not rows:
            continue
        stream = io.StringIO()
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
        texts[name] = stream.getvalue()
    return texts


Section = tuple[str, list[str], list[tuple[list[str], list[list[str]]]]]  # title, paragraphs, tables


def _claim_sections(data: ReportData) -> list[Section]:
    claims = data.claims
    sections = []
    if claims.references:
        sections.append(_saturation_section(claims))
    if claims.pairs:
        sections.append(_pairs_section(claims))
    if claims.correlations:
        sections.append(_space_section(claims))
    if any(claims.autocorrelation.values()):
        sections.append(_autocorrelation_section(claims))
    if claims.rankings:
        sections.append(_ranking_section(claims))
    if claims.notes and sections:
        sections.append(("Analysis notes", ["\n".join(f"- {note}" for note in claims.notes)], []))
    return sections


def _difference(c: PairedComparison) -> str:
    interval = "" if math.isnan(c.difference_low) else f" [{100 * c.difference_low:+.2f}, {100 * c.difference_high:+.2f}]"
    return f"{100 * c.mean_difference:+.2f}{interval}"


def _saturation_section(claims: Claims) -> Section:
    references = list(dict.fromkeys(r.reference for r in claims.references))
    paragraphs = [
        f"Every method against {' and '.join(f'`{r}`' for r in references)}, paired by reproduction seed; "
        f"differences in percentage points with their 95% interval; *indistinguishable* = Holm-adjusted "
        f"paired t-test p ≥ {ALPHA} (Holm across the methods compared with one reference, per mode and "
        "metric). With 5 or fewer pairs the Wilcoxon test cannot go below p = 0.0625, so it is reported "
        "in `claim_comparisons.csv` but does not decide."]
    summary_rows = []
    for mode, metric in dict.fromkeys((r.mode, r.metric) for r in claims.references):
        group = [r for r in claims.references if (r.mode, r.metric) == (mode, metric)]
        others = [c.a for c in group[0].comparisons if c.a not in references]
        alike = [name for name in others if all(name in r.indistinguishable for r in group)]
        summary_rows.append([mode, METRIC_TITLES[metric], str(len(others)), str(len(alike)),
                             *(_counts(r) for r in group),
                             " / ".join(_gap(r, max) for r in group), " / ".join(_gap(r, min) for r in group)])
    header = (["mode", "metric", "methods (not references)", "indistinguishable from every reference"]
              + [f"vs {r}: alike / better / worse" for r in references]
              + ["largest difference (per reference)", "most negative difference (per reference)"])
    detail_header = ["method"] + [f"{METRIC_TITLES[metric]} (con.) − {reference}" for reference in references
                                  for metric in ("precision_at_1", "map_at_r")]
    detail = {}
    for r in claims.references:
        if r.mode != "concatenated":
            continue
        for c in r.comparisons:
            cell = f"{_difference(c)} p={_p(c.t_pvalue_holm)}"
            detail.setdefault(c.a, {})[(r.reference, r.metric)] = cell
    detail_rows = [[name] + [cells.get((reference, metric), "-") for reference in references
                             for metric in ("precision_at_1", "map_at_r")] for name, cells in detail.items()]
    return ("Every method against the references", paragraphs,
            [(header, summary_rows), (detail_header, detail_rows)])


def _counts(summary: ReferenceSummary) -> str:
    return f"{len(summary.indistinguishable)} / {len(summary.better)} / {len(summary.worse)}"


def _gap(summary: ReferenceSummary, pick: Any) -> str:
    if not summary.comparisons:
        return "-"
    c = pick(summary.comparisons, key=lambda comparison: comparison.mean_difference)
    return f"{c.a} {_difference(c)}"


def _pairs_section(claims: Claims) -> Section:
    rows = [[f"{c.a} − {c.b}", mode, METRIC_TITLES[metric], str(c.n), _difference(c), _p(c.t_pvalue_holm),
             _p(c.wilcoxon_pvalue_holm), f"{c.cohen_dz:.2f}"]
            for mode, metric, comparisons in claims.pairs for c in comparisons]
    return ("Treated against control",
            ["Paired by reproduction seed; differences in percentage points with their 95% interval; "
             "Holm across the pairs of each mode and metric."],
            [(["pair", "mode", "metric", "n", "difference (%)", "paired t p (Holm)", "Wilcoxon p (Holm)", "Cohen's d_z"], rows)])


def _correlation_cell(c: Correlation) -> str:
    return f"{c.estimate:+.2f} [{c.low:+.2f}, {c.high:+.2f}] p={_p(c.pvalue)}"


def _space_section(claims: Claims) -> Section:
    rows = [[c.quantity, c.mode, c.level, str(c.pearson.n), _correlation_cell(c.pearson), _correlation_cell(c.spearman)]
            for c in claims.correlations]
    return ("Embedding space against test P@1 (seed 003 §5, Fig. 5)",
            ["rho (spectral decay, drop 1, no centring) and pi_ratio of each fold model's best checkpoint on its "
             "own training classes, averaged over the reproduction's fold models, against the reproduction's "
             "test P@1 (separated: the mean of the same fold models' P@1). Correlation with its 95% percentile "
             "bootstrap interval (9,999 resamples, seed 0) and p-value. A reproduction's points share their "
             "method's hyper-parameters, so the run-level points are not independent."],
            [(["quantity", "test P@1 mode", "points", "n", "Pearson r [95% CI]", "Spearman rho_s [95% CI]"], rows)])


def _autocorrelation_section(claims: Claims) -> Section:
    rows = []
    for metric, values in claims.autocorrelation.items():
        if values:
            rows.append([METRIC_TITLES[metric], str(len(values)), f"{np.mean(values):.2f}",
                         f"{min(values):.2f} .. {max(values):.2f}", {"precision_at_1": "0.73", "map_at_r": "0.81"}[metric]])
    return ("Lag-one autocorrelation of the validation curves (seed 001 §3.2)",
            ["Per method the mean over its search and reproduction runs' validation curves (evaluation 0, the "
             "untrained model, included), then the mean over the methods."],
            [(["validation metric", "methods", "mean", "range over methods", "seed 001"], rows)])


def _ranking_section(claims: Claims) -> Section:
    rows = []
    for metric, agreement in claims.rankings:
        order = lambda index: [n for n, _ in sorted(agreement.ranks.items(), key=lambda item: item[1][index])][:3]  # noqa: E731
        changed = ", ".join(f"{name} {first}→{second}" for name, (first, second) in agreement.ranks.items()
                            if first != second) or "none"
        rows.append([METRIC_TITLES[metric], f"{agreement.tau:.2f} (p={_p(agreement.pvalue)})", changed,
                     ", ".join(order(0)), ", ".join(order(1))])
    return ("Concatenated against separated (seed 001 §3.3)",
            ["Ranks of the methods' means (1 = best), Kendall's tau between the two rankings."],
            [(["metric", "Kendall tau", "rank changes (con.→sep.)", "top 3 con.", "top 3 sep."], rows)])


