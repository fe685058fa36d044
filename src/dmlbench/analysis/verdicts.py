"""A study's verdicts re-judged from its committed scores by today's rules, and ``comparisons.csv`` as
the report writes it.

The rules are the report's: one Holm family per endpoint (mode, metric) holding every declared
comparison (``endpoints.declared_comparisons``: each method against each reference, then the pairs;
none declared, every pair), reproductions paired by number (each number is one seed for every method;
only the numbers every method scored), better / worse from the Holm-adjusted paired t-test, equivalent
from the Holm-adjusted TOST within the declared margin (``statistics.compare_pairs``,
``PairedComparison.outcome``). A re-ranked mode is compared with its raw self, not in a family.

Those verdicts rest on one search per method: every row says so (``conditional_on_search``) and gives
the largest search SD that would leave it standing (``search_sd_allowance``,
``search_luck.search_sd_allowance``); with ``analysis.search_sd`` declared (a search SD measured by a
pilot with repeated searches) the tests themselves include that much search luck (``assumed_search_sd``). Where the methods' searches were repeated, ``judge_methods``
judges the methods themselves, their searches included (``search_luck``: the same tests on search
means, paired by search index; ``n`` counts searches). Equivalence is read off the 90% interval that
TOST at 5% corresponds to (``equivalence_ci_low`` / ``_high``), a difference off the 95% one."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from scipy import stats

from dmlbench.analysis.endpoints import ALL_MODES, RERANKED_SUFFIX, ScoreTable, common_seeds, declared_comparisons
from dmlbench.analysis.crossed import SEARCH_MEANS_MODEL, CrossedScores, compare_crossed
from dmlbench.analysis.search_luck import search_means, search_sd_allowance
from dmlbench.analysis.spec import AnalysisSpec
from dmlbench.analysis.statistics import DEFAULT_ALPHA, PairedComparison, compare_pairs

# Endpoint (mode, metric) -> its family of declared comparisons.
Families = dict[tuple[str, str], list[PairedComparison]]

# The metrics whose families ``comparisons.csv`` lists (the leaderboard's), in its order.
LEADERBOARD_METRICS = ("precision_at_1", "r_precision", "map_at_r")


@dataclass(frozen=True)
class Row:
    """One comparison as a row of a verdict file: its endpoint (and, in ``claim_comparisons.csv``, its
    family), whether its verdict rests on one search per method (``conditional``), and the alpha it is read at."""

    mode: str
    metric: str
    comparison: PairedComparison
    conditional: bool = True
    alpha: float = DEFAULT_ALPHA
    family: str = ""


def _stored(field: str) -> Callable[[Row], str]:
    return lambda row: repr(getattr(row.comparison, field))


def _allowance(row: Row) -> str:
    """The search SD that would undo the verdict (one search, a decided verdict); empty otherwise."""
    allowance = search_sd_allowance(row.comparison, row.alpha) if row.conditional else None
    return "" if allowance is None else repr(allowance)


# Every cell a verdict file holds, by its column's name: the statistical tests' statistics and p-values are
# declared here once, and each file below lists the columns it writes, in its order.
CELLS: dict[str, Callable[[Row], str]] = {
    "family": lambda row: row.family,
    "mode": lambda row: row.mode,
    "metric": lambda row: row.metric,
    "a": lambda row: row.comparison.a,
    "b": lambda row: row.comparison.b,
    "n": lambda row: str(row.comparison.n),
    "mean_difference": _stored("mean_difference"),
    "difference_ci_low": _stored("difference_low"),
    "difference_ci_high": _stored("difference_high"),
    "t_statistic": _stored("t_statistic"),
    "t_pvalue": _stored("t_pvalue"),
    "t_pvalue_holm": _stored("t_pvalue_holm"),
    "wilcoxon_statistic": _stored("wilcoxon_statistic"),
    "wilcoxon_pvalue": _stored("wilcoxon_pvalue"),
    "wilcoxon_pvalue_holm": _stored("wilcoxon_pvalue_holm"),
    "cohen_dz": _stored("cohen_dz"),
    "tost_pvalue": _stored("tost_pvalue"),
    "tost_pvalue_holm": _stored("tost_pvalue_holm"),
    "equivalence_margin": _stored("margin"),
    "outcome": lambda row: row.comparison.outcome(row.alpha),
    "no_verdict": lambda row: row.comparison.no_verdict,
    "conditional_on_search": lambda row: "true" if row.conditional else "false",
    "search_sd_allowance": _allowance,
    "equivalence_ci_low": lambda row: repr(equivalence_interval(row.comparison, row.alpha)[0]),
    "equivalence_ci_high": lambda row: repr(equivalence_interval(row.comparison, row.alpha)[1]),
    "assumed_search_sd": _stored("search_sd"),
    "model": lambda row: row.comparison.model,
    "df": lambda row: repr(float(row.comparison.degrees_of_freedom)),
}
# What one search per method means for a verdict (``search_luck``), at the end of every verdict file.
SEARCH_COLUMNS = ("conditional_on_search", "search_sd_allowance", "equivalence_ci_low", "equivalence_ci_high",
                  "assumed_search_sd")
COMPARISON_COLUMNS = ("mode", "metric", "a", "b", "n", "mean_difference", "t_statistic", "t_pvalue_holm",
                      "wilcoxon_statistic", "wilcoxon_pvalue_holm", "cohen_dz", "difference_ci_low", "difference_ci_high",
                      "t_pvalue", "wilcoxon_pvalue", "tost_pvalue", "tost_pvalue_holm", "equivalence_margin", "outcome",
                      "no_verdict", *SEARCH_COLUMNS)
# ``method_comparisons.csv`` (searches repeated): the model the method-level test rests on and its degrees of freedom.
METHOD_COLUMNS = (*COMPARISON_COLUMNS, "model", "df")
CLAIM_COLUMNS = ("family", "mode", "metric", "a", "b", "n", "mean_difference", "difference_ci_low",
                 "difference_ci_high", "t_pvalue", "t_pvalue_holm", "wilcoxon_pvalue", "wilcoxon_pvalue_holm", "cohen_dz",
                 "tost_pvalue", "tost_pvalue_holm", "equivalence_margin", "outcome", "no_verdict", *SEARCH_COLUMNS)


def rows_csv(columns: Sequence[str], rows: Iterable[Row]) -> str:
    """A verdict file's text: the header ``columns``, then each row's cells (every float as its repr)."""
    stream = io.StringIO()
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([CELLS[column](row) for column in columns] for row in rows)
    return stream.getvalue()


def judge_methods(scores: Mapping[tuple[str, str], Mapping[str, CrossedScores]], analysis: AnalysisSpec,
                  excluded: Collection[str] = (), shared_seeds: bool = False) -> Families:
    """Every endpoint's declared family judged on the methods, their searches included: ``scores`` holds each
    method's scores by search and reproduction (``(mode, metric) -> method -> search -> reproduction -> score``);
    methods with fewer than two searches are left out. Fresh seeds in every search (``protocol.search_seeds:
    fresh``): the search means are independent, compared paired by search index (``search_luck``); seeds shared
    across searches: the crossed search x seed model (``crossed``)."""
    families: Families = {}
    for endpoint, by_method in sorted(scores.items()):
        kept = {method: by_search for method, by_search in by_method.items()
                if method not in excluded and len(by_search) >= 2}
        if shared_seeds:
            declared = declared_comparisons(analysis.references, analysis.pairs, list(kept))
            families[endpoint] = compare_crossed(kept, declared, analysis.equivalence_margin) if declared else []
            continue
        paired = common_seeds(search_means(kept))
        paired = {method: values for method, values in paired.items() if len(values) >= 2}
        declared = declared_comparisons(analysis.references, analysis.pairs, list(paired))
        families[endpoint] = ([replace(c, model=SEARCH_MEANS_MODEL) for c in compare_pairs(paired, declared, analysis.equivalence_margin)]
                              if declared and len(paired) >= 2 else [])
    return families


def judge_search_means(means: Mapping[tuple[str, str], Mapping[str, Mapping[int, float]]], analysis: AnalysisSpec,
                       excluded: Collection[str] = ()) -> Families:
    """A study that kept only its search means (``search_repeats.csv``) of searches that shared their seeds:
    the comparisons over the means, each without a verdict (their shared seed effects cannot be told from
    the method without the per-seed scores, ``crossed``)."""
    why = ("the searches shared their reproduction seeds and only their means were kept: a verdict about the "
           "method needs the per-seed scores (crossed search x seed model)")
    families: Families = {}
    for endpoint, by_method in sorted(means.items()):
        paired = common_seeds({method: values for method, values in by_method.items() if method not in excluded})
        paired = {method: values for method, values in paired.items() if len(values) >= 2}
        declared = declared_comparisons(analysis.references, analysis.pairs, list(paired))
        families[endpoint] = ([replace(c, no_verdict=why, model=SEARCH_MEANS_MODEL)
                               for c in compare_pairs(paired, declared, analysis.equivalence_margin)]
                              if declared and len(paired) >= 2 else [])
    return families


def equivalence_interval(comparison: PairedComparison, alpha: float = DEFAULT_ALPHA) -> tuple[float, float]:
    """The ``1 - 2 alpha`` t-interval of the mean difference (90% at 5%): TOST at ``alpha`` declares equivalence
    exactly when it lies inside ``±margin`` (Schuirmann 1987); rescaled from the stored 95% interval."""
    df = comparison.degrees_of_freedom
    if df < 1:
        return math.nan, math.nan
    half = float((comparison.difference_high - comparison.difference_low) / 2 * stats.t.ppf(1 - alpha, df) / stats.t.ppf(0.975, df))
    return comparison.mean_difference - half, comparison.mean_difference + half


def judge(scores: ScoreTable, analysis: AnalysisSpec, excluded: Collection[str] = ()) -> Families:
    """Every endpoint's declared family re-judged from ``scores`` (a ``runs.csv`` table) under the analysis
    in force (``references``, ``pairs``, ``equivalence_margin``); ``excluded`` methods (the baselines)
    are never compared. Endpoints in sorted order."""
    families: Families = {}
    for endpoint, stored in sorted(scores.items()):
        paired = common_seeds({method: values for method, values in stored.items() if method not in excluded})
        declared = declared_comparisons(analysis.references, analysis.pairs, list(paired))
        families[endpoint] = (compare_pairs(paired, declared, analysis.equivalence_margin, analysis.search_sd)
                              if declared and len(paired) >= 2 else [])
    return families


def comparison_csv(families: Sequence[tuple[str, str, Sequence[PairedComparison]]], alpha: float = DEFAULT_ALPHA,
                   conditional: bool = True) -> str:
    """``comparisons.csv`` (``conditional``: one search per method) or ``method_comparisons.csv`` (searches
    repeated): one row per comparison of each ``(mode, metric, family)``."""
    return rows_csv(COMPARISON_COLUMNS if conditional else METHOD_COLUMNS, (Row(mode, metric, c, conditional, alpha)
                                         for mode, metric, family in families for c in family))


def rejudged_comparison_csv(scores: ScoreTable, analysis: AnalysisSpec, excluded: Collection[str] = ()) -> str:
    """``comparisons.csv`` of a committed study as the report would write it today from its ``runs.csv``
    alone: the leaderboard metrics' families, modes in the report's order, re-ranked modes left out."""
    families = judge(scores, analysis, excluded)
    listed = [(mode, metric, families[(mode, metric)]) for mode in ALL_MODES if not mode.endswith(RERANKED_SUFFIX)
              for metric in LEADERBOARD_METRICS if families.get((mode, metric))]
    return comparison_csv(listed)
