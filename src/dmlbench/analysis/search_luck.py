"""The hyper-parameter search as a source of variance: a method is its search, not one draw of it.

**Model.** Method ``m``'s score in reproduction ``r`` of its ``s``-th search is

    y_msr = mu_m + u_ms + e_msr,   u_ms ~ N(0, sigma_s,m²) (search luck),   e_msr ~ N(0, sigma_e,m²) (seed),

two nested random effects (search, then seed within search) around the method's mean ``mu_m``, the
quantity a verdict about the *method* is about (Bouthillier et al., MLSys 2021, "Accounting for variance
in machine learning benchmarks", randomise the search like every other source of variation).
Searches ``s = 0..k-1`` of every method use the same search seed ``search_seed + s`` and, within a search,
the same training seeds and folds, so two methods pair by search and, within a search, by seed. Under
``protocol.search_seeds: fresh`` (with ``protocol.resplit_per_search``) no search reuses another's seeds or
folds, so ``u_ms`` also holds the fold split's luck and the seed effects ``e_msr`` are drawn anew in every
search: that is what makes the search means independent below. A design whose searches shared their seeds
(every study before the key existed) is judged by ``analysis.crossed`` instead.

**Estimate and test.** For a balanced design with fresh seeds (every method ``k`` searches of ``n`` scored
seeds each), a method's search means ``ybar_ms`` are independent with variance ``sigma_s² + sigma_e²/n``, and the
differences of two methods' search means ``d_s = ybar_as - ybar_bs`` are independent with variance
``sigma_s,a² + sigma_s,b² + Var(ebar_a - ebar_b)``. The exact inference on ``mu_a - mu_b`` in this
two-level model is therefore the one-sample t procedure on the ``k`` differences ``d_s`` (``k - 1``
degrees of freedom): the method-level comparison is ``statistics.compare_pairs`` applied to search
means keyed by search index, with its Holm families, TOST and verdicts unchanged. Seeds within a search
only sharpen each search mean; they cannot replace searches (``sigma_s²`` does not shrink with ``n``).
The variance components are the one-way random-effects ANOVA estimates (method of moments, the search
component truncated at 0): ``sigma_e² = MS_within``, ``sigma_s² = (MS_between - MS_within) / n``.

**One search.** With ``k = 1`` a verdict is conditional on that search. ``search_sd_allowance`` is the
largest search SD (the same for both methods) under which the verdict would still be reached:
the paired test's standard error becomes ``sqrt(2 sigma_s² + s_d²/n)`` (Holm's factor for the
comparison held fixed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from dmlbench.analysis.power import MAX_REPRODUCTIONS, SD_BOUND_CONFIDENCE, holm_strictest_alpha, tost_power, ttest_power
from dmlbench.analysis.statistics import DEFAULT_ALPHA, MIN_VERDICT_PAIRS, PairedComparison
from dmlbench.errors import UserInputError

# method -> search index -> seed (or reproduction number) -> score
SearchScores = Mapping[str, Mapping[int, Mapping[int, float]]]
MAX_SEARCHES = 100  # planning looks no further


@dataclass(frozen=True)
class VarianceComponents:
    """One method's search and seed variances (score units squared) from ``searches`` searches of
    ``reproductions`` seeds each."""

    search: float
    seed: float
    searches: int
    reproductions: int

    @property
    def search_sd(self) -> float:
        return math.sqrt(self.search)

    @property
    def means_variance(self) -> float:
        """The variance of the search means the components imply, ``sigma_s² + sigma_e² / n`` (before
        ``sigma_s²`` was truncated at 0 it was the sample variance of the search means)."""
        return self.search + self.seed / self.reproductions


def search_means(scores: SearchScores) -> dict[str, dict[int, float]]:
    """``method -> search -> mean score`` over the seeds every method scored in that search, for the searches
    every method ran: the units of the method-level comparison (module docstring)."""
    if not scores:
        return {}
    searches = sorted(set.intersection(*(set(by_search) for by_search in scores.values())))
    means: dict[str, dict[int, float]] = {method: {} for method in scores}
    for search in searches:
        seeds = sorted(set.intersection(*(set(by_search[search]) for by_search in scores.values())))
        if not seeds:
            continue
        for method, by_search in scores.items():
            means[method][search] = float(np.mean([by_search[search][seed] for seed in seeds]))
    return means


def variance_components(scores: Mapping[int, Mapping[int, float]]) -> VarianceComponents:
    """The one-way random-effects ANOVA estimates of one method's search and seed variances from
    ``search -> seed -> score`` (balanced: the seeds every search scored; at least two searches of two)."""
    searches = sorted(scores)
    seeds = sorted(set.intersection(*(set(scores[s]) for s in searches))) if searches else []
    if len(searches) < 2 or len(seeds) < 2:
        raise UserInputError(f"variance components need at least 2 searches of 2 common seeds, got {len(searches)} "
                             f"searches and {len(seeds)} common seeds")
    table = np.array([[scores[s][seed] for seed in seeds] for s in searches], dtype=np.float64)
    k, n = table.shape
    within = float(((table - table.mean(axis=1, keepdims=True)) ** 2).sum() / (k * (n - 1)))
    between = float(n * ((table.mean(axis=1) - table.mean()) ** 2).sum() / (k - 1))
    return VarianceComponents(max((between - within) / n, 0.0), within, k, n)


def pooled_search_sd(components: Mapping[str, VarianceComponents]) -> float:
    """The methods' search variances pooled as their mean, as an SD: the search SD a plan assumes for each."""
    return math.sqrt(sum(c.search for c in components.values()) / len(components))


