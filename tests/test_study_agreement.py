"""``correlations.study_agreement``: Kendall's tau between two studies' rankings, its interval from
resampling reproductions, and each study's split-half tau, against scipy and exact enumerations."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from dmlbench.analysis.correlations import resampled_taus, split_half_tau, study_agreement
from dmlbench.errors import UserInputError


def _studies(seed: int, methods: int = 6, reproductions: int = 5, noise: float = 1.0) -> tuple[dict, dict]:
    generator = np.random.default_rng(seed)
    first = {f"m{i}": list(i + noise * generator.normal(size=reproductions)) for i in range(methods)}
    second = {f"m{i}": list(0.5 * i + noise * generator.normal(size=reproductions)) for i in range(methods)}
    return first, second


def test_tau_is_scipys_tau_b_of_the_means_and_the_draws_are_seeded() -> None:
    first, second = _studies(3)
    agreement = study_agreement(first, second, resamples=500, splits=100, seed=7)
    names = list(first)
    expected = stats.kendalltau([np.mean(first[n]) for n in names], [np.mean(second[n]) for n in names]).statistic
    assert agreement.tau == pytest.approx(expected, abs=1e-12) and agreement.methods == 6
    assert agreement.low <= agreement.tau <= agreement.high
    assert study_agreement(first, second, resamples=500, splits=100, seed=7) == agreement
    assert study_agreement(first, second, resamples=500, splits=100, seed=8) != agreement


def test_without_noise_the_interval_is_the_point_and_each_study_agrees_with_itself() -> None:
    first = {f"m{i}": [float(i)] * 4 for i in range(5)}
    second = {f"m{i}": [float(-i)] * 4 for i in range(5)}
    agreement = study_agreement(first, second, resamples=200, splits=50)
    assert agreement.tau == agreement.low == agreement.high == -1.0
    assert agreement.first_split_half == agreement.second_split_half == 1.0


def test_the_resampling_distribution_matches_an_exact_enumeration() -> None:
    # Three methods, two reproductions each, in both studies: every study resample is one of 2^2
    # equally likely draws per method, so the exact distribution of tau has 4^6 equally likely cases.
    first = [np.array([0.0, 3.0]), np.array([1.0, 2.5]), np.array([2.0, 1.0])]
    second = [np.array([0.5, 1.0]), np.array([0.0, 2.0]), np.array([1.5, 0.2])]
    exact = {}
    for draws in itertools.product(itertools.product(range(2), repeat=2), repeat=6):
        means = [(values[list(pick)]).mean() for values, pick in zip(first + second, draws)]
        tau = stats.kendalltau(means[:3], means[3:]).statistic
        key = round(float(tau), 6) if math.isfinite(tau) else "nan"
        exact[key] = exact.get(key, 0) + 1 / 4 ** 6
    resamples = 40_000
    taus = resampled_taus([first, second], resamples, np.random.default_rng(0))
    for value, probability in exact.items():
        hits = np.isnan(taus) if value == "nan" else np.isclose(taus, value)
        bound = 4.5 * math.sqrt(probability * (1 - probability) / resamples)  # binomial, 4.5 sigma
        assert abs(hits.mean() - probability) <= bound, (value, hits.mean(), probability)


def test_split_half_tau_is_the_mean_over_the_equally_likely_splits() -> None:
    # Four reproductions split into two pairs: three distinct splits, equally likely, the same
    # positions taken from every method.
    study = [np.array([0.0, 1.0, 5.0, 2.0]), np.array([1.0, 0.5, 0.0, 4.0]), np.array([2.0, 3.0, 1.0, 0.0])]
    splits = [((0, 1), (2, 3)), ((0, 2), (1, 3)), ((0, 3), (1, 2))]
    exact = np.mean([stats.kendalltau([values[list(a)].mean() for values in study],
                                      [values[list(b)].mean() for values in study]).statistic for a, b in splits])
    estimate = split_half_tau(study, 30_000, np.random.default_rng(1))
    assert estimate == pytest.approx(exact, abs=0.02)


@pytest.mark.parametrize(("first", "second", "message"), [
    ({"a": [1, 2], "b": [1, 2], "c": [0, 1]}, {"a": [1, 2], "b": [1, 2], "d": [0, 1]}, "unmatched: ['c', 'd']"),
    ({"a": [1, 2], "b": [1, 2]}, {"a": [1, 2], "b": [1, 2]}, "at least three methods"),
    ({"a": [1], "b": [1, 2], "c": [0, 1]}, {"a": [1, 2], "b": [1, 2], "c": [0, 1]}, "at least two reproductions"),
    ({"a": [1, float("nan")], "b": [1, 2], "c": [0, 1]}, {"a": [1, 2], "b": [1, 2], "c": [0, 1]}, "'a'"),
])
def test_bad_studies_are_one_line_errors(first: dict, second: dict, message: str) -> None:
    with pytest.raises(UserInputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        study_agreement(first, second, resamples=10, splits=10)
