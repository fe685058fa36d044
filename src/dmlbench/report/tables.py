"""The report's tables, CSV files and LaTeX table, each computed from ``ReportData`` alone."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from dmlbench.analysis.endpoints import CROSS_DOMAIN_SUFFIX, RERANKED_SUFFIX, reranked_mode
from dmlbench.analysis.power import ComparisonPower
from dmlbench.analysis.verdicts import CELLS, CLAIM_COLUMNS, Row, comparison_csv
from dmlbench.evaluation.metrics import metric_title
from dmlbench.protocol import layout
from dmlbench.protocol.design.benchmark import FRESH_SEEDS, SEARCH_SEED_STRIDE
from dmlbench.protocol.design.benchmark_file import BenchmarkRecord, StoredProtocol
from dmlbench.protocol.layout import BASELINES, BENCHMARK_FILE
from dmlbench.protocol.units.results import result_rows, scored_modes
from dmlbench.report.analysis import ALPHA, Claims, scored_methods
from dmlbench.report.data import LEADERBOARD_METRICS, ReportData, computed_metrics, validation_curves


def leaderboard(data: ReportData, primary: tuple[str, str] = ("concatenated", "map_at_r")) -> tuple[list[str], list[list[str]]]:
    """Header and rows: mean ± 95% CI half-width (in %) per method, mode and metric, sorted by the ``primary``
    (mode, metric) mean, highest first (ties by the methods' order), the baseline last; the first marked *best*
    only where the primary endpoint's tests decided it better than every other method (``decided_best``)."""
    rows_by_key = {(row["method"], row["mode"], row["metric"]): row for row in result_rows(data.results)}
    metrics = [metric for metric in LEADERBOARD_METRICS if metric in computed_metrics(data)]
    modes = scored_modes(data.results)  # the cross-domain modes too when evaluation.cross_domain scored them
    header = ["method"] + [f"{metric_title(metric)} ({_mode_title(mode)})" for mode in modes for metric in metrics] + ["n"]
    def primary_mean(method: str) -> float:
        entry = rows_by_key.get((method, *primary))
        return -math.inf if entry is None or method in BASELINES else float(entry["mean"])

    order = sorted(data.results, key=lambda method: (method in BASELINES, -primary_mean(method), list(data.results).index(method)))
    rows = []
    for method in order:
        row = [f"{method} *best*" if method == decided_best(data.claims, order) else method]
        n = 0
        for mode in modes:
            for metric in metrics:
                entry = rows_by_key.get((method, mode, metric))
                row.append(_mean_ci(entry))
                n = max(n, entry["n"] if entry else 0)
        rows.append(row + [str(n)])
    return header, rows


def decided_best(claims: Claims, order: list[str]) -> str | None:
    """The method with the highest primary mean (first of ``order``) where the primary family holds a decided
    "better" verdict of it against every other scored method, else ``None``: a highest mean alone is no verdict."""
    family = claims.families.get(claims.primary)
    methods = [method for method in order if method not in BASELINES]
    if not methods or len(methods) < 2 or not isinstance(family, list):
        return None
    top = methods[0]
    beaten = {c.b if c.a == top else c.a for c in family if top in (c.a, c.b)
              and c.outcome(ALPHA) == ("better" if c.a == top else "worse")}
    return top if beaten >= set(methods[1:]) else None


def _mode_title(mode: str) -> str:
    """``con.``, ``sep.``, ``con. cross-domain``, ``sep. cross-domain``, ``con. re-ranked``, ``sep. re-ranked``."""
    if mode.endswith(CROSS_DOMAIN_SUFFIX):
        return f"{mode[:3]}. cross-domain"
    if mode.endswith(RERANKED_SUFFIX):
        return f"{mode[:3]}. re-ranked"
    return f"{mode[:3]}."


def _mean_ci(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "-"
    mean, high = 100 * entry["mean"], 100 * entry["ci_high"]
    return f"{mean:.2f}" if math.isnan(high) else f"{mean:.2f} ± {high - mean:.2f}"


def comparison_rows(data: ReportData) -> list[list[str]]:
    rows = []
    for mode, metric, comparisons in data.comparisons:
        if isinstance(comparisons, str):
            rows.append([mode, metric_title(metric), comparisons] + [""] * (len(COMPARISON_HEADER) - 3))
            continue
        for c in comparisons:
            rows.append([mode, metric_title(metric), f"{c.a} vs {c.b}", str(c.n), f"{100 * c.mean_difference:+.2f}",
                         pvalue_text(c.t_pvalue_holm), pvalue_text(c.wilcoxon_pvalue_holm), pvalue_text(c.tost_pvalue_holm),
                         c.verdict(ALPHA), f"{c.cohen_dz:.2f}"])
    return rows


RERANK_HEADER = ["mode", "metric", "method", "n", "raw (%)", "re-ranked (%)", "difference (%) [95% CI]",
                 "paired t p (Holm)", "Wilcoxon p (Holm)", "TOST p (Holm)", "outcome", "Cohen's d_z"]


RERANK_NOTE = ("Each method's test scores re-ranked (`evaluation.rerank`, with its fixed parameters or those its search "
               "chose on the validation folds) against the same fold models' raw scores, paired by reproduction; "
               "difference = re-ranked - raw. Holm across the methods of each mode and metric, per test; TOST against "
               "the equivalence margin; the outcome reads *better* when re-ranking helps.")


def rerank_rows(data: ReportData) -> list[list[str]]:
    """One row per mode, metric and method of ``claims.reranking``: the raw and re-ranked means and their paired test."""
    means = {(row["method"], row["mode"], row["metric"]): row["mean"] for row in result_rows(data.results)}
    rows = []
    for mode, metric, comparisons in data.claims.reranking:
        for c in comparisons:
            rows.append([mode, metric_title(metric), c.b, str(c.n), f"{100 * means[(c.b, mode, metric)]:.2f}",
                         f"{100 * means[(c.b, reranked_mode(mode), metric)]:.2f}",
                         f"{100 * c.mean_difference:+.2f} [{100 * c.difference_low:+.2f}, {100 * c.difference_high:+.2f}]",
                         pvalue_text(c.t_pvalue_holm), pvalue_text(c.wilcoxon_pvalue_holm), pvalue_text(c.tost_pvalue_holm),
                         c.verdict(ALPHA), f"{c.cohen_dz:.2f}"])
    return rows


COMPARISON_HEADER = ["mode", "metric", "pair", "n", "mean difference (%)", "paired t p (Holm)",
                     "Wilcoxon p (Holm)", "TOST p (Holm)", "outcome (a vs b)", "Cohen's d_z"]


COMPARISON_NOTE = ("Reproductions paired by seed; Holm correction across the pairs of each mode and metric, "
                   "separately per test; TOST against the equivalence margin; Cohen's d_z of the differences. "
                   f"Raw p-values are in `{layout.COMPARISONS_CSV}`.")


SHOWN_PAIRS = 15  # more pairs than this are left to comparisons.csv: the page stays readable


def all_pairs_shown(data: ReportData) -> bool:
    methods = len(scored_methods(data.results))
    return methods * (methods - 1) // 2 <= SHOWN_PAIRS


def pairs_in_csv(data: ReportData) -> str:
    methods = len(scored_methods(data.results))
    return (f"All {methods * (methods - 1) // 2} pairs of the {methods} methods, per mode and metric, are in "
            f"`{layout.COMPARISONS_CSV}` (Holm across all of them); the sections above compare with the references.")


def pvalue_text(value: float) -> str:
    return "nan" if math.isnan(value) else f"{value:.3g}"


def comparisons_csv(data: ReportData) -> str:
    return comparison_csv([(mode, metric, family) for mode, metric, family in data.comparisons if not isinstance(family, str)], ALPHA)


BUDGET_HEADER = ["method", "trials", "failed / pruned trials", "best val. MAP@R (%)", "best parameters",
                 "reproductions scored", "lag-1 autocorr. val. P@1", "lag-1 autocorr. val. MAP@R"]


def budget_rows(data: ReportData) -> list[list[str]]:
    protocol = data.benchmark.protocol
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
            "-" if best is None else ", ".join(f"{k}={_short(v)}{range_edge(data, method, k, v)}" for k, v in best["params"].items()),
            f"{scored}/{protocol.reproductions}",
            "-" if method not in data.autocorrelation else _r(data.autocorrelation[method]["precision_at_1"]),
            "-" if method not in data.autocorrelation else _r(data.autocorrelation[method]["map_at_r"]),
        ])
    return rows


