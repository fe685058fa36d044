"""Group-sequential boundaries by alpha spending (Lan and DeMets 1983), computed by recursive numerical
integration (Armitage, McPherson and Rowe 1969; Jennison and Turnbull 2000, ch. 19).

Model: a test statistic looked at ``K`` times, ``Z_k = S_k / sqrt(I_k)`` where ``S_k`` is a sum of independent
standard-normal observations under the null hypothesis and ``I_k`` its information (here: the searches so far),
so that ``S_k`` has independent increments. A spending function ``alpha(t)`` says how much type-I error may be
spent by the information fraction ``t = I_k / I_max``; the boundary ``c_k`` at look ``k`` is the one whose
first-crossing probability at ``k`` (no crossing before) is ``alpha(t_k) - alpha(t_{k-1})``. Because only the
fractions observed so far enter ``c_k``, looks need not be equally spaced nor planned in number, and the error
stays ``alpha`` however the study stops (Lan and DeMets 1983). Assumption: ``Z_k`` is normal with known variance;
``nominal_quantile`` carries a boundary to a t statistic through its tail probability (Jennison and Turnbull
2000, section 3.8), which the simulations of ``analysis.sequential_simulation`` check under the design as it runs.
Checked against published values in ``tests/test_group_sequential.py``."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Literal

import numpy as np
from scipy import optimize, special

Spending = Literal["pocock", "obrien_fleming"]
SPENDINGS: tuple[str, ...] = ("pocock", "obrien_fleming")
# Where the continuation region is cut off below (one-sided) and boundaries are capped: a standard normal's
# mass beyond 8 is 6e-16, far below any error rate this package spends.
Z_LIMIT = 8.0
# Grid points of the continuation region at each look (odd, for Simpson's rule): crossing probabilities agree
# with a 4,001-point grid to 1e-7 (measured in the tests).
GRID_POINTS = 801


def spent_alpha(alpha: float, fraction: float, spending: Spending) -> float:
    """Type-I error spent by information fraction ``fraction`` (Lan and DeMets 1983, eqs. for the Pocock-type
    ``alpha * ln(1 + (e - 1) t)`` and the O'Brien-Fleming-type ``2 - 2 Phi(z_{1 - alpha/2} / sqrt(t))``)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    fraction = min(max(fraction, 0.0), 1.0)
    if fraction == 0.0:
        return 0.0
    if spending == "pocock":
        return alpha * math.log1p((math.e - 1.0) * fraction)
    if spending == "obrien_fleming":
        return float(2.0 * special.ndtr(special.ndtri(alpha / 2.0) / math.sqrt(fraction)))
    raise ValueError(f"spending must be one of {', '.join(SPENDINGS)}, got {spending!r}")


def _simpson_weights(points: int, width: float) -> np.ndarray:
    if points % 2 == 0:
        raise ValueError(f"Simpson's rule needs an odd number of grid points, got {points}")
    weights = np.ones(points)
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    return weights * width / (3.0 * (points - 1))


class _Walk:
    """The sub-density of ``Z_k`` on the continuation region after each look, under the null hypothesis."""

    def __init__(self, two_sided: bool) -> None:
        self.two_sided = two_sided
        self.grid: np.ndarray | None = None  # z values of the last look's continuation region
        self.density: np.ndarray | None = None  # sub-density times Simpson weights at those values
        self.information = 0.0

    def crossing(self, boundary: float, information: float) -> float:
        """P(no crossing before, crossing at this look) for ``boundary`` at ``information``."""
        if self.grid is None:
            tail = special.ndtr(-boundary)
            return float(2.0 * tail if self.two_sided else tail)
        step = math.sqrt(information - self.information)
        shifted = self.grid * math.sqrt(self.information)
        upper = special.ndtr((shifted - boundary * math.sqrt(information)) / step)
        if self.two_sided:
            upper = upper + special.ndtr((-boundary * math.sqrt(information) - shifted) / step)
        return float(self.density @ upper)

    def advance(self, boundary: float, information: float) -> None:
        """Move the sub-density to this look, keeping only the paths that did not cross ``boundary``."""
        low = -boundary if self.two_sided else -Z_LIMIT
        grid = np.linspace(low, boundary, GRID_POINTS)
        weights = _simpson_weights(GRID_POINTS, boundary - low)
        if self.grid is None:
            density = _normal_density(grid)
        else:
            step = math.sqrt(information - self.information)
            scale = math.sqrt(information) / step
            kernel = _normal_density((grid[:, None] * math.sqrt(information) - self.grid[None, :] * math.sqrt(self.information)) / step)
            density = scale * (kernel @ self.density)
        self.grid, self.density, self.information = grid, density * weights, information


def _normal_density(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def crossing_probabilities(boundaries: Sequence[float], informations: Sequence[float], two_sided: bool) -> list[float]:
    """Under the null hypothesis, the probability of first crossing each boundary ``c_k`` (``|Z_k| >= c_k`` when
    ``two_sided``, else ``Z_k >= c_k``) at each look with information ``I_k`` (increasing)."""
    _check_informations(informations)
    walk, found = _Walk(two_sided), []
    for boundary, information in zip(boundaries, informations, strict=True):
        capped = min(boundary, Z_LIMIT)
        found.append(walk.crossing(capped, information))
        walk.advance(capped, information)
    return found


def _check_informations(informations: Sequence[float]) -> None:
    if not informations or informations[0] <= 0 or any(b <= a for a, b in zip(informations, informations[1:])):
        raise ValueError(f"informations must be positive and increasing, got {list(informations)}")


def boundaries(alpha: float, fractions: Sequence[float], spending: Spending = "pocock",
               two_sided: bool = True) -> tuple[float, ...]:
    """The z boundaries ``c_1..c_K`` at the information fractions ``fractions`` (increasing, at most 1) that spend
    ``alpha`` by ``spending``: two-sided symmetric (reject at ``|Z_k| >= c_k``, ``alpha`` in both tails together)
    or one-sided upper. A look that may spend nothing more gets ``inf``."""
    return _boundaries(float(alpha), tuple(float(f) for f in fractions), spending, bool(two_sided))


@lru_cache(maxsize=4096)
def _boundaries(alpha: float, fractions: tuple[float, ...], spending: Spending, two_sided: bool) -> tuple[float, ...]:
    _check_informations(fractions)
    if fractions[-1] > 1.0 + 1e-12:
        raise ValueError(f"fractions must be at most 1, got {list(fractions)}")
    walk, found, spent = _Walk(two_sided), [], 0.0
    for fraction in fractions:
        target = spent_alpha(alpha, fraction, spending) - spent
        boundary = _solve(lambda c, f=fraction: walk.crossing(c, f) - target, target)
        found.append(boundary)
        capped = min(boundary, Z_LIMIT)
        spent += walk.crossing(capped, fraction)
        walk.advance(capped, fraction)
    return tuple(found)


def _solve(excess: Callable[[float], float], target: float) -> float:
    """The boundary at which the crossing probability equals ``target`` (``excess`` falls as the boundary rises)."""
    if target <= 1e-15 or excess(Z_LIMIT) >= 0.0:
        return math.inf
    return float(optimize.brentq(excess, 0.0, Z_LIMIT, xtol=1e-10))


def nominal_quantile(boundary: float, degrees_of_freedom: float) -> float:
    """The t quantile with the same tail probability as the z ``boundary``: a t statistic on ``degrees_of_freedom``
    crosses it exactly when its tail probability (the nominal p-value) is below the boundary's (each tail alike for
    a two-sided boundary)."""
    return _nominal_quantile(float(boundary), float(degrees_of_freedom))


@lru_cache(maxsize=65536)
def _nominal_quantile(boundary: float, degrees_of_freedom: float) -> float:
    if math.isinf(boundary):
        return math.inf
    return t_quantile(float(special.ndtr(-boundary)), degrees_of_freedom)


def t_quantile(tail: float, degrees_of_freedom: float) -> float:
    """The t quantile with upper tail probability ``tail`` (``scipy.stats.t.isf``, without its per-call overhead)."""
    return float(-special.stdtrit(degrees_of_freedom, tail))
