"""The two-level (search, seed) model of ``analysis.search_luck`` against simulations with known variance
components, ``scipy.stats`` and brute force."""

import math

import numpy as np
import pytest
from scipy import stats

from dmlbench.analysis.search_luck import (
    cheapest_design,
    cheapest_over_trials,
    design_power,
    search_means,
    search_sd_allowance,
    variance_components,
)
from dmlbench.analysis.statistics import compare_pairs, paired_comparison

SEARCH_SD, SEED_SD, SHARED_SD = 0.008, 0.006, 0.01  # search luck, a method's own seed noise, what a seed does to both


def simulated_study(generator: np.random.Generator, difference: float, searches: int, seeds: int) -> dict:
    """``method -> search -> seed -> score`` for two methods of the module's model: each search of each
    method draws its luck; each seed moves both methods alike (SHARED_SD) and each one alone (SEED_SD)."""
    study: dict = {"a": {}, "b": {}}
    for search in range(searches):
        shared = generator.normal(0.0, SHARED_SD, seeds)
        for method, mean in (("a", 0.40 + difference), ("b", 0.40)):
            luck = generator.normal(0.0, SEARCH_SD)
            values = mean + luck + shared + generator.normal(0.0, SEED_SD, seeds)
            study[method][search] = {1000 + seed: float(value) for seed, value in enumerate(values)}
    return study


def test_the_method_level_interval_covers_the_true_difference_95_percent_of_the_time() -> None:
    """2,000 simulated studies of 4 searches x 5 seeds: the 95% interval of the method-level comparison (over
    search means) covers the true difference within ±2 points of 95%; the interval of one search's seeds,
    the conditional one, covers far less often (search luck is not in it)."""
    generator = np.random.default_rng(47)
    true_difference, covered, covered_one_search, studies = 0.005, 0, 0, 2000
    for _ in range(studies):
        study = simulated_study(generator, true_difference, searches=4, seeds=5)
        (method_level,) = compare_pairs(search_means(study), [("a", "b")])
        covered += method_level.difference_low <= true_difference <= method_level.difference_high
        one_search = paired_comparison(study["a"][0], study["b"][0])
        covered_one_search += one_search.difference_low <= true_difference <= one_search.difference_high
    assert abs(covered / studies - 0.95) <= 0.02
    assert covered_one_search / studies < 0.8


def test_a_known_difference_is_detected_at_the_planned_power() -> None:
    """1,000 simulated studies of 6 searches x 3 seeds at a true difference of 1.5 points: the share of
    t-tests that reject at 5% is the planned power within ±0.05."""
    generator = np.random.default_rng(4701)
    searches, seeds, difference, studies = 6, 3, 0.015, 1000
    seed_sd = math.sqrt(2) * SEED_SD  # the paired differences' seed SD: the shared part cancels
    planned, _ = design_power(searches, seeds, SEARCH_SD, seed_sd, difference, comparisons=1)
    rejected = 0
    for _ in range(studies):
        (comparison,) = compare_pairs(search_means(simulated_study(generator, difference, searches, seeds)), [("a", "b")])
        rejected += comparison.t_pvalue < 0.05
    assert 0.3 < planned < 0.95  # a design where power is informative
    assert abs(rejected / studies - planned) <= 0.05


def test_variance_components_are_the_one_way_anova_estimates() -> None:
    generator = np.random.default_rng(3)
    scores = {search: {seed: float(0.4 + luck + generator.normal(0, SEED_SD)) for seed in range(6)}
              for search, luck in enumerate(generator.normal(0, 0.02, 5))}
    found = variance_components(scores)
    table = [list(values.values()) for values in scores.values()]
    f_statistic = stats.f_oneway(*table).statistic
    assert found.searches == 5 and found.reproductions == 6
    assert (6 * found.search + found.seed) / found.seed == pytest.approx(f_statistic, rel=1e-10)
    assert found.seed == pytest.approx(np.mean([np.var(row, ddof=1) for row in table]), rel=1e-12)


