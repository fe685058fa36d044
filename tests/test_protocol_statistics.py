"""Statistics over reproductions, checked against scipy.stats and hand-computed values."""

import math

import numpy as np
import pytest
from scipy import stats

from dmlbench.analysis.correlations import (
    _kendall,
    correlation,
    lag_one_autocorrelation,
    mean_lag_one_autocorrelation,
    within_group_correlation,
)
from dmlbench.analysis.statistics import (
    cohen_dz,
    compare_methods,
    compare_pairs,
    equivalence_pvalue,
    holm,
    mean_interval,
    paired_comparison,
)
from dmlbench.errors import UserInputError

VALUES = [0.512, 0.498, 0.530, 0.505, 0.521, 0.490, 0.515, 0.509, 0.526, 0.501]


@pytest.mark.parametrize("confidence", [0.95, 0.9, 0.99])
@pytest.mark.parametrize("values", [VALUES, VALUES[:2], [3.0, 7.0, 1.0, 2.5]])
def test_interval_matches_scipy_t_interval(values: list[float], confidence: float) -> None:
    interval = mean_interval(values, confidence)
    low, high = stats.t.interval(confidence, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    assert interval.mean == pytest.approx(np.mean(values), rel=1e-12)
    assert interval.low == pytest.approx(low, rel=1e-12)
    assert interval.high == pytest.approx(high, rel=1e-12)
    assert interval.n == len(values) and interval.confidence == confidence


def test_interval_of_one_value_is_undefined_and_of_none_an_error() -> None:
    interval = mean_interval([0.4])
    assert interval.mean == 0.4 and math.isnan(interval.low) and math.isnan(interval.high) and interval.n == 1
    with pytest.raises(UserInputError):
        mean_interval([])
    with pytest.raises(UserInputError, match="finite"):
        mean_interval([0.1, float("nan")])
    with pytest.raises(UserInputError, match="confidence"):
        mean_interval(VALUES, 1.0)


def test_paired_comparison_matches_scipy() -> None:
    rng = np.random.default_rng(3)
    a = {seed: float(value) for seed, value in enumerate(rng.normal(0.5, 0.02, 10))}
    b = {seed: a[seed] - float(delta) for seed, delta in enumerate(rng.normal(0.01, 0.01, 10))}
    # Paired by seed, not by insertion order.
    b_shuffled = {seed: b[seed] for seed in reversed(list(b))}
    result = paired_comparison(a, b_shuffled, ("x", "y"))
    x, y = np.array([a[s] for s in range(10)]), np.array([b[s] for s in range(10)])
    t_ref, w_ref = stats.ttest_rel(x, y), stats.wilcoxon(x - y)
    assert (result.a, result.b, result.n) == ("x", "y", 10)
    assert result.mean_difference == pytest.approx(np.mean(x - y))
    assert result.t_statistic == pytest.approx(t_ref.statistic) and result.t_pvalue == pytest.approx(t_ref.pvalue)
    assert result.wilcoxon_statistic == pytest.approx(w_ref.statistic)
    assert result.wilcoxon_pvalue == pytest.approx(w_ref.pvalue)
    d = x - y
    assert result.cohen_dz == pytest.approx(d.mean() / d.std(ddof=1))
    # d_z relates to the paired t statistic by t = d_z * sqrt(n).
    assert result.t_statistic == pytest.approx(result.cohen_dz * math.sqrt(10))


def test_identical_methods_show_no_difference() -> None:
    a = dict(enumerate(VALUES))
    result = paired_comparison(a, dict(a))
    assert (result.t_pvalue, result.wilcoxon_pvalue, result.cohen_dz, result.mean_difference) == (1.0, 1.0, 0.0, 0.0)


def test_unpaired_seeds_are_an_error() -> None:
    with pytest.raises(UserInputError, match=r"unpaired seeds: \[2\]"):
        paired_comparison({0: 0.1, 1: 0.2}, {0: 0.1, 1: 0.3, 2: 0.5}, ("a", "b"))
    with pytest.raises(UserInputError, match="at least two"):
        paired_comparison({0: 0.1}, {0: 0.2})


def test_holm_against_a_hand_computed_example() -> None:
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, max(0.06, 0.04*1) = 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.6, 0.9]) == [1.0, 1.0]
    assert holm([0.02]) == [0.02]
    assert holm([]) == []
    with pytest.raises(UserInputError):
        holm([0.5, 1.5])


