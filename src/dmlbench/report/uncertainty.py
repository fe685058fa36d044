"""Uncertainty beyond the seeds, for the report: the bootstrap over test classes of the primary endpoint
and of its cross-domain mode where there is one (``protocol.class_bootstrap``), the spread over
repeated searches (``protocol.search_repeats``) with the verdicts about the methods they allow, and
the best values that lie at the edge of their search range. Each part is a title, paragraphs and tables (``report.sections`` makes them sections)
and a CSV of every number shown."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dmlbench.analysis.budget import budget_curve, expected_best
from dmlbench.analysis.class_bootstrap import ClassBootstrap, class_bootstrap, class_sums_csv
from dmlbench.analysis.endpoints import ALL_MODES, CROSS_DOMAIN_SUFFIX, RERANKED_SUFFIX, SearchTable, cross_domain_mode
from dmlbench.analysis.search_luck import VarianceComponents, pooled_search_sd, variance_components
from dmlbench.analysis.search_ranges import EDGE_FRACTION, edge_counts, edge_position, edge_words, same_model_words, same_models
from dmlbench.analysis.spec import AnalysisSpec
from dmlbench.analysis.statistics import PairedComparison
from dmlbench.analysis.verdicts import LEADERBOARD_METRICS, Families, judge_methods
from dmlbench.errors import UserInputError
from dmlbench.evaluation.metrics import metric_title
from dmlbench.evaluation.per_query import PER_QUERY_METRICS
from dmlbench.protocol.design.benchmark import SHARED_SEEDS
from dmlbench.protocol.layout import (
    BASELINES,
    BUDGET_CSV,
    BUDGET_FIGURE,
    CLASS_BOOTSTRAP_CSV,
    CLASS_SUMS_CSV,
    METHOD_COMPARISONS_CSV,
    SEARCH_REPEATS_CSV,
    SEARCH_VARIANCE_CSV,
    fold_dir,
    trial_dir,
)
from dmlbench.protocol.units.results import MethodReproductions, result_rows, run_rows
from dmlbench.report.analysis import Claims, scored_methods
from dmlbench.report.data import ReportData
from dmlbench.report.tables import csv_text
from dmlbench.training.records import model_digest

Table = tuple[list[str], list[list[str]]]
Part = tuple[str, list[str], list[Table]]  # title, paragraphs, tables


def endpoint_title(endpoint: tuple[str, str]) -> str:
    """``(mode, metric)`` as the report names it, e.g. ``MAP@R (concatenated)``."""
    return f"{metric_title(endpoint[1])} ({endpoint[0]})"


def bootstrap_endpoints(claims: Claims) -> list[tuple[str, str]]:
    """The endpoints whose test classes are resampled: the primary one and, when the benchmark scored
    it cross-domain as well (``evaluation.cross_domain``), its cross-domain mode."""
    mode, metric = claims.primary
    crossed = (cross_domain_mode(mode), metric)
    return [claims.primary, crossed] if crossed in claims.families else [claims.primary]


def bootstrap_of(data: ReportData, endpoint: tuple[str, str]) -> ClassBootstrap | str | None:
    """The class bootstrap of ``endpoint`` (mode, metric), why there is none (a sentence), or ``None``
    when ``protocol.class_bootstrap`` is 0 or nothing was scored."""
    return judged_bootstrap(data.class_scores, data.results, data.claims, data.benchmark.protocol.class_bootstrap, endpoint)


def judged_bootstrap(class_scores: Mapping[str, Mapping[int, Mapping[str, Any]]], results: Mapping[str, MethodReproductions],
                     claims: Claims, replicates: int, endpoint: tuple[str, str]) -> ClassBootstrap | str | None:
    """``bootstrap_of`` from its parts: per-class sums (the study's storage, or a committed ``class_sums.csv``),
    the reproductions, the claims' families (the pairs compared) and the number of replicates."""
    scored = list(scored_methods(results))
    if replicates == 0 or not scored:
        return None
    mode, metric = endpoint
    if metric not in PER_QUERY_METRICS:
        return f"{metric_title(metric)} is not a mean over queries, so its classes cannot be resampled."
    missing = [name for name in scored if not class_scores.get(name)
               or any(mode not in record["sums"] for record in class_scores[name].values())]
    if missing:
        return (f"`{missing[0]}` has no per-class {mode} test scores (its reproductions were scored by a version of "
                "dmlbench that did not store them), so the test classes cannot be resampled.")
    family = claims.families.get(endpoint)
    pairs = [(c.a, c.b) for c in family] if isinstance(family, list) else []
    try:
        return class_bootstrap({name: class_scores[name] for name in scored}, mode, metric, pairs, replicates=replicates)
    except UserInputError as error:
        return str(error)


def class_bootstrap_csv(results: list[ClassBootstrap]) -> str:
    """``class_bootstrap.csv``: per bootstrapped endpoint (its ``mode`` column tells them apart), every
    method's interval and every compared pair's."""
    rows: list[list[Any]] = []
    for result in results:
        compared = [[name, "", b] for name, b in result.methods.items()]
        compared += [[a, b, d] for (a, b), d in result.differences.items()]
        rows += [[result.mode, result.metric, a, b, result.replicates, result.classes, len(result.seeds),
                  *(repr(v) for v in (i.estimate, i.class_low, i.class_high, i.both_low, i.both_high))]
                 for a, b, i in compared]
    return csv_text(["mode", "metric", "a", "b", "replicates", "classes", "reproductions", "estimate", "class_low",
                      "class_high", "both_low", "both_high"], rows)


def _interval(low: float, high: float) -> str:
    return "-" if math.isnan(low) else f"[{100 * low:+.2f}, {100 * high:+.2f}]"


def class_bootstrap_parts(data: ReportData) -> list[Part]:
    """One part per endpoint of ``bootstrap_endpoints`` (none when the bootstrap is off)."""
    parts = []
    for endpoint in bootstrap_endpoints(data.claims):
        result = bootstrap_of(data, endpoint)
        title = f"Uncertainty over the test classes ({endpoint_title(endpoint)})"
        if isinstance(result, str):
            parts.append((title, [result], []))
        elif result is not None:
            parts.append((title, [_bootstrap_text(result, endpoint)], [_bootstrap_table(data, result, endpoint)]))
    return parts


def _bootstrap_table(data: ReportData, result: ClassBootstrap, endpoint: tuple[str, str]) -> Table:
    seeds = {row["method"]: row for row in result_rows(data.results) if (row["mode"], row["metric"]) == endpoint}
    header = ["method or difference", "estimate (%)", "seeds: 95% t-interval", "classes: 95% bootstrap",
              "classes and seeds: 95% bootstrap"]
    rows = [[name, f"{100 * b.estimate:.2f}", _interval(seeds[name]["ci_low"] - seeds[name]["mean"], seeds[name]["ci_high"] - seeds[name]["mean"]),
             _interval(b.class_low - b.estimate, b.class_high - b.estimate),
             _interval(b.both_low - b.estimate, b.both_high - b.estimate)] for name, b in result.methods.items()]
    family = data.claims.families.get(endpoint)
    compared = {(c.a, c.b): c for c in family} if isinstance(family, list) else {}
    for (a, b), d in result.differences.items():
        c = compared[(a, b)]
        rows.append([f"{a} − {b}", f"{100 * d.estimate:+.2f}", _interval(c.difference_low, c.difference_high),
                     _interval(d.class_low, d.class_high), _interval(d.both_low, d.both_high)])
    return header, rows


def _bootstrap_text(result: ClassBootstrap, endpoint: tuple[str, str]) -> str:
    crossed = endpoint[0].endswith(CROSS_DOMAIN_SUFFIX)
    gallery = ("against the fixed gallery of the other domains' test images" if crossed
               else "against the fixed gallery of all test images")
    queries = (" A class's queries are those with a match drawn by another domain, as in the cross-domain scores."
               if crossed else "")
    return (f"The seeds' intervals treat the {result.classes} test classes as fixed; here they are a sample too. "
            f"{result.replicates} replicates (seed 0) each draw {result.classes} classes with replacement, the same draws "
            "for every method and reproduction, so differences are paired over classes as well as seeds; each query counts "
            f"as often as its class was drawn, {gallery} (an interval conditional on that gallery, docs/decisions.md).{queries} "
            f"*classes*: the mean over all {len(result.seeds)} common reproductions in each replicate; *classes and seeds*: "
            "the reproductions redrawn too (with few reproductions that redraw is narrower than the seeds' t-interval, which "
            "also allows for the unknown spread). Methods: the interval around the estimate (points); differences: the "
            "interval itself (points). A difference whose classes interval holds 0 may change sign with other test classes.")


def _best(trials: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The best completed trial, ties to the earliest (as the search picks it)."""
    complete = [t for t in trials if t["state"] == "COMPLETE"]
    return max(complete, key=lambda t: (t["value"], -t["number"])) if complete else None


def _test_mean(result: Any, primary: tuple[str, str]) -> float:
    values = [o.scores[primary[0]][primary[1]] for o in (result.outcomes if result else []) if o.scores]
    return float(np.mean(values)) if values else math.nan


def search_repeat_rows(data: ReportData) -> list[list[Any]]:
    """One row per search of each repeated method: method, repeat, search seed, best validation MAP@R,
    best parameters, reproductions scored, their mean on the primary endpoint."""
    seed = data.benchmark.protocol.search_seed
    rows = []
    for method, repeats in data.repeats.items():
        for index, name in enumerate([method, *repeats]):
            result = data.results.get(method) if index == 0 else data.repeat_results.get(name)
            best = _best(data.trials.get(name, []))
            scored = sum(1 for o in result.outcomes if o.scores) if result else 0
            rows.append([method, index, seed + index, math.nan if best is None else best["value"],
                         {} if best is None else best["params"], scored, _test_mean(result, data.claims.primary)])
    return rows


def search_repeat_part(data: ReportData) -> Part | None:
    rows = search_repeat_rows(data)
    if not rows:
        return None
    spreads, test_spread = [], {}
    for method in data.repeats:
        mine = [row for row in rows if row[0] == method]
        spread = lambda values: np.nanmax(values) - np.nanmin(values) if np.isfinite(values).any() else math.nan  # noqa: E731
        test_spread[method] = spread(np.array([row[6] for row in mine]))
        spreads.append([method, str(len(mine)), ", ".join(f"{100 * row[3]:.2f}" for row in mine),
                        f"{100 * spread(np.array([row[3] for row in mine])):.2f}",
                        ", ".join(f"{100 * row[6]:.2f}" for row in mine),
                        f"{100 * spread(np.array([row[6] for row in mine])):.2f}"])
    detail = [[row[0], str(row[1]), str(row[2]), f"{100 * row[3]:.2f}",
               ", ".join(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}" for key, value in row[4].items()),
               str(row[5]), f"{100 * row[6]:.2f}"] for row in rows]
    endpoint = endpoint_title(data.claims.primary)
    text = ("The whole search run again with other search seeds (`protocol.search_repeats`; search 0 is the one the "
            "leaderboard and the comparisons use), each followed by its own reproductions on the same seeds. The spread "
            f"(largest − smallest, points) of the best validation MAP@R and of the reproductions' mean {endpoint} "
            "across searches is how much the search's luck alone moves a method: a difference between methods smaller "
            "than it says little about the methods.")
    family = data.claims.families.get(data.claims.primary)
    within = [f"{c.a} − {c.b} {100 * c.mean_difference:+.2f}" for c in (family if isinstance(family, list) else [])
              if abs(c.mean_difference) <= max((test_spread.get(name, -1.0) for name in (c.a, c.b)), default=-1.0)]
    if isinstance(family, list):
        text += (" Declared comparisons whose difference is no larger than the test spread of a repeated method in them: "
                 + (", ".join(within) or "none") + ".")
    return ("Search repeats", [text], [
        (["method", "searches", "best val. MAP@R (%) per search", "spread", f"test {endpoint} (%) per search", "spread"],
         spreads),
        (["method", "search", "search seed", "best val. MAP@R (%)", "best parameters", "reproductions scored",
          f"test {endpoint} (%)"], detail)])


def range_edge_text(data: ReportData) -> str:
    """One sentence naming every best value within the outer ``EDGE_FRACTION`` of its search range, then (searches
    repeated) each parameter whose chosen values sit at one edge in a share of a method's searches (``search_ranges``)."""
    spaces = {m.name: m.search for m in data.benchmark.spec.methods}
    flagged, chosen = [], {}
    for method in data.methods:
        for name in [method, *data.repeats.get(method, [])]:
            best = _best(data.trials.get(name, []))
            chosen.setdefault(method, []).append((best or {}).get("params", {}))
            for key, value in (best or {}).get("params", {}).items():
                position = edge_position(spaces.get(method, {}).get(key), value)
                if position is not None and min(position, 1.0 - position) <= EDGE_FRACTION:
                    side = "low" if position < 0.5 else "high"
                    flagged.append(f"`{name}` {key}={value:.4g} ({side} end, {100 * position:.0f}% of the range)")
    share = f"{100 * EDGE_FRACTION:g}%"
    shares = edge_words(edge_counts(spaces, {m: c for m, c in chosen.items() if len(c) >= 2}))
    if not flagged:
        return f"No best value lies within the outer {share} of its search range."
    return (f"Best values within the outer {share} of their search range (on the log scale where searched on it), where "
            f"the optimum may lie outside the range: {'; '.join(flagged)}." + (f" {shares}" if shares else ""))


def uncertainty_csvs(data: ReportData) -> dict[str, str]:
    """``class_bootstrap.csv`` and the per-class sums it recomputes from (``class_sums.csv``),
    ``search_variance.csv``, ``budget.csv`` and ``search_repeats.csv``, when there are any."""
    texts: dict[str, str] = {}
    results = [result for result in (bootstrap_of(data, endpoint) for endpoint in bootstrap_endpoints(data.claims))
               if isinstance(result, ClassBootstrap)]
    if results:
        texts[CLASS_BOOTSTRAP_CSV] = class_bootstrap_csv(results)
        texts[CLASS_SUMS_CSV] = class_sums_csv({name: data.class_scores[name] for name in scored_methods(data.results)})
    variances = repeated_variances(data) if data.repeats else {}
    if variances:
        texts[SEARCH_VARIANCE_CSV] = search_variance_csv(variances, data.claims.primary)
    budget = budget_table(data)
    if budget:
        texts[BUDGET_CSV] = csv_text(["method", "search", "trials", "running_best", "expected_best", "expected_best_sd"], budget)
    repeats = search_repeat_rows(data)
    if repeats:
        texts[SEARCH_REPEATS_CSV] = csv_text(
            ["method", "search", "search_seed", "best_validation", "best_params", "reproductions_scored",
             f"test_{data.claims.primary[0]}_{data.claims.primary[1]}"],
            [[m, k, s, repr(v), ";".join(f"{key}={value!r}" for key, value in p.items()), n, repr(t)]
             for m, k, s, v, p, n, t in repeats])
    return texts


def repeated_reproductions(data: ReportData) -> dict[str, list[MethodReproductions]]:
    """Each repeated method's reproductions of its searches 1, 2, ... (``results.run_rows``'s ``repeats``)."""
    return {method: [data.repeat_results[name] for name in names if name in data.repeat_results]
            for method, names in data.repeats.items()}


def search_table(data: ReportData) -> SearchTable:
    """Every score by endpoint, method, search and reproduction: the rows ``runs.csv`` holds."""
    table: SearchTable = {}
    for row in run_rows(data.results, repeated_reproductions(data)):
        by_search = table.setdefault((row["mode"], row["metric"]), {}).setdefault(row["method"], {})
        by_search.setdefault(row["search"], {})[row["reproduction"]] = row["value"]
    return table


def method_families(data: ReportData) -> list[tuple[str, str, list[PairedComparison]]]:
    """The declared families judged on the methods, their repeated searches included (``verdicts.judge_methods``
    under the design the study ran: fresh or shared seeds), for the leaderboard metrics; nothing without search repeats,
    nor for a sequential study (a fixed test on searches that stopped when decided would not keep its error rate:
    ``report.sequential`` judges it)."""
    if not data.repeats or data.benchmark.protocol.sequential:
        return []
    return judged_method_families(repeated_scores(search_table(data)), data.benchmark.analysis_spec(),
                                  data.benchmark.protocol.search_seeds == SHARED_SEEDS)


def repeated_scores(table: SearchTable) -> SearchTable:
    """The endpoints' scores of the methods searched more than once (``verdicts.judge_methods`` judges them)."""
    return {endpoint: {method: by_search for method, by_search in methods.items() if len(by_search) >= 2}
            for endpoint, methods in table.items() if any(len(by_search) >= 2 for by_search in methods.values())}


def judged_method_families(scores: SearchTable, analysis: AnalysisSpec,
                           shared_seeds: bool) -> list[tuple[str, str, list[PairedComparison]]]:
    """``method_families`` from a study's scores by search: the declared families judged over them, in the order
    ``method_comparisons.csv`` lists them (a study re-judged from its files uses it too)."""
    return listed_families(judge_methods(scores, analysis, BASELINES, shared_seeds))


def listed_families(families: Families) -> list[tuple[str, str, list[PairedComparison]]]:
    """``families`` in the order the verdict files list them: modes in the report's order (re-ranked ones left
    out), then the leaderboard metrics; empty families left out."""
    return [(mode, metric, families[(mode, metric)]) for mode in ALL_MODES if not mode.endswith(RERANKED_SUFFIX)
            for metric in LEADERBOARD_METRICS if families.get((mode, metric))]


def search_variance_csv(found: Mapping[str, VarianceComponents], endpoint: tuple[str, str]) -> str:
    """``search_variance.csv``: each repeated method's search and seed SD on ``endpoint``, then the pooled
    search SD (what ``dmlbench plan --pilot`` assumes for every method)."""
    rows: list[list[Any]] = [[method, *endpoint, c.searches, c.reproductions, repr(c.search_sd), repr(math.sqrt(c.seed))]
                             for method, c in found.items()]
    rows.append(["pooled", *endpoint, "", "", repr(pooled_search_sd(found)), ""])
    stream = io.StringIO()
    csv.writer(stream, lineterminator="\n").writerows([["method", "mode", "metric", "searches", "reproductions", "search_sd",
                                                        "seed_sd"], *rows])
    return stream.getvalue()


def repeated_variances(data: ReportData) -> dict[str, VarianceComponents]:
    """Each repeated method's search and seed variances on the primary endpoint (one-way ANOVA over its searches)."""
    scores = search_table(data).get(data.claims.primary, {})
    return {method: variance_components(by_search) for method, by_search in scores.items()
            if method not in BASELINES and len(by_search) >= 2}


def primary_method_family(data: ReportData) -> list[PairedComparison]:
    """The primary endpoint's declared comparisons judged over the repeated searches; empty without repeats."""
    return next((family for mode, metric, family in method_families(data) if (mode, metric) == data.claims.primary), [])


def method_verdict_part(data: ReportData) -> Part | None:
    """The primary endpoint's verdicts about the methods (search luck included), or none without repeats."""
    family = primary_method_family(data)
    if not family:
        return None
    rows = [[f"{c.a} − {c.b}", str(c.n), f"{100 * c.mean_difference:+.2f} [{100 * c.difference_low:+.2f}, "
             f"{100 * c.difference_high:+.2f}]", f"{c.t_pvalue_holm:.3g}", f"{c.tost_pvalue_holm:.3g}", c.outcome()]
            for c in family]
    text = (f"Verdicts about the methods, their search included: each method's declared comparisons on "
            f"{endpoint_title(data.claims.primary)} judged over its repeated searches (search means paired by search "
            "index, so n counts searches; docs/protocol.md, \"Search luck\"), Holm across the family as above. These, not "
            "the one-search verdicts of the other sections, are about the methods; all endpoints are in "
            f"`{METHOD_COMPARISONS_CSV}`.")
    return ("Verdicts about the methods (search luck included)", [text],
            [(["difference", "searches", "difference (%) [95%]", "t p (Holm)", "TOST p (Holm)", "outcome"], rows)])


def budget_table(data: ReportData) -> list[list[Any]]:
    """``budget.csv``'s rows: per method and search (0, then the repeats), per number of trials, the search's
    running best and the expected best of that many trials with its SD (``analysis.budget``)."""
    rows = []
    for method in data.methods:
        for search, name in enumerate([method, *data.repeats.get(method, [])]):
            values = [t["value"] for t in sorted(data.trials.get(name, []), key=lambda t: t["number"]) if t["state"] == "COMPLETE"]
            rows += [[method, search, point.trials, repr(point.running_best), repr(point.expected_best),
                      repr(point.expected_best_sd)] for point in budget_curve(values)] if values else []
    return rows


def budget_text(data: ReportData) -> str:
    """Whether each method's search had flattened: what its last trial added to the expected best (points)."""
    gains = []
    for method in data.methods:
        values = [t["value"] for t in data.trials.get(method, []) if t["state"] == "COMPLETE"]
        if len(values) >= 2:
            gain = expected_best(values, len(values))[0] - expected_best(values, len(values) - 1)[0]
            gains.append(f"{method} +{100 * gain:.2f}")
    if not gains:
        return ""
    return (f"Expected best validation MAP@R after n trials (Dodge et al. 2019; `{BUDGET_CSV}`, `{BUDGET_FIGURE}`), and what the "
            "last trial added to it, in points: " + ", ".join(gains) + ". A gain far from zero says the search had not "
            "flattened: more trials, or another search, could move the method.")


def identical_trials_text(data: ReportData) -> str:
    """Names a vacuous search dimension: completed trials of one search (same seed, same folds) whose parameters
    differ but whose first fold trained bit-identical weights (``records.model_digest``), or, where this machine
    holds no checkpoints of the search (another worker's), whose validation scores are identical to the last digit."""
    by_digest: dict[str, list[tuple[dict[str, Any], str]]] = {}
    flagged = []
    for method in data.methods:
        for name in [method, *data.repeats.get(method, [])]:
            complete = [trial for trial in data.trials.get(name, []) if trial["state"] == "COMPLETE"]
            digests = [model_digest(fold_dir(trial_dir(data.output_dir, name, trial["number"]), 0)) for trial in complete]
            if complete and all(digest is not None for digest in digests):
                by_digest[name] = [(trial["params"], digest) for trial, digest in zip(complete, digests)]
                continue
            groups: dict[float, list[dict[str, Any]]] = {}
            for trial in complete:
                groups.setdefault(trial["value"], []).append(trial["params"])
            for value, params in groups.items():
                differing = sorted({key for first in params for other in params for key in first if first[key] != other.get(key)})
                if len(params) >= 2 and differing:
                    flagged.append(f"`{name}`: {len(params)} trials with different {', '.join(differing)} scored exactly "
                                   f"{100 * value:.4f}")
    text = same_model_words(same_models(by_digest))
    if flagged:
        text += (" " if text else "") + ("Trials with different parameters gave identical validation scores, so they "
                                         "trained the same model and that dimension of the search did nothing: "
                                         + "; ".join(flagged) + ".")
    return text
