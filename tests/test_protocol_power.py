"""The power functions of ``analysis.power`` against seeded Monte-Carlo simulations of whole studies."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dmlbench.analysis import power
from dmlbench.analysis.statistics import equivalence_pvalue
from dmlbench.errors import UserInputError

STUDIES = 20_000


def _simulated(n: int, difference: float, sd: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``STUDIES`` simulated studies of ``n`` normal paired differences: their means, SDs and standard errors."""
    draws = np.random.default_rng(seed).normal(difference, sd, size=(STUDIES, n))
    means, sds = draws.mean(axis=1), draws.std(axis=1, ddof=1)
    return means, sds, sds / math.sqrt(n)


def _within_three_standard_errors(simulated: float, computed: float) -> None:
    standard_error = math.sqrt(max(computed * (1.0 - computed), 1e-4) / STUDIES)
    assert abs(simulated - computed) < 3.0 * standard_error, (simulated, computed, standard_error)


@pytest.mark.parametrize(("n", "difference", "sd", "alpha"), [
    (5, 0.0, 0.008, 0.05), (5, 0.01, 0.008, 0.05), (10, 0.006, 0.009, 0.05 / 7), (3, -0.02, 0.01, 0.05)])
def test_ttest_power_matches_simulated_studies(n: int, difference: float, sd: float, alpha: float) -> None:
    means, _, errors = _simulated(n, difference, sd, seed=n)
    pvalues = 2.0 * stats.t.sf(np.abs(means / errors), n - 1)
    _within_three_standard_errors(float((pvalues < alpha).mean()), power.ttest_power(n, difference, sd, alpha))


@pytest.mark.parametrize(("n", "difference", "margin", "sd", "alpha"), [
    (5, 0.0, 0.01, 0.008, 0.05), (10, 0.0, 0.01, 0.008, 0.05 / 7), (8, 0.005, 0.01, 0.006, 0.05), (4, 0.0, 0.01, 0.004, 0.05)])
def test_tost_power_matches_simulated_studies(n: int, difference: float, margin: float, sd: float, alpha: float) -> None:
    means, _, errors = _simulated(n, difference, sd, seed=100 + n)
    pvalues = np.maximum(stats.t.sf((means + margin) / errors, n - 1), stats.t.cdf((means - margin) / errors, n - 1))
    _within_three_standard_errors(float((pvalues < alpha).mean()), power.tost_power(n, difference, margin, sd, alpha))


def test_the_quadratures_densities_are_scipy_stats_to_the_bit() -> None:
    """tost_power's integrand reads the normal cdf and the chi² density from scipy.special directly (ten
    times faster, ``benchmarks/tost_power.py``): the values must be scipy.stats' public ones exactly."""
    generator = np.random.default_rng(3)
    for x in generator.normal(0.0, 4.0, 500):
        assert power._normal_cdf(float(x)) == float(stats.norm.cdf(x))
    for freedom in (1, 2, 3, 6, 28, 99):
        for u in generator.gamma(2.0, 4.0, 200):
            assert power._chi2_density(float(u), freedom) == float(stats.chi2.pdf(u, freedom))


def test_the_simulation_uses_the_reports_tost() -> None:
    """The vectorised TOST p-value of the simulation is ``statistics.equivalence_pvalue``'s."""
    draws = np.random.default_rng(7).normal(0.002, 0.008, size=(20, 6))
    for row in draws:
        mean, error = row.mean(), row.std(ddof=1) / math.sqrt(row.size)
        vectorised = max(stats.t.sf((mean + 0.01) / error, 5), stats.t.cdf((mean - 0.01) / error, 5))
        assert vectorised == pytest.approx(equivalence_pvalue(row, 0.01), rel=1e-9, abs=1e-12)


def test_the_numbers_of_issue_34() -> None:
    """SD 0.8 points, margin 1 point, 7 comparisons: TOST power 0.95 / 0.61 at n = 10 and 1.00 / 0.99 at n = 20."""
    strict = power.holm_strictest_alpha(0.05, 7)
    assert power.tost_power(10, 0.0, 0.01, 0.008) == pytest.approx(0.95, abs=0.005)
    assert power.tost_power(10, 0.0, 0.01, 0.008, strict) == pytest.approx(0.61, abs=0.005)
    assert power.tost_power(20, 0.0, 0.01, 0.008, strict) == pytest.approx(0.99, abs=0.005)


