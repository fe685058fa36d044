"""Group-sequential boundaries (``analysis.group_sequential``) against published values and simulation."""

import math

import numpy as np
import pytest

from dmlbench.analysis import group_sequential
from dmlbench.analysis.group_sequential import boundaries, crossing_probabilities, nominal_quantile, spent_alpha

FIVE_LOOKS = [0.2, 0.4, 0.6, 0.8, 1.0]


def test_obrien_fleming_type_boundaries_are_the_published_ones() -> None:
    """Lan-DeMets O'Brien-Fleming-type spending, five equally spaced looks, one-sided 0.025: 4.8769, 3.3569,
    2.6803, 2.2898, 2.0310 (Jennison and Turnbull 2000, ch. 7; R gsDesign ``sfLDOF``)."""
    found = boundaries(0.025, FIVE_LOOKS, "obrien_fleming", two_sided=False)
    assert found == pytest.approx([4.8769, 3.3569, 2.6803, 2.2898, 2.0310], abs=2e-4)


def test_pocock_type_boundaries_are_the_published_ones() -> None:
    """Lan-DeMets Pocock-type spending, five equally spaced looks, one-sided 0.025 (gsDesign ``sfLDPocock``)."""
    found = boundaries(0.025, FIVE_LOOKS, "pocock", two_sided=False)
    assert found == pytest.approx([2.4380, 2.4268, 2.4101, 2.3966, 2.3859], abs=2e-4)


@pytest.mark.parametrize(("looks", "published"), [(2, 0.042), (4, 0.063), (10, 0.097), (20, 0.124)])
def test_repeated_testing_at_the_fixed_boundary_inflates_the_error_as_published(looks: int, published: float) -> None:
    """Testing at z = 1.96 (one-sided 0.025) at every one of K equally spaced looks: the error Armitage, McPherson
    and Rowe (1969) tabulate, 0.042 (K = 2), 0.063 (4), 0.097 (10), 0.124 (20)."""
    found = sum(crossing_probabilities([1.959964] * looks, list(range(1, looks + 1)), two_sided=False))
    assert round(found, 3) == published


def test_pocock_constant_boundary_spends_alpha_two_sided() -> None:
    """Pocock's (1977) constant for five looks, two-sided 0.05, is 2.413."""
    assert sum(crossing_probabilities([2.413] * 5, [1, 2, 3, 4, 5], two_sided=True)) == pytest.approx(0.05, abs=2e-4)


@pytest.mark.parametrize("spending", ["pocock", "obrien_fleming"])
@pytest.mark.parametrize("two_sided", [True, False])
def test_each_look_spends_what_the_spending_function_allows_in_a_simulation(spending: str, two_sided: bool) -> None:
    """Unequally spaced looks: the first crossings of 400,000 simulated null random walks at each look match the
    spending function's increments within Monte Carlo error."""
    fractions = [0.25, 0.4, 0.7, 1.0]
    found = boundaries(0.05, fractions, spending, two_sided)
    rng = np.random.default_rng(0)
    increments = rng.standard_normal((400_000, len(fractions))) * np.sqrt(np.diff([0.0, *fractions]))
    z = np.cumsum(increments, axis=1) / np.sqrt(fractions)
    crossed = (np.abs(z) if two_sided else z) >= np.array(found)
    first = np.where(crossed.any(axis=1), crossed.argmax(axis=1), -1)
    spent = np.diff([0.0, *(spent_alpha(0.05, f, spending) for f in fractions)])
    for look, expected in enumerate(spent):
        observed = float(np.mean(first == look))
        assert abs(observed - expected) < 4 * math.sqrt(expected / 400_000) + 1e-4, (look, observed, expected)


def test_the_grid_is_fine_enough() -> None:
    """Crossing probabilities on the default grid agree with a grid five times as fine to 1e-7."""
    looks = list(boundaries(0.05, FIVE_LOOKS, "obrien_fleming"))
    coarse = crossing_probabilities(looks, FIVE_LOOKS, two_sided=True)
    fine_points = (group_sequential.GRID_POINTS - 1) * 5 + 1  # odd, as Simpson's rule needs
    original = group_sequential.GRID_POINTS
    group_sequential.GRID_POINTS = fine_points
    try:
        fine = crossing_probabilities(looks, FIVE_LOOKS, two_sided=True)
    finally:
        group_sequential.GRID_POINTS = original
    assert coarse == pytest.approx(fine, abs=1e-7)


def test_a_single_look_is_the_fixed_test_and_spending_ends_at_alpha() -> None:
    assert boundaries(0.05, [1.0], "pocock") == pytest.approx((1.959964,), abs=1e-6)
    assert boundaries(0.05, [1.0], "obrien_fleming", two_sided=False) == pytest.approx((1.644854,), abs=1e-6)
    for spending in ("pocock", "obrien_fleming"):
        assert spent_alpha(0.05, 1.0, spending) == pytest.approx(0.05)
        assert spent_alpha(0.05, 0.0, spending) == 0.0


def test_the_nominal_quantile_carries_the_tail_probability_to_a_t_statistic() -> None:
    from scipy import stats

    assert nominal_quantile(2.5, 4) == pytest.approx(stats.t.isf(stats.norm.sf(2.5), 4))
    assert nominal_quantile(math.inf, 4) == math.inf


@pytest.mark.parametrize(("alpha", "fractions", "spending"), [(0.0, [1.0], "pocock"), (0.05, [0.5, 0.4], "pocock"),
                                                               (0.05, [0.5, 1.2], "pocock"), (0.05, [1.0], "linear")])
def test_bad_designs_are_refused(alpha: float, fractions: list[float], spending: str) -> None:
    with pytest.raises(ValueError):
        boundaries(alpha, fractions, spending)  # type: ignore[arg-type]
