"""The sequential design checked by simulation under the two-level model, as the protocol runs it: every method's
search ``k`` scores ``mu_m + u_mk + e_mkr`` (``u ~ N(0, search_sd_m²)`` its search's luck, ``e ~ N(0, seed_sd_m²)``
each reproduction's seed, all independent: fresh seeds and folds per search), the comparisons are judged by
``sequential.judge_sequentially`` look by look and stop as they do in a study. Drawing every search up front and
letting the judgement read only the searches it reaches is the same study: searches are independent of the
decisions, and a stopped comparison reads none of the later ones. The fixed design of the same maximum judges all
``max_searches`` at once by the report's rule (``statistics.PairedComparison.outcome`` of ``compare_pairs``: Holm's
paired t-test, else Holm's TOST), computed for every simulated study at once (``fixed_outcomes``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from dmlbench.analysis.sequential import BETTER, DECIDED, EQUIVALENT, WORSE, Pair, SequentialDesign, judge_sequentially
from dmlbench.analysis.statistics import MIN_VERDICT_PAIRS, decide, holm


@dataclass(frozen=True)
class TwoLevelModel:
    """The truth a simulation draws from: each method's mean, search SD and seed SD, and the reproductions per search."""

    means: Mapping[str, float]
    search_sd: Mapping[str, float]
    seed_sd: Mapping[str, float]
    reproductions: int

    def draw(self, searches: int, rng: np.random.Generator) -> dict[str, dict[int, float]]:
        """Every method's search means (mean over its reproductions) for searches ``0..searches-1``."""
        drawn = {}
        for method in sorted(self.means):
            luck = rng.normal(0.0, self.search_sd[method], searches)
            seeds = rng.normal(0.0, self.seed_sd[method], (searches, self.reproductions)).mean(axis=1)
            drawn[method] = {k: float(self.means[method] + luck[k] + seeds[k]) for k in range(searches)}
        return drawn


@dataclass(frozen=True)
class SimulationSummary:
    """What ``studies`` simulated studies gave: the family-wise rates of a wrong better/worse (a difference declared
    where there is none, or in the wrong direction) and of a wrong equivalent (declared where the true difference is
    at least the margin), each comparison's rate of a decision (``decided``) and mean searches at its stop, and the
    mean searches all methods ran together, beside the same for the fixed design of ``max_searches``."""

    studies: int
    wrong_difference: float
    wrong_equivalence: float
    decided: dict[Pair, float]
    searches: dict[Pair, float]
    method_searches: float
    fixed_wrong_difference: float
    fixed_wrong_equivalence: float
    fixed_decided: dict[Pair, float]
    fixed_method_searches: int
    # The spread of the stopping time: each comparison's searches at its stop and all methods' searches together,
    # as (10%, 50%, 90%) quantiles; the mean number of comparisons decided by each look.
    searches_quantiles: dict[Pair, tuple[float, float, float]]
    method_searches_quantiles: tuple[float, float, float]
    decided_by_look: tuple[float, ...]

    def monte_carlo_error(self, rate: float) -> float:
        """The binomial standard error of a rate estimated from ``studies`` studies."""
        return math.sqrt(max(rate * (1 - rate), 1e-12) / self.studies)


def _wrong(decision: str, truth_difference: float, margin: float) -> tuple[bool, bool]:
    """Whether ``decision`` is a wrong better/worse and whether it is a wrong equivalent."""
    wrong_difference = (decision == BETTER and truth_difference <= 0) or (decision == WORSE and truth_difference >= 0)
    return wrong_difference, decision == EQUIVALENT and abs(truth_difference) >= margin


def simulate(model: TwoLevelModel, comparisons: Sequence[Pair], design: SequentialDesign, studies: int,
             seed: int, fixed: bool = True) -> SimulationSummary:
    """``studies`` studies of ``design`` drawn from ``model`` with ``numpy.random.default_rng(seed)``; ``fixed``:
    judge each study's ``max_searches`` searches by the fixed design too (slower: it runs every paired test)."""
    rng = np.random.default_rng(seed)
    truth = {pair: model.means[pair[0]] - model.means[pair[1]] for pair in comparisons}
    counts = {"difference": 0, "equivalence": 0, "fixed_difference": 0, "fixed_equivalence": 0}
    decided = dict.fromkeys(comparisons, 0)
    fixed_decided = dict.fromkeys(comparisons, 0)
    stops: dict[Pair, list[int]] = {pair: [] for pair in comparisons}
    method_searches: list[int] = []
    by_look = np.zeros(len(design.looks))
    differences = np.empty((studies if fixed else 0, len(comparisons), design.max_searches))
    for study in range(studies):
        drawn = model.draw(design.max_searches, rng)
        latest = judge_sequentially(drawn, comparisons, design).latest
        wrong = [_wrong(latest[pair].decision, truth[pair], design.margin) for pair in comparisons]
        counts["difference"] += any(w[0] for w in wrong)
        counts["equivalence"] += any(w[1] for w in wrong)
        for pair in comparisons:
            decided[pair] += latest[pair].decision in DECIDED
            stops[pair].append(latest[pair].searches)
            if latest[pair].decision in DECIDED:
                by_look[latest[pair].look - 1:] += 1
        method_searches.append(sum(max(latest[p].searches for p in comparisons if method in p)
                                   for method in {m for p in comparisons for m in p}))
        if fixed:
            differences[study] = [[drawn[a][k] - drawn[b][k] for k in range(design.max_searches)] for a, b in comparisons]
    for outcomes in fixed_outcomes(differences, design.margin, design.alpha):
        wrong = [_wrong(outcome, truth[pair], design.margin) for pair, outcome in zip(comparisons, outcomes)]
        counts["fixed_difference"] += any(w[0] for w in wrong)
        counts["fixed_equivalence"] += any(w[1] for w in wrong)
        for pair, outcome in zip(comparisons, outcomes):
            fixed_decided[pair] += outcome in DECIDED
    methods = len({m for p in comparisons for m in p})
    return SimulationSummary(
        studies, counts["difference"] / studies, counts["equivalence"] / studies,
        {pair: n / studies for pair, n in decided.items()}, {pair: float(np.mean(n)) for pair, n in stops.items()},
        float(np.mean(method_searches)), counts["fixed_difference"] / studies, counts["fixed_equivalence"] / studies,
        {pair: n / studies for pair, n in fixed_decided.items()}, methods * design.max_searches,
        {pair: _quantiles(n) for pair, n in stops.items()}, _quantiles(method_searches), tuple(by_look / studies))