def test_reproductions_needed_is_the_first_n_with_enough_power() -> None:
    planned = power.comparison_power("a", "b", 5, 0.008, 0.01, 7)
    strict = 0.05 / 7
    needed = planned.needed
    assert needed is not None and needed > 5
    for k in (needed - 1, needed):
        both = min(power.ttest_power(k, 0.01, 0.008, strict), power.tost_power(k, 0.0, 0.01, 0.008, strict))
        assert (both >= power.TARGET_POWER) == (k == needed)
    assert power.ttest_power(5, planned.detectable, 0.008, strict) == pytest.approx(power.TARGET_POWER, abs=1e-6)


def test_bad_inputs_are_one_line_errors() -> None:
    with pytest.raises(UserInputError, match="at least 2"):
        power.ttest_power(1, 0.0, 0.01)
    with pytest.raises(UserInputError, match="standard deviation"):
        power.tost_power(5, 0.0, 0.01, 0.0)


def test_plan_command_takes_protocol_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    from cli_runner import run_cli

    config = str(Path(__file__).resolve().parent.parent / "configs" / "reality_check_emoji.yaml")
    code, out, _ = run_cli(["plan", config, "--sd", "0.008"], capsys)
    assert code == 0 and "20 reproductions" in out
    code, out, _ = run_cli(["plan", config, "protocol.reproductions=10", "--sd", "0.008"], capsys)
    assert code == 0 and "10 reproductions" in out and "20 reproductions" not in out
    code, _, err = run_cli(["plan", config, "training.epochs=3", "--sd", "0.008"], capsys)
    assert code == 2 and "plan takes protocol.* and analysis.* overrides only; got 'training.epochs=3'" in err


def test_the_upper_bound_on_a_pilots_sd_is_the_chi_square_one() -> None:
    # The 80% one-sided bound is the upper end of scipy's 60% two-sided chi-square interval...
    for pairs in (2, 3, 10):
        low, _ = stats.chi2.interval(0.6, pairs - 1)
        assert power.sd_upper_bound(0.01, pairs) == pytest.approx(0.01 * math.sqrt((pairs - 1) / low))
    # ... and covers the true SD in 80% of simulated pilots.
    rng = np.random.default_rng(5)
    samples = rng.normal(0.0, 0.02, size=(20000, 3))
    bounds = np.array([power.sd_upper_bound(float(s), 3) for s in samples.std(axis=1, ddof=1)])
    assert np.mean(bounds >= 0.02) == pytest.approx(power.SD_BOUND_CONFIDENCE, abs=0.01)


def test_equal_paired_differences_have_no_sd_to_plan_with() -> None:
    assert math.isnan(power.paired_sd([-5 / 480, -5 / 480]))
    assert math.isnan(power.paired_sd([0.5 - 0.51, 0.52 - 0.53]))  # equal up to rounding
    assert power.paired_sd([0.01, 0.03]) == pytest.approx(np.std([0.01, 0.03], ddof=1))


def _pilot(directory: Path, differences: dict[str, list[float]]) -> Path:
    """A pilot's runs.csv: the reference at 0.5 and each method at 0.5 + its differences."""
    rows = ["method,reproduction,mode,metric,value"]
    count = len(next(iter(differences.values())))
    rows += [f"contrastive,{r},concatenated,map_at_r,0.5" for r in range(count)]
    rows += [f"{name},{r},concatenated,map_at_r,{0.5 + d!r}" for name, values in differences.items() for r, d in enumerate(values)]
    directory.mkdir()
    (directory / "runs.csv").write_text("\n".join(rows) + "\n")
    return directory


def test_plan_with_a_pilot_says_how_uncertain_its_sd_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cli_runner import run_cli

    pilot = _pilot(tmp_path / "pilot", {"multi_similarity": [0.01, 0.02], "triplet_semihard": [-5 / 480, -5 / 480]})
    config = str(Path(__file__).resolve().parent.parent / "src" / "dmlbench" / "configs" / "benchmark.yaml")
    code, out, err = run_cli(["plan", config, "--pilot", str(pilot)], capsys)
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.strip().startswith("multi_similarity vs contrastive"))
    bound = power.sd_upper_bound(float(np.std([0.01, 0.02], ddof=1)), 2)
    assert f"up to {100 * bound:.2f} points (80% upper confidence bound" in line and "1 degree(s) of freedom" in line
    at_estimate, at_bound = (int(number) for number in re.findall(r"needed (\d+);.*which needs (\d+)$", line)[0])
    assert at_bound > at_estimate
    assert "triplet_semihard vs contrastive: no SD (the pilot's 2 paired differences are all equal" in out
