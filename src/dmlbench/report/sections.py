"""The report as one ordered list of sections, rendered alike as Markdown and as HTML (``report.render``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dmlbench.protocol.layout import UNTRAINED
from dmlbench.protocol.results import result_rows
from dmlbench.protocol.statistics import OUTCOMES, Correlation, PairedComparison
from dmlbench.report import plots, tables
from dmlbench.report.analysis import ALPHA, Claims, ReferenceSummary, scored_methods
from dmlbench.report.data import METRIC_TITLES, ReportData
from dmlbench.report.tables import pvalue_text

TITLE = "dmlbench benchmark report"
Table = tuple[list[str], list[list[str]]]  # header, rows


@dataclass
class Section:
    """A titled part of the report (``title`` None: the part under the page title); paragraphs, bullets
    and table cells may hold Markdown's inline code spans and ``*emphasis*``, which both renderers understand."""

    title: str | None
    paragraphs: list[str] = field(default_factory=list)
    bullets: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[plots.Figure] = field(default_factory=list)


def sections(data: ReportData, figures: list[plots.Figure]) -> list[Section]:
    """The report's sections in the order every rendering shows them."""
    summary = summary_section(data)
    top = Section(None, [provenance(data)])
    board = Section("Results" if summary else None, [(
        "Test classes, mean ± 95% Student-t interval half-width over reproductions (in %); "
        "con. = concatenated fold models, sep. = separated (seed 001 §3.3). "
        "`untrained` is the baseline: the same models before any training step.")])
    if data.results:
        board.tables.append(tables.leaderboard(data))
    else:
        board.paragraphs.append("No reproduction has been scored yet (search stage only).")
    parts = [top, summary, board] if summary else [top, board]
    if data.failed:
        parts.append(Section("Failed methods", bullets=[f"{name}: {reason}" for name, reason in data.failed.items()]))
    # The figures right under the numbers they show, before the long tables of the claims.
    parts.append(Section("Plots", figures=figures))
    parts.append(setup_section(data))
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
    return parts


def setup_section(data: ReportData) -> Section:
    """What the methods were trained with: the test set's size, why the untrained row does not depend
    on the mode, the shared base config and each method's settings and search ranges."""
    part = Section("Set-up", [tables.held_out_text(data)])
    if UNTRAINED in data.results:
        k = data.benchmark["protocol"]["folds"]
        part.paragraphs.append(
            f"The `untrained` row is the same in both modes: the {k} fold models of an untrained reproduction are "
            "built with the same seed (the reproduction's), and the folds differ only in their training and "
            f"validation classes, which an untrained model has not seen, so they are {k} copies of one network. "
            f"Concatenating {k} copies of one L2-normalised embedding scales every distance by the same factor "
            f"(√{k}) and changes no ranking of neighbours, and the mean of {k} equal scores is that score.")
    base = tables.base_rows(data)
    if base:
        overrides = " ".join(f"`{o}`" for o in data.benchmark.get("overrides", []))
        part.paragraphs.append("The configuration every method starts from (`spec.base`); a method's settings in the "
                               "second table replace its keys, and the protocol sets each run's seed, epochs, patience "
                               "and classes. Keys not listed take the config defaults of the benchmark's git commit."
                               + (f" Command-line overrides for every method: {overrides}." if overrides else ""))
        part.tables.append((["setting", "config key", "value"], base))
    methods = tables.method_rows(data)
    if methods:
        part.tables.append((["method", "set for the method", "searched (range)"], methods))
    return part


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


def _outcome_rule(claims: Claims) -> str:
    points = f"{100 * claims.margin:g} percentage point{'s' if claims.margin != 0.01 else ''}"
    return (f"*better* / *worse*: Holm-adjusted paired t-test p < {ALPHA}; *equivalent*: not better or worse and the "
            f"two one-sided tests (TOST) put the mean difference within ±{points} (`analysis.equivalence_margin`), "
            f"Holm-adjusted p < {ALPHA}; *inconclusive*: neither, so the data can tell the methods neither apart "
            "nor alike.")