def search_sd_upper_bound(components: Mapping[str, VarianceComponents], confidence: float = SD_BOUND_CONFIDENCE) -> float:
    """An approximate one-sided upper ``confidence`` bound on ``pooled_search_sd``: the methods' variances of
    search means (``k - 1`` degrees of freedom each) pooled and bounded as one chi-square variance,
    ``V_up = V (sum df) / chi²_{1-confidence, sum df}``, less the pooled seed term ``sigma_e² / n`` taken
    as known (it rests on many more degrees of freedom). Approximate: the methods' search-mean variances
    are treated as one, and a search component truncated at 0 enters at its seed term; a pilot's few
    searches cannot see a long tail of unlucky searches, which this bound does not cover either."""
    freedom = sum(c.searches - 1 for c in components.values())
    if freedom < 1:
        raise UserInputError("a search SD bound needs a method with at least 2 searches")
    pooled = sum((c.searches - 1) * c.means_variance for c in components.values()) / freedom
    seed_term = sum((c.searches - 1) * c.seed / c.reproductions for c in components.values()) / freedom
    upper = pooled * freedom / float(stats.chi2.ppf(1.0 - confidence, freedom))
    return math.sqrt(max(upper - seed_term, 0.0))


def search_variance_from_means(means: Mapping[int, float], seed_variance: float, reproductions: int) -> float:
    """A method's search variance from its search means alone (each over ``reproductions`` seeds) and its
    seed variance measured elsewhere (one search's scores): ``Var(search means) - sigma_seed² / n``,
    truncated at 0 (the moment estimate of the module's model)."""
    values = np.array(list(means.values()), dtype=np.float64)
    if values.size < 2 or reproductions < 1:
        raise UserInputError(f"a search variance needs at least 2 searches, got {values.size}")
    return max(float(values.var(ddof=1)) - seed_variance / reproductions, 0.0)


def search_sd_allowance(comparison: PairedComparison, alpha: float = DEFAULT_ALPHA) -> float | None:
    """The largest search SD (score units, the same for both methods) under which a one-search verdict
    still holds: ``inf`` when no search luck could undo it, ``None`` for an inconclusive verdict.

    better / worse: ``|mean| / SE >= t_{1 - alpha_c/2, n-1}`` with ``SE² = 2 sigma² + s_d²/n``; equivalent:
    ``(margin - |mean|) / SE >= t_{1 - alpha_c, n-1}``; ``alpha_c = alpha · p / p_Holm`` keeps the
    comparison's Holm factor. ``s_d / sqrt(n)`` is read off the comparison's 95% interval."""
    outcome = comparison.outcome(alpha)
    if outcome == "inconclusive" or comparison.n < 2:
        return None
    df = comparison.n - 1
    total_se = (comparison.difference_high - comparison.difference_low) / (2 * stats.t.ppf(0.975, df))
    seed_se = math.sqrt(max(total_se**2 - 2 * comparison.search_sd**2, 0.0))  # the assumed search luck taken out
    if outcome == "equivalent":
        factor = comparison.tost_pvalue_holm / comparison.tost_pvalue if comparison.tost_pvalue > 0 else 1.0
        room, critical = comparison.margin - abs(comparison.mean_difference), stats.t.ppf(1 - alpha / factor, df)
    else:
        factor = comparison.t_pvalue_holm / comparison.t_pvalue if comparison.t_pvalue > 0 else 1.0
        room, critical = abs(comparison.mean_difference), stats.t.ppf(1 - alpha / (2 * factor), df)
    largest_se = float(room / critical)
    if not math.isfinite(seed_se) or seed_se <= 0.0:
        return math.inf if largest_se > 0 else 0.0
    return float(math.sqrt(max(largest_se**2 - seed_se**2, 0.0) / 2.0))