def test_search_means_pair_by_search_and_by_the_seeds_every_method_scored() -> None:
    scores = {"a": {0: {1: 1.0, 2: 3.0}, 1: {1: 5.0, 2: 7.0}, 2: {1: 9.0}},
              "b": {0: {1: 0.0, 2: 2.0, 3: 100.0}, 1: {1: 4.0}}}
    assert search_means(scores) == {"a": {0: 2.0, 1: 5.0}, "b": {0: 1.0, 1: 4.0}}


def test_the_search_sd_allowance_is_where_the_verdict_flips() -> None:
    """At the allowance the t-test's p-value with the search term added is exactly alpha; 1% more search
    SD and the verdict is lost (brute force with scipy's t distribution)."""
    a = {seed: 0.40 + 0.001 * (seed % 3) for seed in range(8)}
    b = {seed: 0.38 + 0.002 * (seed % 2) for seed in range(8)}
    comparison = paired_comparison(a, b)
    assert comparison.outcome() == "better"
    allowance = search_sd_allowance(comparison)
    differences = np.array([a[s] - b[s] for s in a])
    seed_se = differences.std(ddof=1) / math.sqrt(differences.size)

    def pvalue(search_sd: float) -> float:
        statistic = differences.mean() / math.sqrt(2 * search_sd**2 + seed_se**2)
        return 2 * stats.t.sf(abs(statistic), differences.size - 1)

    assert allowance is not None and 0 < allowance < 0.05
    assert pvalue(allowance) == pytest.approx(0.05, rel=1e-9)
    assert pvalue(1.01 * allowance) > 0.05
    inconclusive = paired_comparison({0: 0.4, 1: 0.41, 2: 0.39}, {0: 0.41, 1: 0.39, 2: 0.40})
    assert search_sd_allowance(inconclusive) is None


def test_the_cheapest_design_reaches_the_power_and_nothing_cheaper_does() -> None:
    search_sd, seed_sd, margin, comparisons, trials, folds = 0.004, 0.008, 0.01, 3, 4, 2
    design = cheapest_design(search_sd, seed_sd, margin, comparisons, trials, folds)
    assert design is not None and min(design.ttest_power, design.tost_power) >= 0.8
    cheaper = [(k, n) for k in range(3, 40) for n in range(2, 60)
               if k * folds * (trials + n) < design.runs_per_method
               and min(design_power(k, n, search_sd, seed_sd, margin, comparisons)) >= 0.8]
    assert cheaper == []
    assert cheapest_design(0.05, seed_sd, margin, comparisons, trials, folds) is None  # search luck far above the margin


def test_over_trials_per_search_the_cheapest_design_is_the_least_costly_of_each_count() -> None:
    """Shorter searches cost less but choose worse: the design over trials per search is the brute-force
    minimum of the cheapest design at each count, ties to fewer trials, and none when no count reaches 80%."""
    seed_sd, margin, comparisons, folds = 0.008, 0.01, 3, 2
    measured = {1: 0.03, 2: 0.006, 4: 0.004, 8: 0.0035}  # 2 and 4 trials tie at 120 runs per method
    each = {trials: cheapest_design(sd, seed_sd, margin, comparisons, trials, folds) for trials, sd in measured.items()}
    best = cheapest_over_trials(each)
    assert best is not None and each[1] is None  # one-trial searches vary too much to reach the power at all
    lowest = min(design.runs_per_method for design in each.values() if design is not None)
    assert best[1] == each[best[0]] and best[1].runs_per_method == lowest
    assert best[0] == 2  # a tie at the lowest cost (with 4 trials) goes to the shorter search
    # The same luck at every count: the shortest search is the cheapest (a trial costs folds runs per search).
    same = {trials: cheapest_design(0.004, seed_sd, margin, comparisons, trials, folds) for trials in (1, 4)}
    assert cheapest_over_trials(same)[0] == 1  # type: ignore[index]
    assert cheapest_over_trials({trials: cheapest_design(0.05, seed_sd, margin, comparisons, trials, folds)
                                 for trials in (1, 4)}) is None