def test_compare_methods_holm_corrects_across_all_pairs() -> None:
    rng = np.random.default_rng(7)
    base = rng.normal(0.5, 0.02, 8)
    scores = {
        "m1": dict(enumerate(base)),
        "m2": dict(enumerate(base - 0.03 + rng.normal(0, 0.005, 8))),
        "m3": dict(enumerate(base + rng.normal(0, 0.02, 8))),
    }
    comparisons = compare_methods(scores)
    assert [(c.a, c.b) for c in comparisons] == [("m1", "m2"), ("m1", "m3"), ("m2", "m3")]
    assert [c.t_pvalue_holm for c in comparisons] == pytest.approx(holm([c.t_pvalue for c in comparisons]))
    assert [c.wilcoxon_pvalue_holm for c in comparisons] == pytest.approx(holm([c.wilcoxon_pvalue for c in comparisons]))
    for comparison in comparisons:
        single = paired_comparison(scores[comparison.a], scores[comparison.b])
        assert comparison.t_pvalue == pytest.approx(single.t_pvalue)
        assert comparison.t_pvalue_holm >= comparison.t_pvalue


def test_cohen_dz_edge_cases() -> None:
    assert cohen_dz([1.0, 2.0, 3.0]) == pytest.approx(2.0)
    assert cohen_dz([0.0, 0.0]) == 0.0
    assert math.isnan(cohen_dz([-0.1, -0.1]))  # no spread: undefined, not infinite


def test_identical_differences_give_no_verdict() -> None:
    # The new user's case: P@1 over 480 queries, both reproductions exactly 5 queries worse.
    b = {1000: 0.5, 1001: 0.52}
    a = {seed: value - 5 / 480 for seed, value in b.items()}
    result = paired_comparison(a, b, ("a", "b"))
    assert result.outcome() == "inconclusive" and "identical" in result.no_verdict
    assert result.t_pvalue == 1.0 and result.tost_pvalue == 1.0 and math.isnan(result.cohen_dz)
    assert "identical" in result.verdict() and result.verdict().startswith("inconclusive (")
    # scipy sees the last-bit rounding of a - b as a spread: t in the millions, p about 0 (what the report showed).
    assert stats.ttest_rel(list(a.values()), list(b.values())).pvalue < 1e-6
    # Holm over a family: the degenerate comparison does not rank first and ease the others.
    many = compare_pairs({"a": a, "b": b, "c": {1000: 0.3, 1001: 0.9}}, [("a", "b"), ("c", "b")])
    assert many[0].t_pvalue_holm == 1.0 and many[0].outcome() == "inconclusive"


def test_two_differences_give_no_verdict_however_close() -> None:
    # Two nearly equal differences: scipy's paired t-test is "significant" (d_z about -57 at n = 2).
    a, b = {0: 0.400, 1: 0.420}, {0: 0.430, 1: 0.4505}
    result = paired_comparison(a, b)
    assert stats.ttest_rel([0.400, 0.420], [0.430, 0.4505]).pvalue < 0.05
    assert result.t_pvalue < 0.05 and result.cohen_dz < -50
    assert result.outcome() == "inconclusive" and "2 paired differences" in result.no_verdict
    # The swapped reading keeps the reason; three spread differences give a verdict again.
    assert result.swapped().no_verdict == result.no_verdict
    three = paired_comparison({0: 0.40, 1: 0.42, 2: 0.41}, {0: 0.45, 1: 0.46, 2: 0.47})
    assert three.no_verdict == "" and three.outcome() == "worse"


def _lag_one_by_loops(series: list[float]) -> float:
    """The standard estimator on the residuals of a least-squares line, written out in float64 loops."""
    n = len(series)
    mean_t, mean_x = (n - 1) / 2.0, sum(series) / n
    slope = sum((t - mean_t) * (x - mean_x) for t, x in enumerate(series)) / sum((t - mean_t) ** 2 for t in range(n))
    residuals = [x - (mean_x + slope * (t - mean_t)) for t, x in enumerate(series)]
    centre = sum(residuals) / n
    numerator = sum((residuals[t] - centre) * (residuals[t + 1] - centre) for t in range(n - 1))
    return numerator / sum((e - centre) ** 2 for e in residuals)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lag_one_autocorrelation_is_the_standard_estimator_on_the_detrended_series(seed: int) -> None:
    series = np.cumsum(np.random.default_rng(seed).normal(size=30))
    assert lag_one_autocorrelation(series) == pytest.approx(_lag_one_by_loops(series.tolist()), rel=1e-10)


def test_lag_one_autocorrelation_measures_the_noise_not_the_trend() -> None:
    steps = np.arange(12, dtype=np.float64)
    alternating = 0.01 * (-1.0) ** steps
    # Pearson of x[:-1] with x[1:] gives 1 for a rising line and ~1 for a rising line with small
    # alternating noise; the estimator sees the noise: strongly negative, and no value for the line.
    assert stats.pearsonr((0.05 * steps)[:-1], (0.05 * steps)[1:]).statistic == pytest.approx(1.0)
    assert math.isnan(lag_one_autocorrelation(0.05 * steps))
    assert lag_one_autocorrelation(0.05 * steps + alternating) < -0.8
    smooth = 0.2 * np.sin(steps / 3.0)  # a slow wave around the trend: positively autocorrelated
    assert lag_one_autocorrelation(0.05 * steps + smooth) > 0.5


