"""Sequential verdicts about the methods: the declared comparisons judged after each round of searches, each
stopping once decided, with the family's error rates kept however many looks are taken.

Model: search ``k`` of every method draws its own seeds and folds (``protocol.search_seeds: fresh``), so the
per-search differences ``d_k = mean_r(score_a[k, r]) - mean_r(score_b[k, r])`` of a comparison are independent
draws of one normal law whose mean is the difference between the methods, their search included (the two-level
model of ``analysis.search_luck``). After ``n`` searches a comparison's statistic is the one-sample t of its
``d_1..d_n`` on ``n - 1`` degrees of freedom, looked at when ``n`` reaches each multiple of ``round_searches``
up to ``max_searches``.

Tests, each at every look (Jennison and Turnbull 2000, ch. 3, 6 and 9):

- *better / worse*: two-sided group-sequential t-test whose boundary spends the comparison's level over the
  information fraction ``n / max_searches`` (``group_sequential.boundaries``, Lan and DeMets 1983); the interval
  is the repeated confidence interval it inverts;
- *equivalent*: TOST within ``±margin`` with both one-sided tests on the one-sided boundary spending the level
  (the equivalence interval is the repeated interval at ``1 - 2 level``);
- *Holm across the family* in its graphical form for group-sequential tests (Maurer and Bretz 2013): every
  comparison starts at ``alpha / m``; a rejection passes its share to the others, whose boundaries are then those
  of the larger level at every look; better/worse and equivalent are two families, each at ``alpha``;
- *futility* (non-binding, so no error rate depends on it): from half of ``max_searches`` on, an undecided
  comparison stops when the conditional power of deciding either way by ``max_searches``, at the current
  estimate, is below ``futility_power``.

A comparison stops at its first decision; a method runs no more searches once none of its comparisons is open.
Assumptions: the per-search differences are normal (a t statistic carries the normal boundary through its tail
probability, Jennison and Turnbull 2000, section 3.8), and every method's searches are independent of the
decisions. ``analysis.sequential_simulation`` checks the error rates under the design as it runs."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import special

from dmlbench.analysis.group_sequential import Spending, boundaries, nominal_quantile, t_quantile
from dmlbench.analysis.statistics import DEFAULT_ALPHA, DEFAULT_EQUIVALENCE_MARGIN

# Below this conditional power of deciding by the last look, an open comparison is futile; judged only from
# this fraction of the planned searches on (earlier, with a few degrees of freedom, the estimate that power
# rests on is too noisy: futility there cost a fifth of the power in simulations of the built-in design).
FUTILITY_POWER = 0.1
FUTILITY_FROM = 0.5
# The power at which ``searches_to_decide`` expects a comparison to be decided.
DECIDING_POWER = 0.8
# How far ``searches_to_decide`` looks (in searches) before saying a comparison would take longer.
SEARCHES_LOOKED_AHEAD = 10_000
BETTER, WORSE, EQUIVALENT, FUTILE, CONTINUE, INCONCLUSIVE = ("better", "worse", "equivalent", "futile", "continue",
                                                             "inconclusive")
DECIDED = (BETTER, WORSE, EQUIVALENT)

Pair = tuple[str, str]


@dataclass(frozen=True)
class SequentialDesign:
    """The sequential design, declared before any data: looks after every ``round_searches`` searches up to
    ``max_searches``, the family's ``alpha`` for each kind of verdict, the equivalence ``margin``, the spending
    function and the futility threshold."""

    max_searches: int
    round_searches: int
    alpha: float = DEFAULT_ALPHA
    margin: float = DEFAULT_EQUIVALENCE_MARGIN
    spending: Spending = "pocock"
    futility_power: float = FUTILITY_POWER

    def __post_init__(self) -> None:
        if self.round_searches < 2:
            raise ValueError(f"round_searches must be at least 2 (a t statistic needs two searches), got {self.round_searches}")
        if self.max_searches < self.round_searches:
            raise ValueError(f"max_searches ({self.max_searches}) must be at least round_searches ({self.round_searches})")

    @property
    def looks(self) -> tuple[int, ...]:
        """The searches at each look: every multiple of ``round_searches``, then ``max_searches``."""
        found = list(range(self.round_searches, self.max_searches + 1, self.round_searches))
        return tuple(found if found[-1] == self.max_searches else [*found, self.max_searches])

    def fractions(self, looks: int | None = None) -> tuple[float, ...]:
        """The information fractions of the first ``looks`` looks (all: ``None``)."""
        return tuple(n / self.max_searches for n in self.looks[:looks])


@dataclass(frozen=True)
class LookRow:
    """One comparison at one look: its differences' mean (``estimate``) and SD, the levels it was tested at, the
    t quantiles its boundaries give (``boundary``, ``equivalence_boundary``), the intervals they invert and
    the decision; ``conditional_power``: of deciding either way by ``max_searches`` at the current estimate."""

    a: str
    b: str
    look: int
    searches: int
    estimate: float
    sd: float
    t_statistic: float
    level: float
    boundary: float
    ci_low: float
    ci_high: float
    equivalence_level: float
    equivalence_boundary: float
    equivalence_ci_low: float
    equivalence_ci_high: float
    conditional_power: float
    searches_to_decide: int | None
    decision: str


@dataclass(frozen=True)
class SequentialJudgement:
    """Every look taken so far (``rows``), the last row of each comparison judged at least once (``latest``) and
    the searches each method needs for the next look (``next_searches``; empty once no comparison is open)."""

    design: SequentialDesign
    comparisons: tuple[Pair, ...]
    rows: tuple[LookRow, ...]
    next_searches: dict[str, int] = field(default_factory=dict)

    @property
    def latest(self) -> dict[Pair, LookRow]:
        return {(row.a, row.b): row for row in self.rows}

    @property
    def finished(self) -> bool:
        """Whether every comparison is closed: decided, futile or inconclusive at ``max_searches``."""
        return not self.next_searches

    def looks_taken(self) -> int:
        return max((row.look for row in self.rows), default=0)


def method_search_means(scores: Mapping[str, Mapping[int, Mapping[int, float]]]) -> dict[str, dict[int, float]]:
    """``method -> search -> mean over its reproductions`` from ``method -> search -> reproduction -> score``;
    each method's own searches (a comparison pairs them by index, ``differences``)."""
    return {method: {search: float(np.mean(list(values.values()))) for search, values in sorted(by_search.items()) if values}
            for method, by_search in scores.items()}