COST_HEADER = ["method", "trials + reproductions", "training samples seen", "wall hours", "CPU hours",
               "peak memory (MiB)"]


COST_NOTE = ("Summed over the units of work, whichever worker ran them: wall time, CPU time of the worker "
             "process (all its threads) and the worker's peak resident memory (`ru_maxrss`) at the end of "
             "each unit; interrupted attempts are not counted.")


def cost_rows(data: ReportData) -> list[list[str]]:
    """Per method and in total: training runs, samples seen, wall and CPU hours, the largest peak memory."""
    rows = []
    totals = {"units": 0, "samples": 0, "wall": 0.0, "cpu": 0.0, "memory": 0}
    for method, costs in _unit_costs(data).items():
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


def running_time_text(data: ReportData) -> str | None:
    """When the units ran: the first start, the last end, and the time at least one was running (the
    union of their intervals, so the gaps between a resumed benchmark's sessions are left out)."""
    intervals = sorted((c["started"], c["completed"]) for costs in _unit_costs(data).values() for c in costs
                       if "started" in c)
    if not intervals:
        return None
    running, (start, end) = 0.0, intervals[0]
    for begin, finish in intervals[1:]:
        if begin > end:  # a gap in which no unit ran
            running, start = running + end - start, begin
        end = max(end, finish)
    running += end - start
    minutes = round(running / 60)
    return (f"Running time: the units ran from {_utc_minute(intervals[0][0])} to {_utc_minute(end)} UTC, and at least one "
            f"was running during {minutes // 60} h {minutes % 60:02d} min of that (the union of their intervals, so "
            "time in which no unit ran, between the sessions of a resumed benchmark for instance, is left out; "
            "interrupted attempts are not counted, as above).")


