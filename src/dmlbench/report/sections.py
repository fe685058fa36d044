"""The report as one ordered list of sections, rendered alike as Markdown and as HTML (``report.render``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dmlbench.protocol.statistics import Correlation, PairedComparison
from dmlbench.report import plots, tables
from dmlbench.report.analysis import ALPHA, Claims, ReferenceSummary
from dmlbench.report.data import METRIC_TITLES, ReportData
from dmlbench.report.tables import pvalue_text

TITLE = "dmlbench benchmark report"
Table = tuple[list[str], list[list[str]]]  # header, rows


@dataclass
class Section:
    """A titled part of the report (``title`` None: the part under the page title); paragraphs may
    hold Markdown's inline code spans, which both renderers understand."""

    title: str | None
    paragraphs: list[str] = field(default_factory=list)
    bullets: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[plots.Figure] = field(default_factory=list)


def sections(data: ReportData, figures: list[plots.Figure]) -> list[Section]:
    """The report's sections in the order every rendering shows them."""
    top = Section(None, [provenance(data), (
        "Test classes, mean ± 95% Student-t interval half-width over reproductions (in %); "
        "con. = concatenated fold models, sep. = separated (seed 001 §3.3). "
        "`untrained` is the baseline: the same models before any training step.")])
    if data.results:
        top.tables.append(tables.leaderboard(data))
    else:
        top.paragraphs.append("No reproduction has been scored yet (search stage only).")
    parts = [top]
    if data.failed:
        parts.append(Section("Failed methods", bullets=[f"{name}: {reason}" for name, reason in data.failed.items()]))
    parts += _claim_sections(data.claims)
    if data.comparisons:
        comparisons = Section("Paired comparisons", [tables.COMPARISON_NOTE])
        if tables.all_pairs_shown(data):
            comparisons.tables.append((tables.COMPARISON_HEADER, tables.comparison_rows(data)))
        else:
            comparisons.paragraphs.append(tables.pairs_in_csv(data))
        parts.append(comparisons)
    parts.append(Section("Budget and search", tables=[(tables.BUDGET_HEADER, tables.budget_rows(data))]))
    costs = tables.cost_rows(data)
    if costs:
        parts.append(Section("Cost", [tables.COST_NOTE], tables=[(tables.COST_HEADER, costs)]))
    parts.append(Section("Protocol", tables=[(["parameter", "value"], [list(p) for p in tables.parameters(data)])]))
    parts.append(Section("Plots", figures=figures))
    return parts


def provenance(data: ReportData) -> str:
    b = data.benchmark
    return (f"Benchmark started at git commit `{b.get('git_commit')}` on dataset `{b['dataset']['name']}` "
            f"(content hash `{b['dataset']['content_hash']}`); this report was written by git commit "
            f"`{data.report_commit}` from the stored studies.")


# ---------------------------------------------------------------- the seeds' claims

def _claim_sections(claims: Claims) -> list[Section]:
    parts = []
    if claims.references:
        parts.append(_saturation_section(claims))
    if claims.pairs:
        parts.append(_pairs_section(claims))
    if claims.correlations:
        parts.append(_space_section(claims))
    if any(claims.autocorrelation.values()):
        parts.append(_autocorrelation_section(claims))
    if claims.rankings:
        parts.append(_ranking_section(claims))
    if claims.notes and parts:
        parts.append(Section("Analysis notes", bullets=list(claims.notes)))
    return parts


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
            cell = f"{_difference(c)} p={pvalue_text(c.t_pvalue_holm)}"
            detail.setdefault(c.a, {})[(r.reference, r.metric)] = cell
    detail_rows = [[name] + [cells.get((reference, metric), "-") for reference in references
                             for metric in ("precision_at_1", "map_at_r")] for name, cells in detail.items()]
    return Section("Every method against the references", paragraphs,
                   tables=[(header, summary_rows), (detail_header, detail_rows)])


