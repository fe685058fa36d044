"""The power functions of ``analysis.power`` against seeded Monte-Carlo simulations of whole studies."""

from __future__ import annotations

import math
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