def differences(means: Mapping[str, Mapping[int, float]], pair: Pair, searches: int) -> np.ndarray | None:
    """The per-search differences ``a - b`` of searches ``0..searches-1``; ``None`` while any is missing."""
    a, b = (means.get(method, {}) for method in pair)
    if any(k not in a or k not in b for k in range(searches)):
        return None
    return np.array([a[k] - b[k] for k in range(searches)], dtype=np.float64)


def judge_sequentially(means: Mapping[str, Mapping[int, float]], comparisons: Sequence[Pair],
                       design: SequentialDesign) -> SequentialJudgement:
    """The family ``comparisons`` judged look by look on each method's search means (``method -> search ->
    mean over its reproductions``), as far as the searches run so far allow (see the module docstring)."""
    comparisons = tuple(comparisons)
    rows: list[LookRow] = []
    closed: dict[Pair, str] = {}
    rejected: dict[str, set[Pair]] = {"difference": set(), "equivalence": set()}
    for index, searches in enumerate(design.looks):
        open_pairs = [pair for pair in comparisons if pair not in closed]
        if not open_pairs:
            break
        found = {pair: differences(means, pair, searches) for pair in open_pairs}
        if any(values is None for values in found.values()):
            needed = {method for pair in open_pairs for method in pair}
            return SequentialJudgement(design, comparisons, tuple(rows), {method: searches for method in sorted(needed)})
        look = _Look(design, index, len(comparisons), found)  # type: ignore[arg-type]
        look.test(rejected)
        for pair in open_pairs:
            row = look.row(pair, last=index == len(design.looks) - 1)
            rows.append(row)
            if row.decision != CONTINUE:
                closed[pair] = row.decision
    return SequentialJudgement(design, comparisons, tuple(rows))