def fixed_outcomes(differences: np.ndarray, margin: float, alpha: float) -> list[list[str]]:
    """``PairedComparison.outcome`` of ``compare_pairs`` for each study (axis 0) and comparison (axis 1) of paired
    differences ``a - b`` (axis 2, one per search): Holm's two-sided paired t-test across the comparisons below
    ``alpha`` (better or worse by the sign), else Holm's TOST within ``±margin`` (equivalent), else inconclusive; a
    difference without spread (its p-values 1) or with fewer than ``MIN_VERDICT_PAIRS`` pairs is inconclusive."""
    n = differences.shape[2]
    mean = differences.mean(axis=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        se = differences.std(axis=2, ddof=1) / math.sqrt(n) if n > 1 else np.zeros(mean.shape)
        two_sided = 2 * stats.t.sf(np.abs(mean / se), n - 1)
        tost = np.maximum(stats.t.sf((mean + margin) / se, n - 1), stats.t.sf((margin - mean) / se, n - 1))
    # No spread, no evidence: p-values of 1, which ease Holm for none of the others (``paired_comparison``).
    constant = np.ptp(differences, axis=2) <= 1e-9 * np.abs(differences).max(axis=2)
    two_sided, tost = np.where(constant, 1.0, two_sided), np.where(constant, 1.0, tost)
    no_verdict = constant | (n < MIN_VERDICT_PAIRS)
    two_sided_holm, tost_holm = (np.array([holm(row) for row in p]).reshape(p.shape) for p in (two_sided, tost))
    return [[decide(bool(gone), t, e, m, alpha) for gone, t, e, m in zip(*row)]
            for row in zip(no_verdict, two_sided_holm, tost_holm, mean)]


def _quantiles(values: Sequence[int]) -> tuple[float, float, float]:
    return tuple(float(q) for q in np.quantile(values, [0.1, 0.5, 0.9]))  # type: ignore[return-value]


def pilot_model(scores: Mapping[str, Mapping[int, float]], search_sd: float | Mapping[str, float],
                reproductions: int) -> TwoLevelModel:
    """The two-level model a pilot gives: each method's mean and seed SD over its reproductions (one search), the
    search SD measured or stated (one for every method, or per method)."""
    spread = {m: (search_sd if isinstance(search_sd, float) else search_sd[m]) for m in scores}
    return TwoLevelModel({m: float(np.mean(list(v.values()))) for m, v in scores.items()}, spread,
                         {m: float(np.std(list(v.values()), ddof=1)) for m, v in scores.items()}, reproductions)


def plan_text(model: TwoLevelModel, comparisons: Sequence[Pair], design: SequentialDesign, source: str,
              studies: int = 1000, seed: int = 0) -> str:
    """``dmlbench plan``'s lines on a sequential design: each comparison's chance of a decision and its stopping
    time, and the searches all methods run together, against the fixed design of ``max_searches``."""
    summary = simulate(model, comparisons, design, studies, seed)
    lines = [f"sequential design: looks at {', '.join(map(str, design.looks))} searches per method "
             f"({design.spending.replace('_', ' ')}-type spending, alpha {design.alpha:g}, Holm over {len(comparisons)} "
             f"comparison(s), futility below {design.futility_power:g} conditional power); {studies} simulated studies "
             f"of the two-level model at {source}, {model.reproductions} reproductions per search:"]
    for pair in comparisons:
        low, median, high = summary.searches_quantiles[pair]
        lines.append(f"  {pair[0]} vs {pair[1]} (difference {100 * (model.means[pair[0]] - model.means[pair[1]]):+.2f} "
                     f"points): decided in {100 * summary.decided[pair]:.0f}% (the fixed design of {design.max_searches}: "
                     f"{100 * summary.fixed_decided[pair]:.0f}%), stops after {median:g} searches (10-90%: {low:g}-{high:g})")
    low, median, high = summary.method_searches_quantiles
    decided = ", ".join(f"{n}: {mean:.1f}" for n, mean in zip(design.looks, summary.decided_by_look))
    lines.append(f"  all methods together: {summary.method_searches:.1f} searches on average (10-90%: {low:g}-{high:g}) "
                 f"against {summary.fixed_method_searches} for the fixed design; comparisons decided by the look at "
                 f"{decided} (each search costs what the dry run prints per search)")
    return "\n".join(lines)