def _saturation_section(claims: Claims) -> Section:
    references = list(dict.fromkeys(r.reference for r in claims.references))
    paragraphs = [
        f"Every method against {' and '.join(f'`{r}`' for r in references)}, paired by reproduction seed; "
        "differences in percentage points with their 95% interval. " + _outcome_rule(claims) + " Holm's correction "
        "runs over the methods compared with one reference, per mode and metric (t-test and TOST separately); "
        "statements pooled over references, modes or metrics are not corrected again. With 5 or fewer pairs "
        "the Wilcoxon test cannot go below p = 0.0625, so it is reported in `claim_comparisons.csv` but does not decide."]
    header = ["mode", "metric", "reference", "methods", *OUTCOMES, "the other references", "largest difference", "most negative difference"]
    rows = []
    for r in claims.references:
        others = [c.a for c in r.comparisons if c.a not in references]
        rows.append([r.mode, METRIC_TITLES[r.metric], r.reference, str(len(others)),
                     *(str(len(r.methods(outcome, among=others))) for outcome in OUTCOMES),
                     ", ".join(f"{c.a}: {c.outcome(ALPHA)}" for c in r.comparisons if c.a in references) or "-",
                     _gap(r, max), _gap(r, min)])
    detail_header = ["method"] + [f"{METRIC_TITLES[metric]} (con.) − {reference}" for reference in references
                                  for metric in ("precision_at_1", "map_at_r")]
    detail: dict[str, dict[tuple[str, str], str]] = {}
    for r in claims.references:
        if r.mode != "concatenated":
            continue
        for c in r.comparisons:
            detail.setdefault(c.a, {})[(r.reference, r.metric)] = f"{_difference(c)} {c.outcome(ALPHA)}"
    detail_rows = [[name] + [cells.get((reference, metric), "-") for reference in references
                             for metric in ("precision_at_1", "map_at_r")] for name, cells in detail.items()]
    return Section("Every method against the references", paragraphs,
                   tables=[(header, rows), (detail_header, detail_rows)])


def _gap(summary: ReferenceSummary, pick: Any) -> str:
    if not summary.comparisons:
        return "-"
    c = pick(summary.comparisons, key=lambda comparison: comparison.mean_difference)
    return f"{c.a} {_difference(c)}"


def summary_section(data: ReportData) -> Section | None:
    """The page's first words: who is ahead of, level with and behind each reference, in plain language."""
    claims = data.claims
    concatenated = [r for r in claims.references if r.mode == "concatenated" and r.comparisons]
    if not concatenated:
        return None
    n = concatenated[0].comparisons[0].n
    references = list(dict.fromkeys(r.reference for r in concatenated))
    bullets = []
    for r in concatenated:
        others = [c.a for c in r.comparisons if c.a not in references]
        verdicts = "; ".join(f"{label}: {', '.join(names) if names else 'none'}" for label, names in (
            ("better", r.methods("better", others)), ("equivalent", r.methods("equivalent", others)),
            ("worse", r.methods("worse", others)), ("inconclusive", r.methods("inconclusive", others))))
        bullets.append(f"Against `{r.reference}` on {METRIC_TITLES[r.metric]}: {verdicts}.")
    leaders = [f"{METRIC_TITLES[metric]}: `{name}` {100 * mean:.2f}%" for metric, name, mean in _leaders(data)]
    paragraphs = [
        f"{len(scored_methods(data.results))} methods, {n} reproductions each paired by seed, scored on the test "
        f"classes (concatenated fold models). Highest mean — {'; '.join(leaders)}. " + _outcome_rule(claims),
        "Each line below is one family of Holm's correction; the lines together are not corrected again. "
        "The separated mode, the treated-control pairs and every p-value follow below and in `claim_comparisons.csv`."]
    return Section("Summary", paragraphs, bullets=bullets)