def _counts(summary: ReferenceSummary) -> str:
    return f"{len(summary.indistinguishable)} / {len(summary.better)} / {len(summary.worse)}"


def _gap(summary: ReferenceSummary, pick: Any) -> str:
    if not summary.comparisons:
        return "-"
    c = pick(summary.comparisons, key=lambda comparison: comparison.mean_difference)
    return f"{c.a} {_difference(c)}"


def _pairs_section(claims: Claims) -> Section:
    rows = [[f"{c.a} − {c.b}", mode, METRIC_TITLES[metric], str(c.n), _difference(c), pvalue_text(c.t_pvalue_holm),
             pvalue_text(c.wilcoxon_pvalue_holm), f"{c.cohen_dz:.2f}"]
            for mode, metric, comparisons in claims.pairs for c in comparisons]
    return Section("Treated against control",
                   ["Paired by reproduction seed; differences in percentage points with their 95% interval; "
                    "Holm across the pairs of each mode and metric."],
                   tables=[(["pair", "mode", "metric", "n", "difference (%)", "paired t p (Holm)", "Wilcoxon p (Holm)", "Cohen's d_z"], rows)])


def _correlation_cell(c: Correlation) -> str:
    return f"{c.estimate:+.2f} [{c.low:+.2f}, {c.high:+.2f}] p={pvalue_text(c.pvalue)}"


def _space_section(claims: Claims) -> Section:
    rows = [[c.quantity, c.mode, c.level, str(c.pearson.n), _correlation_cell(c.pearson), _correlation_cell(c.spearman)]
            for c in claims.correlations]
    return Section("Embedding space against test P@1 (seed 003 §5, Fig. 5)",
                   ["rho (spectral decay, drop 1, no centring) and pi_ratio of each fold model's best checkpoint on its "
                    "own training classes, averaged over the reproduction's fold models, against the reproduction's "
                    "test P@1 (separated: the mean of the same fold models' P@1). Correlation with its 95% percentile "
                    "bootstrap interval (9,999 resamples, seed 0) and p-value. A reproduction's points share their "
                    "method's hyper-parameters, so the run-level points are not independent."],
                   tables=[(["quantity", "test P@1 mode", "points", "n", "Pearson r [95% CI]", "Spearman rho_s [95% CI]"], rows)])


def _autocorrelation_section(claims: Claims) -> Section:
    rows = []
    for metric, values in claims.autocorrelation.items():
        if values:
            rows.append([METRIC_TITLES[metric], str(len(values)), f"{np.mean(values):.2f}",
                         f"{min(values):.2f} .. {max(values):.2f}", {"precision_at_1": "0.73", "map_at_r": "0.81"}[metric]])
    return Section("Lag-one autocorrelation of the validation curves (seed 001 §3.2)",
                   ["Per method the mean over its search and reproduction runs' validation curves (evaluation 0, the "
                    "untrained model, included), then the mean over the methods."],
                   tables=[(["validation metric", "methods", "mean", "range over methods", "seed 001"], rows)])


def _ranking_section(claims: Claims) -> Section:
    rows = []
    for metric, agreement in claims.rankings:
        order = lambda index: [n for n, _ in sorted(agreement.ranks.items(), key=lambda item: item[1][index])][:3]  # noqa: E731
        changed = ", ".join(f"{name} {first}→{second}" for name, (first, second) in agreement.ranks.items()
                            if first != second) or "none"
        rows.append([METRIC_TITLES[metric], f"{agreement.tau:.2f} (p={pvalue_text(agreement.pvalue)})", changed,
                     ", ".join(order(0)), ", ".join(order(1))])
    return Section("Concatenated against separated (seed 001 §3.3)",
                   ["Ranks of the methods' means (1 = best), Kendall's tau between the two rankings."],
                   tables=[(["metric", "Kendall tau", "rank changes (con.→sep.)", "top 3 con.", "top 3 sep."], rows)])