def _utc_minute(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M")


def _unit_costs(data: ReportData) -> dict[str, list[dict[str, Any]]]:
    """The cost records of every counted unit, by method in the report's order (search trials and
    reproductions; then the repeated searches and the baselines); methods without one are left out."""
    repeats = [name for names in data.repeats.values() for name in names]  # protocol.search_repeats
    found = {}
    for method in [*data.methods, *repeats, *BASELINES]:
        costs = [t.get("cost") for t in data.trials.get(method, [])] + list(data.reproduction_costs.get(method, []))
        if any(costs):
            found[method] = [cost for cost in costs if cost]
    return found


def _cost_cells(row: dict[str, Any]) -> list[str]:
    return [str(row["units"]), f"{row['samples']:,}", f"{row['wall'] / 3600:.3f}", f"{row['cpu'] / 3600:.3f}",
            f"{row['memory'] / 1024:.0f}"]


def range_edge(data: ReportData, method: str, key: str, value: Any) -> str:
    """`` (range edge)`` when a best value sits on a bound of its search range: the optimum may lie outside."""
    spaces = {m.name: m.search for m in data.benchmark.spec.methods}
    bounds = spaces.get(method, {}).get(key)
    if not isinstance(bounds, dict) or not isinstance(value, (int, float)) or "low" not in bounds:
        return ""
    return " (range edge)" if any(math.isclose(value, bounds[side], rel_tol=1e-9) for side in ("low", "high")) else ""


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _r(value: float) -> str:
    return "n/a (< 3 evaluations)" if math.isnan(value) else f"{value:.2f}"


def parameters(data: ReportData) -> list[tuple[str, str]]:
    """The protocol's settings as ``(parameter, value)`` rows, in words."""
    b = data.benchmark
    protocol = b.protocol
    epochs = protocol.epochs if protocol.epochs is not None else "each method's training.epochs"
    return [
        ("budget per method", (f"{counted(protocol.trials, 'trial')} x {protocol.folds} folds, then "
                               f"{counted(protocol.reproductions, 'reproduction')} x {protocol.folds} folds; "
                               f"at most {epochs} epochs per run")),
        ("folds", f"{protocol.folds} class-disjoint ({protocol.fold_mode}) on the development classes"),
        ("search", (f"{search_sampler(protocol)}; seed {protocol.search_seed}; objective fold-mean "
                    f"validation MAP@R; pruning: {protocol.pruner}")),
        ("early stopping patience", patience_text(b)),
        ("reproduction seeds", f"{protocol.first_seed}..{protocol.first_seed + protocol.reproductions - 1}"
                               + repeated_draws(protocol)),
        ("fold layout hash", b.fold_layout_hash + (" (search 0's)" if protocol.search_repeats > 1 and protocol.resplits else "")),
        ("dataset", f"{b.dataset.name} (content hash {b.dataset.content_hash})"),
        ("git commit", str(b.git_commit)),
        ("overrides", " ".join(b.overrides) or "none"),
        ("storage", b.storage),
        ("parallel trials", str(protocol.parallel_trials)),
        ("frozen-trunk feature cache", "used: the search trained only heads on cached trunk features (one trunk per fold); "
                                       "the reproductions trained full models" if protocol.frozen_trunk else "not used"),
        # Only when on, as benchmark.json records it: the reports of the benchmarks without it are unchanged.
        *([("fold units", ("each fold run of a search trial was a unit of work of its own, taken by any worker "
                           "(protocol.fold_units); the same results as one worker running a trial's folds in turn"))]
          if protocol.fold_units else []),
    ]


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless the count is one ("1 trial", "3 trials")."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


OPTUNA_STARTUP_TRIALS = 10  # n_startup_trials of Optuna's GPSampler and TPESampler when protocol.startup_trials is unset


def search_sampler(protocol: StoredProtocol) -> str:
    """The search's sampler in words: random when every trial of the budget is one of the sampler's
    start-up trials (trial k sees at most k earlier trials, so with start-up >= trials none is modelled)."""
    startup = protocol.startup_trials
    count = OPTUNA_STARTUP_TRIALS if startup is None else int(startup)
    source = f"Optuna's default of {count}" if startup is None else str(count)
    if count >= protocol.trials:
        every = "the one trial is a start-up trial" if protocol.trials == 1 else f"all {protocol.trials} trials are start-up trials"
        return (f"random: {every} of Optuna's {protocol.sampler} sampler ({source} start-up trials), so no trial "
                "was suggested by its model")
    return f"Optuna {protocol.sampler} sampler after {source} random start-up trials"


def repeated_draws(protocol: StoredProtocol) -> str:
    """What the repeated searches draw afresh (``protocol.search_seeds``, ``protocol.resplit_per_search``), as the
    set-up table's seed row says it; "" for one search per method."""
    if protocol.search_repeats < 2:
        return ""
    seeds = (f"; search k adds k x {SEARCH_SEED_STRIDE} to every training seed" if protocol.search_seeds == FRESH_SEEDS
             else "; every search reuses these seeds (method-level verdicts: crossed search x seed model)")
    return seeds + ("; search k >= 1 cuts its own folds" if protocol.resplits else "")


def patience_text(benchmark: BenchmarkRecord) -> str:
    """``protocol.patience`` in words; a run always keeps its best validation checkpoint, which the search
    scores and the reproductions test."""
    patience = benchmark.protocol.patience
    if patience is not None:
        return (f"{patience} validation evaluations without improvement stop a run; the checkpoint of its best "
                "validation evaluation is kept")
    text = ("none: every run trains its fixed number of epochs and the checkpoint of its best validation "
            "evaluation is kept")
    if _sets_own_patience(benchmark):
        # The protocol leaves training.early_stopping_patience alone when unset (protocol.design.plan), so a
        # method's own value still stops its runs.
        text += "; training.early_stopping_patience set in the benchmark's configs still applies"
    return text


def _sets_own_patience(benchmark: BenchmarkRecord) -> bool:
    """Whether the base config, a method or a command-line override sets a patience of its own."""
    key = "training.early_stopping_patience"
    configs = [benchmark.spec.base] + [method.overrides for method in benchmark.spec.methods]
    if any(flat_items(config).get(key) is not None for config in configs):
        return True
    return any(override.split("=")[0].strip() == key for override in benchmark.overrides)


def flat_items(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config mapping as ``{dotted key: value}``; keys that are dotted already stay as they are."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            flat.update(flat_items(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# Labels of the base config keys a reader looks for first, in the order shown; other keys follow as stored.
BASE_LABELS = {
    "data.name": "dataset", "model.trunk": "trunk", "model.options.width": "trunk width",
    "model.pretrained": "pretrained trunk", "model.embedding_dim": "embedding size", "loss.name": "loss",
    "miner.name": "miner", "optimizer.name": "optimiser", "optimizer.lr": "learning rate",
    "optimizer.weight_decay": "weight decay", "optimizer.loss_lr": "learning rate of the loss's parameters",
    "optimizer.schedule": "learning-rate schedule", "sampler.name": "batch sampler",
    "sampler.params.samples_per_class": "samples per class", "training.batch_size": "batch size",
    "training.max_steps_per_epoch": "steps per epoch (at most)", "training.epochs": "epochs",
    "training.eval_every": "validation every (epochs)", "evaluation.metrics": "metrics",
    "evaluation.selection_metric": "checkpoint selection metric", "seed": "seed (replaced per run by the protocol)",
}


def base_rows(data: ReportData) -> list[list[str]]:
    """``setting``, ``config key``, ``value`` of the configuration every method starts from (``spec.base``)."""
    flat = flat_items(data.benchmark.spec.base)
    keys = [key for key in BASE_LABELS if key in flat] + [key for key in flat if key not in BASE_LABELS]
    return [[BASE_LABELS.get(key, key.rsplit(".", 1)[-1].replace("_", " ")), f"`{key}`", _config_value(flat[key])]
            for key in keys]


def method_rows(data: ReportData) -> list[list[str]]:
    """Per method of the stored spec: what it sets over the base, and its searched keys with their ranges."""
    rows = []
    for method in data.benchmark.spec.methods:
        fixed = flat_items(method.overrides)
        searched = method.search
        rows.append([method.name, "; ".join(f"`{key}` = {_config_value(value)}" for key, value in fixed.items()) or "-",
                     "; ".join(f"`{key}`: {search_range(entry)}" for key, entry in searched.items()) or "nothing searched"])
    return rows


def search_range(entry: Any) -> str:
    """One search-space entry (``protocol.design.search_space``) in words: ``low .. high`` (log, step, integer) or its choices."""
    if not isinstance(entry, dict):
        return str(entry)
    if "choices" in entry:
        text = "one of " + ", ".join(_config_value(choice) for choice in entry["choices"])
    else:
        notes = [note for flag, note in ((entry.get("type") == "int", "integers"), (entry.get("log"), "log scale"),
                                         ("step" in entry, f"step {entry.get('step')}")) if flag]
        text = f"{_config_value(entry.get('low'))} .. {_config_value(entry.get('high'))}"
        text += f" ({', '.join(notes)})" if notes else ""
    when = entry.get("when") or {}
    if when:
        text += " when " + " and ".join(f"`{key}` = {_config_value(value)}" for key, value in when.items())
    return text


def _config_value(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(map(_config_value, value))
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def held_out_text(data: ReportData) -> str:
    """The size of the held-out test set and of the development folds, as ``benchmark.json`` stores them."""
    fold_layout = data.benchmark.fold_layout
    if fold_layout is None:
        return "The benchmark stores no fold layout, so the test set's size is unknown here."
    folds = fold_layout.folds
    test_images = (data.benchmark.data_source or {}).get("test_images")
    images = "" if test_images is None else f" ({test_images:,} images)"
    text = (f"Test set: the {len(fold_layout.test_classes)} test classes of `fold_layout.test_classes`{images}, which no "
            "search or training run sees")
    if fold_layout.development_classes and folds:
        text += (f"; the search used the {len(fold_layout.development_classes)} development classes in {len(folds)} folds "
                 f"of {len(folds[0].train_classes)} training and {len(folds[0].val_classes)} validation classes")
    options = (data.benchmark.spec.base.get("data") or {}).get("options", {})
    shown = f" (data options: {', '.join(f'{k}={_config_value(v)}' for k, v in options.items())})" if options else ""
    unknown = "" if test_images is not None else f". The number of test images is not stored in `{BENCHMARK_FILE}`"
    return text + unknown + shown + "."


def data_source_text(data: ReportData) -> str | None:
    """The images per domain and the licences ``benchmark.json`` records for the data (``None``: neither)."""
    source = data.benchmark.data_source or {}
    parts = []
    if source.get("images_per_domain"):
        counts = ", ".join(f"{name} {count:,}" for name, count in source["images_per_domain"].items())
        parts.append(f"Images per domain (the whole dataset): {counts}.")
    if source.get("licences"):
        licences = "; ".join(f"{name}: {licence}" for name, licence in source["licences"].items())
        parts.append(f"Licences, as the dataset's reader states them: {licences}.")
    return " ".join(parts) or None


def latex(data: ReportData) -> str:
    header, rows = leaderboard(data)
    tex = lambda cell: str(cell).replace("_", "\\_").replace("±", "$\\pm$").replace("%", "\\%")  # noqa: E731
    lines = ["% dmlbench benchmark: test metrics in %, mean $\\pm$ 95% CI half-width over reproductions",
             "\\begin{tabular}{l" + "r" * (len(header) - 1) + "}", "\\toprule",
             " & ".join(tex(cell) for cell in header) + " \\\\", "\\midrule"]
    lines += [" & ".join(tex(cell) for cell in row) + " \\\\" for row in rows]
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


CORRELATION_COLUMNS = ("quantity", "test_metric", "mode", "level", "n", "kind", "estimate", "pvalue", "ci_low", "ci_high")


SPACE_COLUMNS = ("method", "reproduction", "seed", "fold", "rho", "pi_intra", "pi_inter", "pi_ratio")


RANKING_COLUMNS = ("metric", "method", "rank_concatenated", "rank_separated")


CURVE_COLUMNS = ("method", "stage", "unit", "fold", "evaluation", "metric", "value")  # evaluation 0: untrained


POWER_COLUMNS = ("mode", "metric", "a", "b", "n", "sd_of_differences", "equivalence_margin", "comparisons",
                 "ttest_power", "ttest_power_holm", "tost_power", "tost_power_holm", "detectable_difference",
                 "reproductions_needed", "outcome_half_margin", "outcome", "outcome_twice_margin")


def _power_values(power: ComparisonPower | None) -> list[Any]:
    """A ``power.csv`` row's power columns (empty where the paired differences had no spread)."""
    if power is None:
        return [""] * 10
    return [power.n, repr(power.sd), repr(power.margin), power.comparisons,
            *(repr(value) for value in (power.ttest, power.ttest_holm, power.tost, power.tost_holm, power.detectable)),
            "" if power.needed is None else power.needed]


def claim_rows(claims: Claims) -> list[list[str]]:
    """The rows of ``claim_comparisons.csv``: every method against each reference, the declared pairs and
    re-ranked against raw, each resting on one search per method (``verdicts.SEARCH_COLUMNS``)."""
    rows = [Row(r.mode, r.metric, c, alpha=ALPHA, family=f"reference:{r.reference}") for r in claims.references for c in r.comparisons]
    rows += [Row(mode, metric, c, alpha=ALPHA, family="pairs") for mode, metric, pair in claims.pairs for c in pair]
    rows += [Row(mode, metric, c, alpha=ALPHA, family="rerank") for mode, metric, pair in claims.reranking for c in pair]
    return [[CELLS[column](row) for column in CLAIM_COLUMNS] for row in rows]


def csv_text(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A CSV file's text: the header, then the rows."""
    stream = io.StringIO()
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    return stream.getvalue()


def claim_csvs(data: ReportData) -> dict[str, str]:
    """``claim_comparisons.csv`` (against the references and the pairs), ``embedding_space.csv`` (every
    fold model's rho and pi on its training classes), ``correlations.csv``, ``rankings.csv``,
    ``validation_curves.csv`` (every run's validation curve, from which the autocorrelation is re-derived),
    ``power.csv`` (the primary family's power at its observed spread and its verdicts at half, the
    chosen and twice the equivalence margin: the report's Power and Sensitivity sections)."""
    claims = data.claims
    space = [[name, outcome.reproduction, outcome.seed, fold, *(repr(values[key]) for key in SPACE_COLUMNS[4:])]
             for name, result in data.results.items() for outcome in result.outcomes
             for fold, values in enumerate(outcome.embedding_space)]
    correlations = [[c.quantity, "precision_at_1", c.mode, c.level, statistic.n, statistic.kind, repr(statistic.estimate),
                     repr(statistic.pvalue), repr(statistic.low), repr(statistic.high)]
                    for c in claims.correlations for statistic in (c.pearson, c.spearman)]
    crossed = {metric: agreement.ranks for metric, agreement in claims.domain_rankings}
    ranking_columns = RANKING_COLUMNS + (("rank_concatenated_cross_domain",) if crossed else ())
    rankings = [[metric, name, first, second, *([crossed[metric][name][1]] if crossed else [])]
                for metric, agreement in claims.rankings for name, (first, second) in agreement.ranks.items()]
    curves = [[name, stage, unit, fold, evaluation, metric, repr(float(value))]
              for name in data.methods for stage, unit, fold, curve in validation_curves(data, name)
              for metric, values in curve.items() if not metric.startswith("num_")  # query counts, not scores
              for evaluation, value in enumerate(values)]
    powers = {(p.a, p.b): p for p in claims.power}
    power = [[*claims.primary, a, b, *_power_values(powers.get((a, b))), low, chosen, high]
             for a, b, low, chosen, high in claims.sensitivity]
    tables = {
        layout.CLAIM_COMPARISONS_CSV: (CLAIM_COLUMNS, claim_rows(claims)),
        layout.EMBEDDING_SPACE_CSV: (SPACE_COLUMNS, space),
        layout.CORRELATIONS_CSV: (CORRELATION_COLUMNS, correlations),
        layout.RANKINGS_CSV: (ranking_columns, rankings),
        layout.VALIDATION_CURVES_CSV: (CURVE_COLUMNS, curves),
        layout.POWER_CSV: (POWER_COLUMNS, power),
    }
    return {name: csv_text(columns, rows) for name, (columns, rows) in tables.items() if rows}