def _leaders(data: ReportData) -> list[tuple[str, str, float]]:
    means: dict[str, dict[str, float]] = {}
    for row in result_rows(scored_methods(data.results)):
        if row["mode"] == "concatenated" and row["metric"] in ("precision_at_1", "map_at_r"):
            means.setdefault(row["metric"], {})[row["method"]] = row["mean"]
    return [(metric, *max(values.items(), key=lambda item: item[1])) for metric, values in means.items()]


def _pairs_section(claims: Claims) -> Section:
    rows = [[f"{c.a} − {c.b}", mode, METRIC_TITLES[metric], str(c.n), _difference(c), pvalue_text(c.t_pvalue),
             pvalue_text(c.t_pvalue_holm), pvalue_text(c.tost_pvalue_holm), c.outcome(ALPHA), f"{c.cohen_dz:.2f}"]
            for mode, metric, comparisons in claims.pairs for c in comparisons]
    return Section("Treated against control",
                   ["Paired by reproduction seed; differences in percentage points with their 95% interval; "
                    "Holm across the pairs of each mode and metric. " + _outcome_rule(claims)],
                   tables=[(["pair", "mode", "metric", "n", "difference (%)", "paired t p", "paired t p (Holm)",
                             "TOST p (Holm)", "outcome", "Cohen's d_z"], rows)])


def _correlation_cell(c: Correlation) -> str:
    test = "" if math.isnan(c.pvalue) else f" p={pvalue_text(c.pvalue)}"
    return f"{c.estimate:+.2f} [{c.low:+.2f}, {c.high:+.2f}]{test}"


def _space_section(claims: Claims) -> Section:
    rows = [[c.quantity, c.mode, c.level, str(c.pearson.n), _correlation_cell(c.pearson), _correlation_cell(c.spearman)]
            for c in claims.correlations]
    return Section("Embedding space against test P@1 (seed 003 §5, Fig. 5)",
                   ["rho (spectral decay, drop 1, no centring) and pi_ratio of each fold model's best checkpoint on its "
                    "own training classes, averaged over the reproduction's fold models, against the reproduction's "
                    "test P@1 (separated: the mean of the same fold models' P@1). Correlation with its 95% percentile "
                    "bootstrap interval (9,999 resamples, seed 0) at three levels: *method means* (one point per "
                    "method, as seed 003's Fig. 5), *within methods* (each reproduction centred on its method's mean: "
                    "the seed-to-seed relation, p-value with n − methods − 1 degrees of freedom) and all "
                    "*reproductions* pooled. The pooled points mix the two relations and share their method's "
                    "hyper-parameters, so they are not independent: that row is a description and has no p-value."],
                   tables=[(["quantity", "test P@1 mode", "points", "n", "Pearson r [95% CI]", "Spearman rho_s [95% CI]"], rows)])


def _autocorrelation_section(claims: Claims) -> Section:
    rows = []
    for metric, values in claims.autocorrelation.items():
        if values:
            rows.append([METRIC_TITLES[metric], str(len(values)), f"{np.mean(values):.2f}",
                         f"{min(values):.2f} .. {max(values):.2f}", {"precision_at_1": "0.73", "map_at_r": "0.81"}[metric]])
    return Section("Lag-one autocorrelation of the validation curves (seed 001 §3.2)",
                   ["Of each run's validation curve without evaluation 0 (the untrained model), around its "
                    "least-squares line: r1 = Σ_t (e_t − ē)(e_{t+1} − ē) / Σ_t (e_t − ē)², e the residuals of the line. "
                    "Seed 001 gives no formula; a correlation of the curve with itself shifted measures its rise (a "
                    "straight line gives 1), this one the fluctuation that makes choosing a checkpoint hard. A "
                    "curve that rises and levels off still leaves curvature in e, which raises r1 for every metric "
                    "alike, so compare the metrics, not the numbers with seed 001's. Per method the mean over its "
                    "search and reproduction runs, then the mean over the methods; every curve is in "
                    "`validation_curves.csv`."],
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
