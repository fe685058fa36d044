"""Statistics over reproductions, checked against scipy.stats and hand-computed values."""

import math

import numpy as np
import pytest
from scipy import stats

from dmlbench.errors import UserInputError
from dmlbench.protocol.statistics import (
    cohen_dz,
    compare_methods,
    holm,
    lag_one_autocorrelation,
    mean_interval,
    mean_lag_one_autocorrelation,
    paired_comparison,
)

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
    assert cohen_dz([-0.1, -0.1]) == -math.inf


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lag_one_autocorrelation_is_pearson_of_the_shifted_series(seed: int) -> None:
    series = np.cumsum(np.random.default_rng(seed).normal(size=30))
    expected = stats.pearsonr(series[:-1], series[1:]).statistic
    assert lag_one_autocorrelation(series) == pytest.approx(expected)


def test_lag_one_autocorrelation_edge_cases() -> None:
    assert math.isnan(lag_one_autocorrelation([0.5, 0.5, 0.5]))
    assert lag_one_autocorrelation([1.0, 2.0, 3.0, 4.0]) == pytest.approx(1.0)
    with pytest.raises(UserInputError, match="at least 3"):
        lag_one_autocorrelation([0.1, 0.2])
    curves = [[0.1, 0.3, 0.2, 0.5, 0.4], [0.2, 0.2, 0.2], [1.0, 2.0, 3.0]]
    expected = np.mean([lag_one_autocorrelation(curves[0]), 1.0])
    assert mean_lag_one_autocorrelation(curves) == pytest.approx(expected)