@dataclass(frozen=True)
class Design:
    """A benchmark design over searches and seeds and what it buys: ``searches`` per method, ``reproductions``
    per search, the training runs it costs per method (``folds`` each of ``trials`` search trials and
    ``reproductions`` reproductions, per search) and the power of the method-level tests at the strictest
    Holm threshold (t-test at a true difference of one margin, TOST at 0)."""

    searches: int
    reproductions: int
    runs_per_method: int
    ttest_power: float
    tost_power: float


def design_power(searches: int, reproductions: int, search_sd: float, seed_sd: float, margin: float, comparisons: int,
                 alpha: float = DEFAULT_ALPHA) -> tuple[float, float]:
    """Power of the method-level t-test and TOST with ``searches`` paired search means of ``reproductions``
    seeds, for two methods of search SD ``search_sd`` each and paired seed differences of SD ``seed_sd``."""
    sd = math.sqrt(2 * search_sd**2 + seed_sd**2 / reproductions)
    strict = holm_strictest_alpha(alpha, comparisons)
    return ttest_power(searches, margin, sd, strict), tost_power(searches, 0.0, margin, sd, strict)


def cheapest_design(search_sd: float, seed_sd: float, margin: float, comparisons: int, trials: int, folds: int,
                    target: float = 0.8, alpha: float = DEFAULT_ALPHA) -> Design | None:
    """``cheapest_family_design`` for one spread, ``search_sd`` per method and ``seed_sd`` of the paired seed differences."""
    return cheapest_family_design([(search_sd, seed_sd)], margin, comparisons, trials, folds, target, alpha)


def cheapest_family_design(spreads: Sequence[tuple[float, float]], margin: float, comparisons: int, trials: int,
                           folds: int, target: float = 0.8, alpha: float = DEFAULT_ALPHA) -> Design | None:
    """The design of fewest training runs per method whose method-level t-test and TOST both reach ``target``
    power for every comparison of the family (``spreads``: each comparison's search SD per method,
    ``statistics.pair_search_sd``, and the SD of its paired seed differences; ties: fewer searches); ``None``
    when none within ``MAX_SEARCHES`` searches does. A search's cost (``trials`` trials of ``folds`` runs) is
    paid once per search, a reproduction's (``folds`` runs) once per search and seed. For each number of
    searches the fewest seeds reaching the target are found by bisection (power grows with seeds, towards its
    limit at the search luck alone). The design's powers are its weakest comparison's."""
    def powers(searches: int, reproductions: int) -> tuple[float, float]:
        found = [design_power(searches, reproductions, search_sd, seed_sd, margin, comparisons, alpha)
                 for search_sd, seed_sd in spreads]
        return min(t for t, _ in found), min(tost for _, tost in found)

    def reaches(searches: int, reproductions: int) -> bool:
        return min(powers(searches, reproductions)) >= target

    best: Design | None = None
    for searches in range(MIN_VERDICT_PAIRS, MAX_SEARCHES + 1):  # fewer search pairs carry no verdict
        if best is not None and searches * folds * (trials + 2) >= best.runs_per_method:
            break  # every further design costs more than the best one already found
        if not reaches(searches, MAX_REPRODUCTIONS):
            continue  # more seeds cannot make up for this few searches
        low, high = 2, MAX_REPRODUCTIONS  # two seeds per search suffice: the verdict's pairs are the searches
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if reaches(searches, middle) else (middle + 1, high)
        runs = searches * folds * (trials + low)
        if best is None or runs < best.runs_per_method:
            best = Design(searches, low, runs, *powers(searches, low))
    return best


def cheapest_over_trials(designs: Mapping[int, Design | None]) -> tuple[int, Design] | None:
    """Bouthillier et al. (MLSys 2021), shorter searches repeated more often: of the cheapest designs at
    each number of trials per search (``designs``: trials -> ``cheapest_design`` at the search SD measured
    with that many), the one of fewest training runs per method, with its trials per search; ties go to
    fewer trials; ``None`` when none reaches the power. A shorter search costs less, its choice varies more."""
    found = [(trials, design) for trials, design in sorted(designs.items()) if design is not None]
    return min(found, key=lambda pair: (pair[1].runs_per_method, pair[0])) if found else None
