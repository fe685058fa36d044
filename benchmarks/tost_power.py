"""``analysis.power.tost_power`` against the same quadrature with its two densities read through scipy.stats'
public ``norm.cdf`` and ``chi2.pdf`` (what it did before): the same values bit for bit, and the time of each
over a grid of designs, measured in one run. ``dmlbench plan`` asks for thousands of these powers.

    python benchmarks/tost_power.py
"""

from __future__ import annotations

import itertools
import time
from unittest import mock

from scipy import stats

from dmlbench.analysis import power


def public_scipy_tost_power(*design: float) -> float:
    """``tost_power`` with scipy.stats' public methods as its integrand's normal cdf and chi² density."""
    with mock.patch.object(power, "_normal_cdf", lambda x: float(stats.norm.cdf(x))), \
            mock.patch.object(power, "_chi2_density", lambda u, freedom: float(stats.chi2.pdf(u, freedom))):
        return power.tost_power(*design)


def main() -> None:
    grid = list(itertools.product([2, 3, 5, 12, 40], [0.0, 0.003, 0.01], [0.01, 0.02], [0.005, 0.02], [0.05, 0.05 / 7]))
    seconds = {"dmlbench": 0.0, "scipy public": 0.0}
    differing = 0
    for design in grid:
        started = time.perf_counter()
        ours = power.tost_power(*design)
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
