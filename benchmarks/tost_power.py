"""``analysis.power.tost_power`` against the same quadrature written with scipy.stats' public ``norm.cdf`` and
``chi2.pdf`` (what it was before): the same values bit for bit, and the time of each over a grid of
designs, measured in one run. ``dmlbench plan`` asks for thousands of these powers.
"""

from __future__ import annotations

import itertools
import math
import time

from scipy import integrate, stats

from dmlbench.analysis.power import tost_power


def public_scipy_tost_power(n: int, difference: float, margin: float, sd: float, alpha: float) -> float:
    freedom = n - 1
    critical = float(stats.t.ppf(1.0 - alpha, freedom))
    standard_error = sd / math.sqrt(n)
    upper = freedom * (margin * math.sqrt(n) / (critical * sd)) ** 2

    def conditional(u: float) -> float:
        half_width = margin - critical * sd * math.sqrt(u / freedom) / math.sqrt(n)
        inside = stats.norm.cdf((half_width - difference) / standard_error) - stats.norm.cdf((-half_width - difference) / standard_error)
        return float(inside * stats.chi2.pdf(u, freedom))

    low, high = float(stats.chi2.ppf(1e-15, freedom)), min(upper, float(stats.chi2.isf(1e-15, freedom)))
    if high <= low:
        return 0.0
    value, _ = integrate.quad(conditional, low, high, limit=200, epsabs=1e-12, epsrel=1e-9)
    return float(min(max(value, 0.0), 1.0))


def main() -> None:
    grid = list(itertools.product([2, 3, 5, 12, 40], [0.0, 0.003, 0.01], [0.01, 0.02], [0.005, 0.02], [0.05, 0.05 / 7]))
    seconds = {"dmlbench": 0.0, "scipy public": 0.0}
    differing = 0
    for design in grid:
        started = time.perf_counter()
        ours = tost_power(*design)
        middle = time.perf_counter()
        theirs = public_scipy_tost_power(*design)
        seconds["dmlbench"] += middle - started
        seconds["scipy public"] += time.perf_counter() - middle
        differing += ours != theirs
    print(f"{len(grid)} designs; values that differ: {differing}")
    for name, value in seconds.items():
        print(f"{name}: {value:.2f} s")
    print(f"ratio (scipy public) / (dmlbench): {seconds['scipy public'] / seconds['dmlbench']:.1f}")


if __name__ == "__main__":
    main()
