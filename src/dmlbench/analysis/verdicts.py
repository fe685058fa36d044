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
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from scipy import stats

from dmlbench.analysis.endpoints import ALL_MODES, RERANKED_SUFFIX, ScoreTable, common_seeds, declared_comparisons
from dmlbench.analysis.search_luck import search_sd_allowance
from dmlbench.analysis.statistics import DEFAULT_ALPHA, DEFAULT_EQUIVALENCE_MARGIN, PairedComparison, compare_pairs

# Endpoint (mode, metric) -> its family of declared comparisons.
Families = dict[tuple[str, str], list[PairedComparison]]

# The metrics whose families ``comparisons.csv`` lists (the leaderboard's), in its order.
LEADERBOARD_METRICS = ("precision_at_1", "r_precision", "map_at_r")
COMPARISON_COLUMNS = ("mode", "metric", "a", "b", "n", "mean_difference", "t_statistic", "t_pvalue_holm",
                      "wilcoxon_statistic", "wilcoxon_pvalue_holm", "cohen_dz", "difference_ci_low", "difference_ci_high",
                      "t_pvalue", "wilcoxon_pvalue", "tost_pvalue", "tost_pvalue_holm", "equivalence_margin", "outcome",
                      "no_verdict", *("conditional_on_search", "search_sd_allowance", "equivalence_ci_low", "equivalence_ci_high",
                                      "assumed_search_sd"))
SEARCH_COLUMNS = COMPARISON_COLUMNS[-5:]


def judge_methods(means: Mapping[tuple[str, str], Mapping[str, Mapping[int, float]]], analysis: Mapping[str, Any],
                  excluded: Collection[str] = ()) -> Families:
    """Every endpoint's declared family judged on the methods, their searches included: ``means`` holds each
    method's search means (``(mode, metric) -> method -> search -> mean``, ``search_luck.search_means``),
    compared paired by search index; methods with fewer than two searches in common are left out."""
    margin = float(analysis.get("equivalence_margin", DEFAULT_EQUIVALENCE_MARGIN))
    families: Families = {}
    for endpoint, by_method in sorted(means.items()):
        paired = common_seeds({method: values for method, values in by_method.items() if method not in excluded})
        paired = {method: values for method, values in paired.items() if len(values) >= 2}
        declared = declared_comparisons(analysis.get("references", []), analysis.get("pairs", []), list(paired))
        families[endpoint] = compare_pairs(paired, declared, margin) if declared and len(paired) >= 2 else []
    return families


def search_cells(comparison: PairedComparison, conditional: bool, alpha: float = DEFAULT_ALPHA) -> list[str]:
    """The ``SEARCH_COLUMNS`` of a row: whether the verdict rests on one search per method, the search SD
    that would undo it (one search, a decided verdict), the 90% interval TOST corresponds to, and the
    search SD the tests assumed (``analysis.search_sd``; 0: none)."""
    allowance = search_sd_allowance(comparison, alpha) if conditional else None
    low, high = equivalence_interval(comparison, alpha)
    return ["true" if conditional else "false", "" if allowance is None else repr(allowance), repr(low), repr(high),
            repr(comparison.search_sd)]


def equivalence_interval(comparison: PairedComparison, alpha: float = DEFAULT_ALPHA) -> tuple[float, float]:
    """The ``1 - 2 alpha`` t-interval of the mean difference (90% at 5%): TOST at ``alpha`` declares equivalence
    exactly when it lies inside ``±margin`` (Schuirmann 1987); rescaled from the stored 95% interval."""
    df = comparison.n - 1
    if df < 1:
        return math.nan, math.nan
    half = float((comparison.difference_high - comparison.difference_low) / 2 * stats.t.ppf(1 - alpha, df) / stats.t.ppf(0.975, df))
    return comparison.mean_difference - half, comparison.mean_difference + half


def judge(scores: ScoreTable, analysis: Mapping[str, Any], excluded: Collection[str] = ()) -> Families:
    """Every endpoint's declared family re-judged from ``scores`` (a ``runs.csv`` table) under the analysis
    in force (``references``, ``pairs``, ``equivalence_margin``); ``excluded`` methods (the baselines)
    are never compared. Endpoints in sorted order."""
    margin = float(analysis.get("equivalence_margin", DEFAULT_EQUIVALENCE_MARGIN))
    search_sd = float(analysis.get("search_sd") or 0.0)
    families: Families = {}
    for endpoint, stored in sorted(scores.items()):
        paired = common_seeds({method: values for method, values in stored.items() if method not in excluded})
        declared = declared_comparisons(analysis.get("references", []), analysis.get("pairs", []), list(paired))
        families[endpoint] = compare_pairs(paired, declared, margin, search_sd) if declared and len(paired) >= 2 else []
    return families


def comparison_csv(families: Sequence[tuple[str, str, Sequence[PairedComparison]]], alpha: float = DEFAULT_ALPHA,
                   conditional: bool = True) -> str:
    """``comparisons.csv`` (``conditional``: one search per method) or ``method_comparisons.csv`` (searches
    repeated): one row per comparison of each ``(mode, metric, family)``, every float as its repr."""
    stream = io.StringIO()
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(COMPARISON_COLUMNS)
    for mode, metric, family in families:
        for c in family:
            writer.writerow([mode, metric, c.a, c.b, c.n, *(repr(value) for value in (
                c.mean_difference, c.t_statistic, c.t_pvalue_holm, c.wilcoxon_statistic, c.wilcoxon_pvalue_holm,
                c.cohen_dz, c.difference_low, c.difference_high, c.t_pvalue, c.wilcoxon_pvalue, c.tost_pvalue,
                c.tost_pvalue_holm, c.margin)), c.outcome(alpha), c.no_verdict, *search_cells(c, conditional, alpha)])
    return stream.getvalue()


def rejudged_comparison_csv(scores: ScoreTable, analysis: Mapping[str, Any], excluded: Collection[str] = ()) -> str:
    """``comparisons.csv`` of a committed study as the report would write it today from its ``runs.csv``
    alone: the leaderboard metrics' families, modes in the report's order, re-ranked modes left out."""
    families = judge(scores, analysis, excluded)
    listed = [(mode, metric, families[(mode, metric)]) for mode in ALL_MODES if not mode.endswith(RERANKED_SUFFIX)
              for metric in LEADERBOARD_METRICS if families.get((mode, metric))]
    return comparison_csv(listed)