def test_an_assumed_search_sd_enters_the_paired_tests_and_their_interval() -> None:
    """With ``search_sd`` the t-test, TOST and interval use SE² = 2 sd² + s²/n (recomputed by hand); over
    2,000 simulated one-search studies with that true search SD the interval covers the true difference at
    least 94% of the time (the seeds' degrees of freedom make it a little conservative), while the
    seeds-only interval covers far less."""
    a = {seed: 0.40 + 0.003 * (seed % 3) for seed in range(6)}
    b = {seed: 0.36 + 0.002 * (seed % 2) for seed in range(6)}
    plain, luck = paired_comparison(a, b), paired_comparison(a, b, search_sd=0.007)
    assert plain.outcome() == luck.outcome() == "better"
    differences = np.array([a[s] - b[s] for s in a])
    se = math.sqrt(2 * 0.007**2 + differences.var(ddof=1) / 6)
    assert luck.t_statistic == pytest.approx(differences.mean() / se, rel=1e-12)
    assert luck.t_pvalue == pytest.approx(2 * stats.t.sf(differences.mean() / se, 5), rel=1e-10)
    assert luck.difference_high - luck.difference_low == pytest.approx(2 * stats.t.ppf(0.975, 5) * se, rel=1e-12)
    assert luck.t_pvalue > plain.t_pvalue and luck.search_sd == 0.007
    # Its allowance takes the assumed luck out again: the same as the plain comparison's.
    assert search_sd_allowance(luck) == pytest.approx(search_sd_allowance(plain), rel=1e-9)

    generator = np.random.default_rng(4702)
    covered = covered_plain = 0
    for _ in range(2000):
        study = simulated_study(generator, 0.005, searches=1, seeds=5)
        with_luck = paired_comparison(study["a"][0], study["b"][0], search_sd=SEARCH_SD)
        seeds_only = paired_comparison(study["a"][0], study["b"][0])
        covered += with_luck.difference_low <= 0.005 <= with_luck.difference_high
        covered_plain += seeds_only.difference_low <= 0.005 <= seeds_only.difference_high
    assert 0.94 <= covered / 2000 <= 0.995
    assert covered_plain / 2000 < 0.8


@pytest.mark.parametrize(("search_sd", "seed_sd", "searches", "seeds", "methods"),
                         [(0.7, 1.0, 5, 5, 4), (0.7, 1.0, 29, 3, 5), (1.5, 0.7, 5, 3, 3)])
def test_the_search_sd_bound_covers_the_true_search_sd_80_percent_of_the_time(search_sd: float, seed_sd: float, searches: int,
                                                                              seeds: int, methods: int) -> None:
    """2,000 simulated pilots with known components: the approximate 80% upper bound is at least the true
    search SD in 80% of them, within ±3.5 points (the Monte Carlo SE is 0.9 points); with a search SD small
    against the seeds' noise it is conservative (the truncation at 0)."""
    from dmlbench.analysis.search_luck import search_sd_upper_bound

    def coverage(true_sd: float) -> float:
        generator = np.random.default_rng(7)
        hits = 0
        for _ in range(2000):
            components = {}
            for method in range(methods):
                table = generator.normal(0.0, true_sd, size=(searches, 1)) + generator.normal(0.0, seed_sd, size=(searches, seeds))
                components[method] = variance_components({s: dict(enumerate(map(float, table[s]))) for s in range(searches)})
            hits += search_sd_upper_bound(components) >= true_sd
        return hits / 2000

    assert coverage(search_sd) == pytest.approx(0.80, abs=0.035)
    assert coverage(0.3 * seed_sd) >= 0.8
