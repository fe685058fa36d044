"""How much search is enough: a method's expected best validation score as a function of the number of
trials (Dodge et al. 2019, "Show Your Work: Improved Reporting of Experimental Results", §3, eq. 1-2).

Of ``N`` completed trials with sorted scores ``v_(1) <= ... <= v_(N)``, the best of ``n`` trials drawn with
replacement is ``v_(i)`` with probability ``(i/N)^n - ((i-1)/N)^n``, so

    E[max_n] = sum_i v_(i) [(i/N)^n - ((i-1)/N)^n],     Var[max_n] = E[max_n²] - E[max_n]².

The estimator treats the trials as independent draws from one distribution of configurations' scores,
which random search satisfies and a sequential (Bayesian) search only approximates: its later trials
depend on the earlier ones. ``running_best`` beside it is what this search's own order gave after ``n``
trials. A curve that is still rising at ``N`` says the search had not flattened: more trials could
move the method, and so could another search."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BudgetPoint:
    """After ``trials`` trials: the search's own best so far, and the expected best of that many draws with its SD."""

    trials: int
    running_best: float
    expected_best: float
    expected_best_sd: float


def expected_best(scores: Sequence[float], trials: int) -> tuple[float, float]:
    """``E[max]`` and its SD over ``trials`` draws with replacement from ``scores`` (Dodge et al. 2019, eq. 1)."""
    values = np.sort(np.asarray(scores, dtype=np.float64))
    if values.size == 0 or trials < 1:
        raise ValueError(f"expected_best needs scores and at least one trial, got {values.size} scores and {trials} trials")
    positions = np.arange(1, values.size + 1) / values.size
    weights = positions**trials - (positions - 1 / values.size) ** trials
    mean = float(weights @ values)
    variance = max(float(weights @ values**2) - mean**2, 0.0)
    return mean, float(np.sqrt(variance))


def budget_curve(scores_in_order: Sequence[float]) -> list[BudgetPoint]:
    """One point per number of trials ``1..N`` of a search's completed trials, given in the order they ran."""
    points, best = [], -np.inf
    for trials, value in enumerate(scores_in_order, start=1):
        best = max(best, float(value))
        mean, sd = expected_best(scores_in_order, trials)
        points.append(BudgetPoint(trials, best, mean, sd))
    return points