def test_lag_one_autocorrelation_edge_cases() -> None:
    assert math.isnan(lag_one_autocorrelation([0.5, 0.5, 0.5]))
    assert math.isnan(lag_one_autocorrelation([1.0, 2.0, 3.0, 4.0]))
    with pytest.raises(UserInputError, match="at least 3"):
        lag_one_autocorrelation([0.1, 0.2])
    curves = [[0.1, 0.3, 0.2, 0.5, 0.4], [0.2, 0.2, 0.2], [1.0, 2.0, 3.0], [0.3, 0.1, 0.4, 0.2]]
    expected = np.mean([_lag_one_by_loops(curves[0]), _lag_one_by_loops(curves[3])])
    assert mean_lag_one_autocorrelation(curves) == pytest.approx(expected)


def _tost_by_hand(differences: np.ndarray, margin: float) -> float:
    n = differences.size
    se = differences.std(ddof=1) / math.sqrt(n)
    lower = stats.t.sf((differences.mean() + margin) / se, n - 1)  # H0: mean <= -margin
    upper = stats.t.cdf((differences.mean() - margin) / se, n - 1)  # H0: mean >= +margin
    return max(lower, upper)


@pytest.mark.parametrize("seed", range(6))
def test_equivalence_pvalue_is_tost_and_agrees_with_the_90_percent_interval(seed: int) -> None:
    rng = np.random.default_rng(seed)
    differences = rng.normal(rng.uniform(-0.02, 0.02), rng.uniform(0.002, 0.02), size=int(rng.integers(3, 11)))
    pvalue = equivalence_pvalue(differences, 0.01)
    assert pvalue == pytest.approx(_tost_by_hand(differences, 0.01), rel=1e-10)
    # TOST at level 0.05 rejects exactly when the 90% t-interval lies inside the margin.
    interval = mean_interval(differences, 0.90)
    assert (pvalue < 0.05) == (-0.01 < interval.low and interval.high < 0.01)


def test_equivalence_pvalue_edge_cases() -> None:
    assert equivalence_pvalue([0.0, 0.0, 0.0]) == 0.0
    assert equivalence_pvalue([0.02, 0.02]) == 1.0
    assert equivalence_pvalue([0.005, 0.005], margin=0.01) == 0.0
    with pytest.raises(UserInputError, match="positive"):
        equivalence_pvalue([0.1, 0.2], margin=0.0)
    with pytest.raises(UserInputError, match="at least two"):
        equivalence_pvalue([0.1])


def test_outcome_separates_better_worse_equivalent_and_inconclusive() -> None:
    seeds = range(5)
    base = {s: 0.5 + 0.001 * s for s in seeds}
    scores = {
        "ref": base,
        "better": {s: base[s] + 0.05 + 0.002 * (s % 2) for s in seeds},
        "worse": {s: base[s] - 0.05 - 0.002 * (s % 2) for s in seeds},
        "same": {s: base[s] + 0.001 * (-1) ** s for s in seeds},
        "noisy": {s: base[s] + 0.04 * (-1) ** s for s in seeds},
    }
    comparisons = compare_pairs(scores, [(name, "ref") for name in scores if name != "ref"], margin=0.01)
    assert [c.outcome() for c in comparisons] == ["better", "worse", "equivalent", "inconclusive"]
    assert all(c.margin == 0.01 for c in comparisons)
    assert [c.tost_pvalue_holm for c in comparisons] == pytest.approx(holm([c.tost_pvalue for c in comparisons]))
    # Not significantly different is not equivalent: the noisy method's t-test and TOST both stay above 0.05.
    noisy = comparisons[3]
    assert noisy.t_pvalue_holm >= 0.05 and noisy.tost_pvalue_holm >= 0.05


def _partial_correlation_pvalue(x: np.ndarray, y: np.ndarray, groups: list[str]) -> tuple[float, float]:
    """The coefficient of x in y ~ x + group dummies (OLS): its t-test and the partial correlation."""
    names = sorted(set(groups))
    dummies = np.array([[float(g == name) for name in names] for g in groups])
    design = np.column_stack([x, dummies])
    coefficients, *_ = np.linalg.lstsq(design, y, rcond=None)
    residuals = y - design @ coefficients
    freedom = len(y) - design.shape[1]
    covariance = (residuals @ residuals / freedom) * np.linalg.inv(design.T @ design)
    t = coefficients[0] / math.sqrt(covariance[0, 0])
    return float(2 * stats.t.sf(abs(t), freedom)), t / math.sqrt(t * t + freedom)


