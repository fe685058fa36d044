"""Power of the paired comparisons, before the runs (planning) and after them (what a verdict could show).

Reproductions paired by seed give ``n`` differences with standard deviation ``sd``; the two tests
that decide a verdict (``statistics.PairedComparison.outcome``) are the two-sided paired t-test and
TOST within ``±margin`` (Schuirmann 1987). Their power:

* **t-test** at a true mean difference ``delta``: ``T = mean / (s / sqrt(n))`` follows the noncentral
  t distribution with ``n - 1`` degrees of freedom and noncentrality ``delta · sqrt(n) / sd``, so the
  power is ``P(|T| > t_{1 - alpha/2, n-1})`` from ``scipy.stats.nct`` (exact).
* **TOST** at a true difference ``delta``: both one-sided tests reject exactly when
  ``|mean| < margin - t_{1-alpha, n-1} · s / sqrt(n)``. Conditional on ``s`` that is a normal
  probability of the mean; integrating over ``s`` (``(n - 1) s² / sd² ~ chi²_{n-1}``) gives the exact
  power (Owen 1965). The usual shortcut with two noncentral t distributions, ``P(T₁ > t) + P(T₂ < -t) - 1``,
  assumes the two tests never fail together, which at 5 reproductions they often do; it is not used.

Holm's correction at level ``alpha`` over ``m`` comparisons tests the smallest p-value at ``alpha / m``;
no comparison is ever tested at a stricter threshold, so the power at ``alpha / m`` is the guaranteed
one after Holm (the *strictest Holm threshold*: the planning numbers use it and say so).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import integrate, optimize, special, stats

from dmlbench.analysis.statistics import MIN_VERDICT_PAIRS, zero_spread
from dmlbench.errors import UserInputError

TARGET_POWER = 0.8
MAX_REPRODUCTIONS = 1000  # planning looks no further: beyond this the design, not n, must change
# The level of the upper confidence bound on a pilot's SD: planning at that bound gives the design its
# target power whenever the true SD lies below the bound, which it does in 80% of pilots.
SD_BOUND_CONFIDENCE = 0.8


def _check(n: int, sd: float, alpha: float) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise UserInputError(f"power needs at least 2 paired reproductions, got {n!r}")
    if not math.isfinite(sd) or sd <= 0.0:
        raise UserInputError(f"the standard deviation of the paired differences must be positive, got {sd!r}")
    if not 0.0 < alpha < 1.0:
        raise UserInputError(f"alpha must lie strictly between 0 and 1, got {alpha!r}")


def ttest_power(n: int, difference: float, sd: float, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t-test with ``n`` pairs at true mean difference ``difference`` (noncentral t)."""
    _check(n, sd, alpha)
    freedom = n - 1
    critical = float(stats.t.ppf(1.0 - alpha / 2.0, freedom))
    noncentrality = difference * math.sqrt(n) / sd
    power = float(stats.nct.sf(critical, freedom, noncentrality) + stats.nct.cdf(-critical, freedom, noncentrality))
    if not math.isfinite(power):  # scipy's nct gives NaN far in the tail, where the power is 1 to double precision
        power = 1.0
    return min(power, 1.0)


def tost_power(n: int, difference: float, margin: float, sd: float, alpha: float = 0.05) -> float:
    """Exact power of TOST (Schuirmann 1987) within ``±margin`` with ``n`` pairs at true difference ``difference``:
    ``∫ P(|mean| < margin - t·s/√n | s) f(s) ds`` over the chi distribution of ``s`` (Owen 1965)."""
    _check(n, sd, alpha)
    if not math.isfinite(margin) or margin <= 0.0:
        raise UserInputError(f"the equivalence margin must be a positive number, got {margin!r}")
    freedom = n - 1
    critical = float(stats.t.ppf(1.0 - alpha, freedom))
    standard_error = sd / math.sqrt(n)
    # s = sd * sqrt(u / freedom) with u ~ chi²(freedom); rejection needs margin - t·s/√n > 0, i.e. u < upper.
    upper = freedom * (margin * math.sqrt(n) / (critical * sd)) ** 2

    def conditional(u: float) -> float:
        half_width = margin - critical * sd * math.sqrt(u / freedom) / math.sqrt(n)
        inside = _normal_cdf((half_width - difference) / standard_error) - _normal_cdf((-half_width - difference) / standard_error)
        return float(inside * _chi2_density(u, freedom))

    # Only where the chi² density has mass: with many reproductions it is a narrow peak quad would step over.
    low, high = float(stats.chi2.ppf(1e-15, freedom)), min(upper, float(stats.chi2.isf(1e-15, freedom)))
    if high <= low:
        return 0.0
    value, _ = integrate.quad(conditional, low, high, limit=200, epsabs=1e-12, epsrel=1e-9)
    return float(min(max(value, 0.0), 1.0))


# scipy.stats' normal cdf and chi² density, computed as scipy computes them (the same special functions on
# one-element arrays, so the same bits) without the argument checks of its public methods: the quadrature of
# tost_power calls them hundreds of times per power, and `dmlbench plan` asks for thousands of powers.
def _normal_cdf(x: float) -> float:
    return float(special.ndtr(np.array([x]))[0])


def _chi2_density(u: float, freedom: int) -> float:
    values, degrees = np.array([u]), np.array([float(freedom)])
    log_density = special.xlogy(degrees / 2.0 - 1, values) - values / 2.0 - special.gammaln(degrees / 2.0) - (np.log(2) * degrees) / 2.0
    return float(np.exp(log_density)[0])