class _Look:
    """The open comparisons at one look: their statistics, then the two Holm families tested on them."""

    def __init__(self, design: SequentialDesign, index: int, family: int, found: Mapping[Pair, np.ndarray]) -> None:
        self.design, self.index, self.family, self.found = design, index, family, found
        self.searches = design.looks[index]
        self.df = self.searches - 1
        self.mean = {pair: float(values.mean()) for pair, values in found.items()}
        self.sd = {pair: float(values.std(ddof=1)) for pair, values in found.items()}
        self.level: dict[Pair, float] = {}
        self.equivalence_level: dict[Pair, float] = {}
        self.decided: dict[Pair, str] = {}

    def quantile(self, level: float, two_sided: bool, look: int | None = None, df: int | None = None) -> float:
        """The t quantile of the boundary spending ``level`` at look ``look`` (this one: ``None``)."""
        look = self.index if look is None else look
        return nominal_quantile(boundaries(level, self.design.fractions(look + 1), self.design.spending, two_sided)[look],
                                self.df if df is None else df)

    def t(self, pair: Pair) -> float:
        mean, sd = self.mean[pair], self.sd[pair]
        if sd == 0.0:
            return 0.0 if mean == 0.0 else math.copysign(math.inf, mean)
        return mean / (sd / math.sqrt(self.searches))

    def test(self, rejected: dict[str, set[Pair]]) -> None:
        """Holm, graphical form: test at ``alpha / (m - rejections so far)``; after a rejection, again."""
        for kind, two_sided in (("difference", True), ("equivalence", False)):
            levels, rejected_here = self.level if kind == "difference" else self.equivalence_level, set()
            while len(rejected[kind]) < self.family:
                level = self.design.alpha / (self.family - len(rejected[kind]))
                levels.update({pair: level for pair in self.found if pair not in rejected_here})
                quantile = self.quantile(level, two_sided)
                newly = [pair for pair in self.found if pair not in self.decided and self._rejects(kind, pair, quantile)]
                if not newly:
                    break
                for pair in newly:
                    rejected[kind].add(pair)
                    rejected_here.add(pair)
                    self.decided[pair] = EQUIVALENT if kind == "equivalence" else (BETTER if self.mean[pair] > 0 else WORSE)

    def _rejects(self, kind: str, pair: Pair, quantile: float) -> bool:
        if kind == "difference":
            return abs(self.t(pair)) >= quantile
        low, high = self._interval(pair, quantile)
        return -self.design.margin < low and high < self.design.margin

    def _interval(self, pair: Pair, quantile: float) -> tuple[float, float]:
        half = quantile * self.sd[pair] / math.sqrt(self.searches)
        if math.isnan(half):  # an infinite quantile on differences without spread: nothing is excluded
            half = math.inf
        return self.mean[pair] - half, self.mean[pair] + half

    def row(self, pair: Pair, last: bool) -> LookRow:
        level, equivalence_level = self.level[pair], self.equivalence_level[pair]
        quantile, equivalence_quantile = self.quantile(level, True), self.quantile(equivalence_level, False)
        power = conditional_power(self.mean[pair], self.sd[pair], self.searches, self.design.max_searches,
                                  self._final_quantiles(level, equivalence_level), self.design.margin)
        futile = power < self.design.futility_power and self.searches >= FUTILITY_FROM * self.design.max_searches
        decision = self.decided.get(pair, INCONCLUSIVE if last else (FUTILE if futile else CONTINUE))
        return LookRow(pair[0], pair[1], self.index + 1, self.searches, self.mean[pair], self.sd[pair], self.t(pair),
                       level, quantile, *self._interval(pair, quantile), equivalence_level, equivalence_quantile,
                       *self._interval(pair, equivalence_quantile), power,
                       None if decision in DECIDED else self.searches_to_decide(pair, level, equivalence_level), decision)

    def _final_quantiles(self, level: float, equivalence_level: float) -> tuple[float, float]:
        """The t quantiles of the last planned look's boundaries at these levels."""
        last, df = len(self.design.looks) - 1, self.design.max_searches - 1
        return self.quantile(level, True, last, df), self.quantile(equivalence_level, False, last, df)

    def searches_to_decide(self, pair: Pair, level: float, equivalence_level: float) -> int | None:
        """The fewest searches at which a fixed analysis at the comparison's current levels decides it with
        ``DECIDING_POWER`` if the current estimate and SD are the truth (bisection on that power, which grows
        with the searches); ``None`` beyond ``SEARCHES_LOOKED_AHEAD``."""
        def decides(searches: int) -> bool:
            quantiles = t_quantile(level / 2, searches - 1), t_quantile(equivalence_level, searches - 1)
            return fixed_power(self.mean[pair], self.sd[pair], searches, quantiles, self.design.margin) >= DECIDING_POWER

        low, high = self.searches, self.searches + 1
        while not decides(high):
            if high >= SEARCHES_LOOKED_AHEAD:
                return None
            low, high = high, min(2 * high, SEARCHES_LOOKED_AHEAD)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if decides(middle) else (middle, high)
        return high


