"""The claim analyses of the report: correlations with bootstrap intervals, pairs and references with
Holm, rank agreement, and ``report.analysis.analyse`` on constructed reproductions."""

import math

import numpy as np
import pytest
from scipy import stats

from dmlbench.analysis.correlations import correlation, rank_agreement
from dmlbench.analysis.spec import AnalysisSpec
from dmlbench.analysis.statistics import compare_methods, compare_pairs, holm, mean_interval
from dmlbench.errors import UserInputError
from dmlbench.protocol.units.results import MethodReproductions, ReproductionOutcome
from dmlbench.report.analysis import analyse


def _points(n: int = 60, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    return x, -0.5 * x + rng.normal(size=n)


@pytest.mark.parametrize("kind", ["pearson", "spearman"])
def test_correlation_estimate_and_pvalue_are_scipys(kind: str) -> None:
    x, y = _points()
    result = correlation(x, y, kind)
    reference = stats.pearsonr(x, y) if kind == "pearson" else stats.spearmanr(x, y)
    assert result.estimate == pytest.approx(float(reference.statistic), abs=1e-12)
    assert result.pvalue == pytest.approx(float(reference.pvalue), rel=1e-9)
    assert result.low < result.estimate < result.high and result.n == 60


@pytest.mark.parametrize("kind", ["pearson", "spearman"])
def test_bootstrap_interval_agrees_with_a_plain_resampling_loop(kind: str) -> None:
    x, y = _points()
    result = correlation(x, y, kind, resamples=4000, seed=3)
    rng = np.random.default_rng(11)
    statistic = stats.pearsonr if kind == "pearson" else stats.spearmanr
    values = []
    for _ in range(4000):
        index = rng.integers(0, x.size, x.size)
        values.append(float(statistic(x[index], y[index]).statistic))
    low, high = np.percentile(values, [2.5, 97.5])
    # Two independent Monte-Carlo estimates of the same percentiles.
    assert result.low == pytest.approx(low, abs=0.04) and result.high == pytest.approx(high, abs=0.04)


def test_bootstrap_is_seeded_and_drops_degenerate_resamples() -> None:
    x, y = _points(n=20)
    assert correlation(x, y, seed=5) == correlation(x, y, seed=5)
    assert correlation(x, y, seed=5).low != correlation(x, y, seed=6).low
    # Four points, two distinct x values: many resamples have constant x and no correlation.
    result = correlation([0.0, 0.0, 0.0, 1.0], [0.1, 0.2, 0.0, 0.9], "pearson")
    assert math.isfinite(result.low) and math.isfinite(result.high) and result.low <= result.high


@pytest.mark.parametrize(
    ("x", "y", "kind", "message"),
    [([1, 2, 3], [1, 2], "pearson", "same length"), ([1, 2], [1, 2], "pearson", "at least 3"),
     ([1, 1, 1], [1, 2, 3], "pearson", "not all equal"), ([1, 2, 3], [1, 2, 4], "cosine", "pearson, spearman or kendall")],
)
def test_correlation_rejects_bad_input(x: list, y: list, kind: str, message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        correlation(x, y, kind)


def test_compare_pairs_corrects_across_exactly_the_given_pairs() -> None:
    rng = np.random.default_rng(0)
    scores = {name: {seed: float(v) for seed, v in enumerate(rng.normal(shift, 0.05, size=5))}
              for name, shift in (("a", 0.5), ("b", 0.55), ("c", 0.7), ("d", 0.5))}
    pairs = [("b", "a"), ("c", "a"), ("d", "a")]
    result = compare_pairs(scores, pairs)
    raw = [stats.ttest_rel([scores[x][s] for s in range(5)], [scores[y][s] for s in range(5)]).pvalue for x, y in pairs]
    assert [c.t_pvalue_holm for c in result] == pytest.approx(holm(raw))
    for c, (x, y) in zip(result, pairs):
        interval = mean_interval([scores[x][s] - scores[y][s] for s in range(5)])
        assert (c.difference_low, c.difference_high) == pytest.approx((interval.low, interval.high))
    # compare_methods is the family of all pairs.
    assert len(compare_methods(scores)) == 6
    with pytest.raises(UserInputError, match="no scores for method 'z'"):
        compare_pairs(scores, [("z", "a")])


def test_rank_agreement_is_kendalls_tau_with_ties_by_order() -> None:
    first = {"a": 0.9, "b": 0.8, "c": 0.8, "d": 0.1}
    second = {"a": 0.7, "b": 0.9, "c": 0.6, "d": 0.2}
    result = rank_agreement(first, second)
    assert result.tau == pytest.approx(float(stats.kendalltau(list(first.values()), list(second.values())).statistic))
    assert result.ranks == {"a": (1, 2), "b": (2, 1), "c": (3, 3), "d": (4, 4)}
    assert result.changed == ["a", "b"]
    with pytest.raises(UserInputError, match="same methods"):
        rank_agreement(first, {"a": 1.0})


def _results(shifts: dict[str, float], rho: dict[str, float], seeds: int = 5) -> dict[str, MethodReproductions]:
    """Methods whose test scores are ``shift`` + a per-seed effect shared by all methods + a zero-mean
    wiggle of a per-method size (so a method with the reference's shift differs by exactly mean 0)."""
    seed_effect = np.random.default_rng(42).normal(0.0, 0.05, size=seeds)
    wiggle = np.array([0.01, -0.01, 0.01, -0.01, 0.0][:seeds])
    results = {}
    for index, (name, shift) in enumerate(shifts.items()):
        result = MethodReproductions(name, {}, "layout")
        for r in range(seeds):
            value = shift + seed_effect[r] + (index % 3 - 1) * wiggle[r]
            scores = {mode: {"precision_at_1": value + offset, "map_at_r": value / 2 + offset}
                      for mode, offset in (("concatenated", 0.0), ("separated", -0.01))}
            space = [{"rho": rho[name] + 0.01 * fold + 0.001 * r, "pi_intra": 0.1, "pi_inter": 0.2, "pi_ratio": 0.5 + rho[name]}
                     for fold in range(2)]
            result.outcomes.append(ReproductionOutcome(r, 1000 + r, [], scores, None, space))
        results[name] = result
    return results


def test_analyse_counts_methods_against_the_references_and_correlates_rho() -> None:
    shifts = {"contrastive": 0.60, "triplet": 0.60, "same": 0.60, "better": 0.70, "worse": 0.50, "regularised": 0.65}
    rho = {"contrastive": 0.5, "triplet": 0.45, "same": 0.5, "better": 0.2, "worse": 0.8, "regularised": 0.3}
    results = _results(shifts, rho)
    results["untrained"] = _results({"untrained": 0.3}, {"untrained": 0.9})["untrained"]
    claims = analyse(results, AnalysisSpec(references=["contrastive"], pairs=[("regularised", "contrastive")]),
                     {name: {"precision_at_1": 0.7, "map_at_r": 0.8} for name in shifts},
                     ["precision_at_1", "map_at_r"])
    summary = next(r for r in claims.references if (r.mode, r.metric) == ("concatenated", "precision_at_1"))
    assert {c.a for c in summary.comparisons} == set(shifts) - {"contrastive"}  # never the baseline
    assert summary.methods("better") == ["regularised"] and summary.methods("worse") == ["worse"]
    # better - contrastive is +0.1 in every reproduction (the same wiggle): a spread of zero, no verdict.
    better = next(c for c in summary.comparisons if c.a == "better")
    assert "identical" in better.no_verdict and math.isnan(better.cohen_dz)
    # triplet - contrastive wiggles by ±0.01 around 0, same - contrastive by ±0.02: with a margin of one
    # point neither is shown equivalent after Holm; with five points both are.
    assert summary.methods("inconclusive") == ["triplet", "same", "better"] and claims.margin == 0.01
    wide = analyse(results, AnalysisSpec(references=["contrastive"], equivalence_margin=0.05), {}, ["precision_at_1"])
    assert wide.references[0].methods("equivalent") == ["triplet", "same"] and wide.margin == 0.05
    assert wide.references[0].methods("equivalent", among=["same"]) == ["same"]
    (mode, metric, (pair,)), *_ = claims.pairs
    assert (mode, metric, pair.a, pair.b) == ("concatenated", "precision_at_1", "regularised", "contrastive")
    assert pair.mean_difference == pytest.approx(0.05, abs=0.005) and pair.t_pvalue_holm < 0.05
    # One point per reproduction: the mean rho of its fold models against its test P@1.
    assert len(claims.points) == 5 * len(shifts)
    point = next(p for p in claims.points if p.method == "better" and p.reproduction == 2)
    assert point.rho == pytest.approx(0.2 + 0.005 + 0.002)
    runs = next(c for c in claims.correlations if (c.quantity, c.mode, c.level) == ("rho", "separated", "reproductions"))
    x = [p.rho for p in claims.points]
    y = [p.scores["separated"] for p in claims.points]
    assert runs.pearson.estimate == pytest.approx(float(stats.pearsonr(x, y).statistic))
    assert runs.pearson.estimate < -0.5 and runs.pearson.high < 0
    assert math.isnan(runs.pearson.pvalue) and math.isnan(runs.spearman.pvalue)  # dependent points: no test
    within = next(c for c in claims.correlations if (c.quantity, c.mode, c.level) == ("rho", "separated", "within methods"))
    assert within.pearson.n == 5 * len(shifts) and 0.0 <= within.pearson.pvalue <= 1.0
    means = next(c for c in claims.correlations if (c.quantity, c.level) == ("rho", "method means"))
    assert means.pearson.n == len(shifts)
    assert claims.autocorrelation == {"precision_at_1": [0.7] * 6, "map_at_r": [0.8] * 6}
    ranking = dict(claims.rankings)["precision_at_1"]
    # Separated is concatenated - 0.01: only the three methods of equal means may swap (float rounding).
    assert set(ranking.changed) <= {"contrastive", "triplet", "same"}
    assert {name: ranks for name, ranks in ranking.ranks.items() if name in ("better", "regularised", "worse")} == {
        "better": (1, 1), "regularised": (2, 2), "worse": (6, 6)}


def test_cross_domain_modes_get_families_of_their_own_and_re_ranked_modes_none() -> None:
    """With ``evaluation.cross_domain`` each cross-domain mode is another retrieval task: its declared
    comparisons form a Holm family of their own, beside the all-versus-all families (whose verdicts do
    not change); a re-ranked mode is compared with its raw self, never in a family."""
    shifts = {"contrastive": 0.60, "better": 0.70, "worse": 0.50}
    plain = _results(shifts, {name: 0.5 for name in shifts})
    crossed = _results(shifts, {name: 0.5 for name in shifts})
    for name, result in crossed.items():
        for outcome in result.outcomes:
            for mode in ("concatenated", "separated"):
                # Cross-domain, "better" and "worse" swap: the ranking of another task.
                flipped = {"better": -0.2, "worse": 0.2}.get(name, 0.0)
                outcome.scores[f"{mode}_cross_domain"] = {k: v + flipped for k, v in outcome.scores[mode].items()}
                outcome.scores[f"{mode}_reranked"] = dict(outcome.scores[mode])
    analysis = AnalysisSpec(references=["contrastive"])
    before = analyse(plain, analysis, {}, ["precision_at_1", "map_at_r"])
    after = analyse(crossed, analysis, {}, ["precision_at_1", "map_at_r"])
    assert list(after.families) == [(mode, metric) for mode in ("concatenated", "separated", "concatenated_cross_domain",
                                                                "separated_cross_domain") for metric in ("precision_at_1", "map_at_r")]
    for key, family in before.families.items():
        assert after.families[key] == family
    summary = next(r for r in after.references if (r.mode, r.metric) == ("concatenated_cross_domain", "precision_at_1"))
    assert summary.methods("better") == ["worse"] and summary.methods("worse") == ["better"]
    # The cross-domain ranking, beside the all-versus-all one: "better" and "worse" trade places.
    assert before.domain_rankings == []
    crossed_ranking = dict(after.domain_rankings)["precision_at_1"]
    assert crossed_ranking.ranks == {"contrastive": (2, 2), "better": (1, 3), "worse": (3, 1)}
    assert crossed_ranking.tau == pytest.approx(stats.kendalltau([2, 1, 3], [2, 3, 1]).statistic)
    assert {mode for mode, _, _ in after.reranking} == {"concatenated", "separated"}


def test_analyse_without_an_analysis_section_or_embedding_space_still_ranks() -> None:
    results = _results({"a": 0.5, "b": 0.6, "c": 0.7}, {"a": 0.1, "b": 0.2, "c": 0.3})
    for result in results.values():
        for outcome in result.outcomes:
            outcome.embedding_space.clear()  # benchmarks stored before rho was recorded
    claims = analyse(results, AnalysisSpec(), {}, ["precision_at_1", "map_at_r"])
    assert claims.references == [] and claims.pairs == [] and claims.points == [] and claims.correlations == []
    assert [metric for metric, _ in claims.rankings] == ["precision_at_1", "map_at_r"]


def test_a_best_value_on_a_bound_of_its_range_is_flagged() -> None:
    from pathlib import Path

    from protocol_fixtures import benchmark_record

    from dmlbench.report.data import ReportData
    from dmlbench.report.tables import range_edge

    spec = {"methods": [{"name": "m", "search": {"loss.params.margin": {"low": 0.05, "high": 0.5},
                                                 "miner.name": {"choices": ["semihard", "hard"]}}}]}
    data = ReportData(Path("."), benchmark_record(spec=spec), ["m"], {})
    assert range_edge(data, "m", "loss.params.margin", 0.5) == " (range edge)"
    assert range_edge(data, "m", "loss.params.margin", 0.05) == " (range edge)"
    assert range_edge(data, "m", "loss.params.margin", 0.3) == ""
    assert range_edge(data, "m", "miner.name", "hard") == "" and range_edge(data, "other", "loss.params.margin", 0.5) == ""