def holm_strictest_alpha(alpha: float, comparisons: int) -> float:
    """The smallest threshold Holm's step-down procedure uses over ``comparisons`` tests: ``alpha / m``."""
    if comparisons < 1:
        raise UserInputError(f"a family needs at least one comparison, got {comparisons}")
    return alpha / comparisons


def reproductions_needed(power: Callable[[int], float], target: float = TARGET_POWER) -> int | None:
    """The smallest ``n >= MIN_VERDICT_PAIRS`` whose ``power(n)`` reaches ``target`` (power rises with ``n``;
    fewer pairs carry no verdict whatever their power, ``statistics.spread_note``); ``None`` beyond
    ``MAX_REPRODUCTIONS``."""
    if power(MAX_REPRODUCTIONS) < target:
        return None
    low, high = MIN_VERDICT_PAIRS, MAX_REPRODUCTIONS
    while low < high:  # bisection on a monotone function: about 10 evaluations
        middle = (low + high) // 2
        if power(middle) >= target:
            high = middle
        else:
            low = middle + 1
    return low


def minimal_detectable_difference(n: int, sd: float, alpha: float = 0.05, target: float = TARGET_POWER) -> float:
    """The smallest true difference the two-sided paired t-test detects with power ``target`` at ``n`` pairs."""
    _check(n, sd, alpha)
    if ttest_power(n, 0.0, sd, alpha) >= target:
        return 0.0
    high = sd
    while ttest_power(n, high, sd, alpha) < target:
        high *= 2.0
    return float(optimize.brentq(lambda d: ttest_power(n, d, sd, alpha) - target, 0.0, high, xtol=1e-12 * high))


@dataclass(frozen=True)
class ComparisonPower:
    """What a comparison of ``n`` paired reproductions can show, unadjusted and at the strictest Holm threshold.

    ``ttest_*``: power to find a true difference of one ``margin``; ``tost_*``: power to show
    equivalence when the true difference is zero; ``needed``: the reproductions that give both tests
    80% power at the strictest Holm threshold (``None``: more than ``MAX_REPRODUCTIONS``);
    ``detectable``: the smallest difference the t-test finds with 80% power at that threshold."""

    a: str
    b: str
    n: int
    sd: float
    margin: float
    comparisons: int
    ttest: float
    ttest_holm: float
    tost: float
    tost_holm: float
    needed: int | None
    detectable: float


def comparison_power(a: str, b: str, n: int, sd: float, margin: float, comparisons: int,
                     alpha: float = 0.05, search_sd: float = 0.0) -> ComparisonPower:
    """``ComparisonPower`` of one comparison in a Holm family of ``comparisons`` tests. With ``search_sd``
    (the tests include that much search luck per method, ``statistics.paired_comparison``) the power at
    ``k`` reproductions uses the SD ``sqrt(2 k search_sd² + sd²)``, whose standard error over ``k`` pairs is
    the tests' ``sqrt(2 search_sd² + sd²/k)``: an approximation, since the search term is then treated as
    estimated with the seeds' degrees of freedom (conservative, like the tests)."""
    return ComparisonPower(a, b, n, sd, margin, comparisons, *_powers(n, sd, margin, comparisons, alpha, search_sd))


@functools.lru_cache(maxsize=256)
def _powers(n: int, sd: float, margin: float, comparisons: int, alpha: float,
            search_sd: float = 0.0) -> tuple[float, float, float, float, int | None, float]:
    """The numbers of ``ComparisonPower`` after its names; cached, since a stated SD (``plan --sd``)
    gives every comparison of a family the same ones and each takes about half a second."""
    strict = holm_strictest_alpha(alpha, comparisons)

    def at(k: int) -> float:  # the SD whose standard error over k pairs is the tests' (``comparison_power``)
        return math.sqrt(2 * k * search_sd**2 + sd**2)

    needed_t = reproductions_needed(lambda k: ttest_power(k, margin, at(k), strict))
    needed_tost = reproductions_needed(lambda k: tost_power(k, 0.0, margin, at(k), strict))
    needed = None if needed_t is None or needed_tost is None else max(needed_t, needed_tost)
    return (ttest_power(n, margin, at(n), alpha), ttest_power(n, margin, at(n), strict), tost_power(n, 0.0, margin, at(n), alpha),
            tost_power(n, 0.0, margin, at(n), strict), needed, minimal_detectable_difference(n, at(n), strict))


def paired_sd(differences: np.ndarray | list[float]) -> float:
    """The sample standard deviation (ddof 1) of paired differences; NaN with fewer than two, or when
    they are all equal (``statistics.zero_spread``): a power computed over that SD would divide by
    zero, or by the rounding of equal scores."""
    array = np.asarray(differences, dtype=np.float64)
    return float(array.std(ddof=1)) if array.size >= 2 and not zero_spread(array) else math.nan


def sd_upper_bound(sd: float, pairs: int, confidence: float = SD_BOUND_CONFIDENCE) -> float:
    """One-sided upper ``confidence`` bound on the true SD behind a sample SD of ``pairs`` differences:
    ``(pairs - 1) s² / σ² ~ chi²_{pairs-1}`` gives ``σ <= s · sqrt((pairs - 1) / chi²_{1-confidence, pairs-1})``."""
    freedom = pairs - 1
    return sd * math.sqrt(freedom / float(stats.chi2.ppf(1.0 - confidence, freedom)))


@dataclass(frozen=True)
class PilotSpread:
    """A comparison's paired differences in a pilot: their SD (NaN: all equal) and how many there were."""

    sd: float
    pairs: int