def conditional_power(mean: float, sd: float, searches: int, final: int, quantiles: tuple[float, float],
                      margin: float) -> float:
    """P(the analysis at ``final`` searches decides, better/worse or equivalent) given the ``searches`` seen, if
    their mean and SD are the truth: the final mean is normal around ``mean`` with variance ``(final -
    searches) sd² / final²``; ``quantiles``: the final look's difference and equivalence t quantiles."""
    if searches >= final or sd == 0.0:
        return 0.0
    spread = math.sqrt(final - searches) * sd / final
    return _deciding_probability(mean, spread, sd / math.sqrt(final), quantiles, margin)


def fixed_power(mean: float, sd: float, searches: int, quantiles: tuple[float, float], margin: float) -> float:
    """P(a fixed analysis of ``searches`` searches decides), if ``mean`` and ``sd`` are the truth (normal approximation)."""
    if sd == 0.0:
        return 1.0
    error = sd / math.sqrt(searches)
    return _deciding_probability(mean, error, error, quantiles, margin)


def _deciding_probability(mean: float, spread: float, error: float, quantiles: tuple[float, float], margin: float) -> float:
    """P(|M| >= q_d * error or |M| < margin - q_e * error) for the final mean ``M ~ N(mean, spread²)``."""
    difference, equivalence = quantiles[0] * error, margin - quantiles[1] * error
    decided = float(special.ndtr((mean - difference) / spread) + special.ndtr((-difference - mean) / spread))
    if equivalence > 0:
        decided += float(special.ndtr((equivalence - mean) / spread) - special.ndtr((-equivalence - mean) / spread))
    return min(decided, 1.0)


# ``sequential.csv``: one row per comparison and look.
SEQUENTIAL_COLUMNS = ("mode", "metric", "a", "b", "look", "searches", "estimate", "sd", "t_statistic", "alpha_level",
                      "boundary", "ci_low", "ci_high", "equivalence_alpha_level", "equivalence_boundary",
                      "equivalence_ci_low", "equivalence_ci_high", "equivalence_margin", "conditional_power",
                      "searches_to_decide", "decision")


def sequential_csv(judgement: SequentialJudgement, endpoint: tuple[str, str]) -> str:
    """``sequential.csv``: every look at every comparison of the primary endpoint (floats as their repr)."""
    stream = io.StringIO()
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(SEQUENTIAL_COLUMNS)
    for row in judgement.rows:
        writer.writerow([*endpoint, row.a, row.b, row.look, row.searches, repr(row.estimate), repr(row.sd),
                         repr(row.t_statistic), repr(row.level), repr(row.boundary), repr(row.ci_low), repr(row.ci_high),
                         repr(row.equivalence_level), repr(row.equivalence_boundary), repr(row.equivalence_ci_low),
                         repr(row.equivalence_ci_high), repr(judgement.design.margin), repr(row.conditional_power),
                         "" if row.searches_to_decide is None else row.searches_to_decide, row.decision])
    return stream.getvalue()
