"""Method-level comparisons of a design whose searches shared their reproduction seeds: a crossed search x seed model.

**Design.** Before ``protocol.search_seeds: fresh`` every search ``s`` of a method trained its reproduction
``r`` with the same seed ``first_seed + r``, so the search means of one method share that method's seed
effects. Paired by search and seed, the difference of two methods is

    d_sr = delta + A_s + B_r + E_sr,   A_s ~ N(0, sigma_A²),  B_r ~ N(0, sigma_B²),  E_sr ~ N(0, sigma_E²),

two *crossed* random effects: ``A_s`` the search luck of both methods in search ``s``, ``B_r`` the
seed x method effect of seed ``r`` that every search reuses (a seed's effect common to both methods cancels
in the difference; its interaction with the method does not), ``E_sr`` the rest. The mean of the ``k x n``
table has ``Var(dbar) = sigma_A²/k + sigma_B²/n + sigma_E²/(kn)``: more searches never shrink the seed term,
which the one-sample t-test on the ``k`` search means (``analysis.search_luck``) wrongly takes as shrinking.

**Estimate.** On the balanced table (the searches and seeds both methods scored) the variance components are
the two-way ANOVA estimates ``sigma_E² = MS_E``, ``sigma_A² = (MS_A - MS_E)/n``, ``sigma_B² = (MS_B - MS_E)/k``,
which equal REML's for a balanced design while both are positive (checked against statsmodels' ``MixedLM``
in the tests); ``Var(dbar)`` is estimated by ``(MS_A + MS_B - MS_E)/(kn)``, never below ``MS_E/(kn)``.

**Test.** ``t = dbar / SE`` against Student's t with ``min(k, n) - 1`` degrees of freedom, the containment
degrees of freedom of the smaller random factor. Satterthwaite's degrees of freedom, the usual choice, let
the 5 % test reject a true null in 6.2 % of 2,000 simulated 29 x 3 studies with a seed x method effect (the
seed term rests on 2 degrees of freedom; its 95 % interval covered 92.5 %); the containment choice keeps the
error at or below alpha (conservative: 1.9 % at 3 x 3, 0.3 % at 29 x 3; ``results/crossed_model_simulation.csv``,
``tests/test_crossed_model.py``). TOST and the intervals use the same SE and degrees of freedom. With three
seeds, a design that shared them cannot decide much about the method: that is what it measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from dmlbench.analysis.statistics import (
    DEFAULT_EQUIVALENCE_MARGIN,
    MIN_VERDICT_PAIRS,
    PairedComparison,
    exact_differences,
    holm_family,
    tests_at_se,
    zero_spread,
)
from dmlbench.errors import UserInputError

# search -> seed (reproduction number) -> score
CrossedScores = Mapping[int, Mapping[int, float]]
CROSSED_MODEL = "crossed search x seed"
SEARCH_MEANS_MODEL = "independent search means"


@dataclass(frozen=True)
class CrossedFit:
    """The crossed model fitted to a ``searches x seeds`` table of paired differences: the mean, its standard
    error and degrees of freedom (module docstring) and the variance components (score units squared)."""

    mean: float
    se: float
    df: int
    search: float
    seed: float
    residual: float
    searches: int
    seeds: int


def crossed_fit(differences: np.ndarray) -> CrossedFit:
    """The crossed search x seed model of a ``searches x seeds`` array of paired differences (at least 2 x 2)."""
    table = np.asarray(differences, dtype=np.float64)
    if table.ndim != 2 or min(table.shape) < 2:
        raise UserInputError(f"a crossed search x seed model needs at least 2 searches of 2 seeds, got shape {table.shape}")
    k, n = table.shape
    grand = float(table.mean())
    search_means, seed_means = table.mean(axis=1), table.mean(axis=0)
    ms_search = float(n * ((search_means - grand) ** 2).sum() / (k - 1))
    ms_seed = float(k * ((seed_means - grand) ** 2).sum() / (n - 1))
    residuals = table - search_means[:, None] - seed_means[None, :] + grand
    ms_residual = float((residuals**2).sum() / ((k - 1) * (n - 1)))
    variance = max(ms_search + ms_seed - ms_residual, ms_residual) / (k * n)
    return CrossedFit(grand, math.sqrt(variance), min(k, n) - 1, max((ms_search - ms_residual) / n, 0.0),
                      max((ms_seed - ms_residual) / k, 0.0), ms_residual, k, n)


def _balanced(a: CrossedScores, b: CrossedScores) -> tuple[list[int], list[int]]:
    """The searches both methods ran and the seeds every one of those searches scored for both (ascending)."""
    searches = sorted(set(a) & set(b))
    seed_sets = [set(a[s]) & set(b[s]) for s in searches]
    seeds = sorted(set.intersection(*seed_sets)) if seed_sets else []
    return searches, seeds


def crossed_comparison(a: CrossedScores, b: CrossedScores, names: tuple[str, str] = ("a", "b"),
                       margin: float = DEFAULT_EQUIVALENCE_MARGIN) -> PairedComparison:
    """``a - b`` under the crossed search x seed model (``search -> seed -> score`` each). ``n`` counts searches;
    the Wilcoxon test is the signed-rank test of the search means (independent only when seeds were fresh,
    so it decides nothing here) and ``cohen_dz`` their standardised mean."""
    searches, seeds = _balanced(a, b)
    if len(searches) < 2 or len(seeds) < 2:
        raise UserInputError(f"comparing {names[0]!r} with {names[1]!r} over shared seeds needs 2 searches of 2 "
                             f"common seeds, got {len(searches)} and {len(seeds)}")
    x = np.array([[a[s][r] for r in seeds] for s in searches], dtype=np.float64)
    y = np.array([[b[s][r] for r in seeds] for s in searches], dtype=np.float64)
    differences = x - y
    fit = crossed_fit(differences)
    w_statistic, w_pvalue = 0.0, 1.0
    exact = exact_differences(x.mean(axis=1), y.mean(axis=1))
    if exact.any():
        result = stats.wilcoxon(exact)
        w_statistic, w_pvalue = float(result.statistic), float(result.pvalue)
    flat = differences.ravel()
    note = ""
    if zero_spread(flat):
        note = f"the {flat.size} paired differences are {'all zero' if not flat.any() else 'identical'}; a spread of zero gives no test"
    elif fit.df + 1 < MIN_VERDICT_PAIRS:
        note = (f"{len(searches)} searches x {len(seeds)} shared seeds: the crossed model's test rests on {fit.df} degree "
                f"of freedom; a verdict needs at least {MIN_VERDICT_PAIRS} of each")
    half = float(stats.t.ppf(0.975, fit.df)) * fit.se
    low, high = fit.mean - half, fit.mean + half
    if note or fit.se == 0.0:
        t_statistic, t_pvalue, tost = (0.0 if not flat.any() else math.nan), 1.0, 1.0
    else:
        t_statistic, t_pvalue, tost, low, high = tests_at_se(fit.mean, fit.se, fit.df, margin)
    spread = float(differences.mean(axis=1).std(ddof=1))
    return PairedComparison(
        a=names[0], b=names[1], n=len(searches), mean_difference=fit.mean, t_statistic=t_statistic, t_pvalue=t_pvalue,
        wilcoxon_statistic=w_statistic, wilcoxon_pvalue=w_pvalue,
        cohen_dz=fit.mean / spread if spread > 0 else (0.0 if fit.mean == 0 else math.nan), t_pvalue_holm=t_pvalue,
        wilcoxon_pvalue_holm=w_pvalue, difference_low=low, difference_high=high, margin=margin,
        tost_pvalue=tost, tost_pvalue_holm=tost, no_verdict=note, df=fit.df, model=CROSSED_MODEL)


def compare_crossed(scores: Mapping[str, CrossedScores], pairs: Sequence[tuple[str, str]],
                    margin: float = DEFAULT_EQUIVALENCE_MARGIN) -> list[PairedComparison]:
    """The given ``(a, b)`` pairs under the crossed model, Holm-adjusted across exactly these pairs per test
    (as ``statistics.compare_pairs``)."""
    return holm_family([crossed_comparison(scores[a], scores[b], (a, b), margin) for a, b in pairs])