def test_within_group_correlation_is_the_partial_correlation_given_the_groups() -> None:
    rng = np.random.default_rng(3)
    groups = [name for name in "abcd" for _ in range(5)]
    level = {"a": 0.0, "b": 1.0, "c": 2.0, "d": 3.0}
    # Across groups x and y rise together; within each group they fall together.
    x = np.array([level[g] + rng.normal(0, 0.3) for g in groups])
    y = np.array([level[g] - 0.5 * (xi - level[g]) + rng.normal(0, 0.05) for g, xi in zip(groups, x)])
    assert correlation(x, y).estimate > 0.8
    within = within_group_correlation(x, y, groups)
    pvalue, partial = _partial_correlation_pvalue(x, y, groups)
    assert within.estimate == pytest.approx(partial, rel=1e-9) and within.estimate < -0.8
    assert within.pvalue == pytest.approx(pvalue, rel=1e-9)
    assert within.n == 20 and within.low <= within.estimate <= within.high
    lonely = within_group_correlation([*x, 9.0], [*y, -9.0], [*groups, "e"])  # a one-point group adds nothing
    assert lonely.estimate == pytest.approx(within.estimate) and lonely.n == 20
    with pytest.raises(UserInputError, match="more points than groups"):
        within_group_correlation([1.0, 2.0, 3.0], [1.0, 3.0, 2.0], ["a", "a", "b"])


@pytest.mark.parametrize("seed", range(4))
def test_kendall_correlation_is_scipys_tau_b_and_its_bootstrap(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 5, size=9).astype(float)  # ties, so tau-b differs from tau-a
    y = x + rng.normal(0, 1.5, size=9)
    result = correlation(x, y, "kendall", resamples=500, seed=seed)
    expected = stats.kendalltau(x, y)
    assert math.isclose(result.estimate, expected.statistic, abs_tol=1e-12) and result.pvalue == expected.pvalue
    # The vectorised statistic agrees with scipy on every resample the interval is built from.
    index = rng.integers(0, 9, size=(50, 9))
    taus = [stats.kendalltau(x[i], y[i]).statistic for i in index]
    assert np.allclose(_kendall(x[index], y[index]), taus, equal_nan=True)
    assert result.low <= result.estimate <= result.high
    with pytest.raises(UserInputError, match="pearson or spearman"):
        within_group_correlation(x, y, ["a"] * 5 + ["b"] * 4, "kendall")


def test_a_swapped_comparison_is_the_comparison_of_the_other_order() -> None:
    """``swapped()`` reads ``a - b`` as ``b - a``: exactly what comparing in the other order computes."""
    scores = {"x": {0: 0.50, 1: 0.53, 2: 0.51, 3: 0.56}, "y": {0: 0.47, 1: 0.49, 2: 0.50, 3: 0.50}}
    (forward,) = compare_pairs(scores, [("x", "y")])
    (backward,) = compare_pairs(scores, [("y", "x")])
    turned = forward.swapped()
    assert (turned.a, turned.b, turned.n) == ("y", "x", 4)
    for name in ("mean_difference", "t_statistic", "cohen_dz", "difference_low", "difference_high", "t_pvalue",
                 "t_pvalue_holm", "wilcoxon_pvalue", "tost_pvalue", "tost_pvalue_holm"):
        assert getattr(turned, name) == pytest.approx(getattr(backward, name), rel=1e-12, abs=1e-15), name
    assert forward.outcome() == "better" and turned.outcome() == backward.outcome() == "worse"


def test_the_signed_rank_test_keeps_the_ties_of_exact_arithmetic() -> None:
    """P@1 is hits / queries: 600/1280 - 581/1280 and 583/1280 - 602/1280 are differences of the same size, but
    floats make them differ in the last bit, and Wilcoxon ranked them apart (W and p off in committed studies). The
    test now ranks the fractions the scores are, as scipy does on the exact differences."""
    from fractions import Fraction

    queries = 1280
    hits = [(600, 581), (583, 602), (700, 650), (710, 700), (690, 640), (655, 660), (720, 690)]
    a = {seed: x / queries for seed, (x, _) in enumerate(hits)}
    b = {seed: y / queries for seed, (_, y) in enumerate(hits)}
    floats = [a[seed] - b[seed] for seed in a]
    assert abs(floats[0]) != abs(floats[1])  # the tie floating point breaks
    exact = [float(Fraction(x - y, queries)) for x, y in hits]
    expected = stats.wilcoxon(exact)
    found = paired_comparison(a, b)
    assert (found.wilcoxon_statistic, found.wilcoxon_pvalue) == (float(expected.statistic), float(expected.pvalue))
    assert (found.wilcoxon_statistic, found.wilcoxon_pvalue) != (float(stats.wilcoxon(floats).statistic),
                                                                   float(stats.wilcoxon(floats).pvalue))
