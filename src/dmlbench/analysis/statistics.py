"""Statistics over reproductions: t-intervals, paired tests with Holm correction, effect sizes and the
verdict of a comparison (``analysis.correlations`` holds the correlations, rank agreement and the
lag-one autocorrelation).

Musgrave et al. 2020 (seed 001) §3.3-§4 report the mean of 10 reproductions with a 95% confidence
interval; this module computes that interval with the Student-t distribution
(``mean ± t_{0.975, n-1} · s / sqrt(n)``, ``s`` with ``n - 1`` degrees of freedom). Two methods are
compared on reproductions *paired by seed* (reproduction ``i`` of both methods used seed ``i``):
the paired t-test and the Wilcoxon signed-rank test (``scipy.stats.ttest_rel`` / ``wilcoxon``), with
Holm's step-down correction across all compared pairs (Holm 1979) and Cohen's ``d_z`` (mean of the
differences over their standard deviation) as effect size. "No significant difference" is not
equivalence: ``equivalence_pvalue`` is the two one-sided tests procedure (TOST, Schuirmann 1987) of
``|mean difference| < margin``, Holm-corrected over the same family, and ``outcome`` names the four
verdicts.

All functions take plain floats and return plain floats; the heavy lifting is ``scipy.stats``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np
from scipy import stats

from dmlbench.analysis.search_sd import SearchSD, pair_search_sd, se_with_search_luck
from dmlbench.errors import UserInputError

DEFAULT_CONFIDENCE = 0.95
DEFAULT_ALPHA = 0.05
DEFAULT_EQUIVALENCE_MARGIN = 0.01  # one percentage point of a score in [0, 1]
OUTCOMES = ("better", "worse", "equivalent", "inconclusive")
# Fewer paired differences than this give no verdict: with two, the spread rests on one degree of
# freedom, and a significant t-test there needs |d_z| >= 9, i.e. two numbers that happened to fall
# close together (with a discrete metric such as P@1, often exactly together).
MIN_VERDICT_PAIRS = 3


@dataclass(frozen=True)
class Interval:
    """Mean of ``n`` values and its two-sided Student-t confidence interval ``[low, high]``."""

    mean: float
    low: float
    high: float
    n: int
    confidence: float = DEFAULT_CONFIDENCE


@dataclass(frozen=True)
class PairedComparison:
    """Method ``a`` against method ``b`` on reproductions paired by seed (``difference = a - b``).

    ``t_pvalue_holm`` / ``wilcoxon_pvalue_holm`` / ``tost_pvalue_holm`` are Holm-adjusted across every
    pair compared in the same call of ``compare_methods`` / ``compare_pairs`` (equal to the raw
    p-values from ``paired_comparison`` alone); ``tost_pvalue`` tests equivalence within ``±margin``.
    """

    a: str
    b: str
    n: int
    mean_difference: float
    t_statistic: float
    t_pvalue: float
    wilcoxon_statistic: float
    wilcoxon_pvalue: float
    cohen_dz: float
    t_pvalue_holm: float
    wilcoxon_pvalue_holm: float
    difference_low: float  # the 95% Student-t interval of the mean difference
    difference_high: float
    margin: float = DEFAULT_EQUIVALENCE_MARGIN
    tost_pvalue: float = math.nan
    tost_pvalue_holm: float = math.nan
    no_verdict: str = ""  # why these differences cannot carry a verdict (``spread_note``); "" when they can
    # The search-luck SD each method's one search is assumed to carry (``analysis.search_sd``; 0: none assumed,
    # the verdict is about this draw of the searches): the t-test, TOST and interval then use
    # ``SE² = 2 search_sd² + s_d²/n`` (``analysis.search_luck``).
    search_sd: float = 0.0
    # The test's degrees of freedom where they are not ``n - 1`` (``analysis.crossed``: NaN reads as ``n - 1``)
    # and the model of the method-level comparison (``analysis.crossed``: its constants; "" for seeds paired).
    df: float = math.nan
    model: str = ""

    @property
    def degrees_of_freedom(self) -> float:
        """The degrees of freedom of the t-test, TOST and intervals: ``df``, else ``n - 1``."""
        return self.n - 1 if math.isnan(self.df) else self.df

    def swapped(self) -> "PairedComparison":
        """The same comparison read as ``b - a``: the same tests and p-values, the signs and the interval turned."""
        return replace(self, a=self.b, b=self.a, mean_difference=-self.mean_difference, t_statistic=-self.t_statistic,
                       cohen_dz=-self.cohen_dz, difference_low=-self.difference_high, difference_high=-self.difference_low)

    def outcome(self, alpha: float = DEFAULT_ALPHA) -> str:
        """``better`` / ``worse`` (Holm-adjusted paired t-test below ``alpha``), else ``equivalent`` (Holm-adjusted
        TOST below ``alpha``: the whole difference lies within ``±margin``), else ``inconclusive``.

        A difference both significant and within the margin is reported as better or worse: it is
        real, if small (``mean_difference`` says how small). Differences without a usable spread
        (``no_verdict``) are inconclusive whatever their p-values."""
        return decide(bool(self.no_verdict), self.t_pvalue_holm, self.tost_pvalue_holm, self.mean_difference, alpha)

    def verdict(self, alpha: float = DEFAULT_ALPHA) -> str:
        """``outcome`` as a table shows it: with the reason when the differences gave no verdict."""
        return f"{self.outcome(alpha)} ({self.no_verdict})" if self.no_verdict else self.outcome(alpha)


def decide(no_verdict: bool, t_pvalue_holm: float, tost_pvalue_holm: float, mean_difference: float, alpha: float) -> str:
    """The rule of ``PairedComparison.outcome`` on its parts (``sequential_simulation`` applies it to simulated studies)."""
    if no_verdict:
        return "inconclusive"
    if t_pvalue_holm < alpha:
        return "better" if mean_difference > 0 else "worse"
    return "equivalent" if tost_pvalue_holm < alpha else "inconclusive"


# The tests every comparison runs, each with its p-value ``<test>_pvalue`` and, across a family, its Holm-adjusted
# ``<test>_pvalue_holm`` (fields of ``PairedComparison``; the verdict files' columns are ``verdicts.CELLS``).
PAIRED_TESTS = ("t", "wilcoxon", "tost")
# The largest denominator a score is read with as a fraction (``exact_differences``): queries x fold models.
EXACT_DENOMINATOR = 10**7


def finite_array(values: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    """``values`` as a 1-D float64 array; a ``UserInputError`` naming ``what`` for another shape or a non-finite value."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise UserInputError(f"{what} must be a 1-D sequence of numbers, got shape {array.shape}")
    if array.size and not np.isfinite(array).all():
        raise UserInputError(f"{what} must be finite numbers (a failed run has no score)")
    return array


def mean_interval(values: Sequence[float] | np.ndarray, confidence: float = DEFAULT_CONFIDENCE) -> Interval:
    """Mean and Student-t ``confidence`` interval of ``values`` (seed 001 §4: 95% intervals over reproductions).

    ``half-width = t_{(1 + confidence) / 2, n - 1} · s / sqrt(n)`` with the sample standard deviation
    ``s`` (``ddof = 1``), as ``scipy.stats.t.interval``. With a single value the interval is undefined:
    ``low`` and ``high`` are NaN. No values at all is a ``UserInputError``.
    """
    array = finite_array(values, "values")
    if not 0.0 < confidence < 1.0:
        raise UserInputError(f"confidence must lie strictly between 0 and 1, got {confidence!r}")
    n = int(array.size)
    if n == 0:
        raise UserInputError("a confidence interval needs at least one value")
    mean = float(array.mean())
    if n == 1:
        return Interval(mean, math.nan, math.nan, 1, confidence)
    half_width = float(stats.t.ppf((1.0 + confidence) / 2.0, n - 1) * array.std(ddof=1) / math.sqrt(n))
    return Interval(mean, mean - half_width, mean + half_width, n, confidence)


def cohen_dz(differences: Sequence[float] | np.ndarray) -> float:
    """Cohen's ``d_z`` for paired data: mean of the differences / their sample standard deviation (ddof 1).

    All differences zero gives 0; equal non-zero differences (``zero_spread``) give NaN: an effect
    size over a spread of zero is undefined, not infinite.
    """
    array = finite_array(differences, "differences")
    if array.size < 2:
        raise UserInputError("Cohen's d_z needs at least two paired differences")
    mean, sd = float(array.mean()), float(array.std(ddof=1))
    if zero_spread(array):
        return 0.0 if mean == 0.0 else math.nan
    return mean / sd


def zero_spread(differences: np.ndarray) -> bool:
    """Whether the differences are all equal, up to the rounding of equal scores computed apart
    (``a - b`` of identical metric values can differ in the last bits)."""
    return bool(differences.size) and float(np.ptp(differences)) <= 1e-9 * float(np.abs(differences).max())


def spread_note(differences: np.ndarray) -> str:
    """Why paired differences cannot carry a verdict, or "" when they can: all equal (a spread of zero
    leaves a test nothing to measure the difference against; its t statistic is infinite or
    undefined), or fewer than ``MIN_VERDICT_PAIRS`` of them."""
    n = int(differences.size)
    if zero_spread(differences):
        same = "all zero: the methods scored the same in every reproduction" if not differences.any() else "identical"
        return f"the {n} paired differences are {same}; a spread of zero gives no test"
    if n < MIN_VERDICT_PAIRS:
        return (f"{n} paired differences: their spread rests on {n - 1} degree of freedom; a verdict needs "
                f"at least {MIN_VERDICT_PAIRS} reproductions")
    return ""


def holm(pvalues: Sequence[float] | np.ndarray) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the input order.

    Sorted ascending, ``p_(i)`` becomes ``max_{j <= i} min(1, (m - j + 1) · p_(j))``; a hypothesis is
    rejected at family-wise level ``alpha`` exactly when its adjusted p-value is ``<= alpha``.
    """
    array = finite_array(pvalues, "p-values")
    if array.size and (array.min() < 0.0 or array.max() > 1.0):
        raise UserInputError("p-values must lie in [0, 1]")
    m = int(array.size)
    order = np.argsort(array, kind="stable")
    adjusted = np.empty(m)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(array[index])))
        adjusted[index] = running
    return [float(value) for value in adjusted]


def _paired_arrays(a: Mapping[int, float], b: Mapping[int, float], names: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    if set(a) != set(b):
        missing = sorted(set(a) ^ set(b))
        raise UserInputError(
            f"methods {names[0]!r} and {names[1]!r} must have reproductions with the same seeds; "
            f"unpaired seeds: {missing}"
        )
    seeds = sorted(a)
    return finite_array([a[s] for s in seeds], names[0]), finite_array([b[s] for s in seeds], names[1])


def equivalence_pvalue(differences: Sequence[float] | np.ndarray, margin: float = DEFAULT_EQUIVALENCE_MARGIN) -> float:
    """TOST p-value (Schuirmann 1987) that the mean paired difference lies within ``(-margin, +margin)``.

    The larger of the one-sided paired t-tests of ``mean <= -margin`` and ``mean >= +margin``
    (``scipy.stats.ttest_1samp`` with ``alternative='greater'`` / ``'less'``); small when the 90%
    t-interval of the mean lies inside the margin. Constant differences are certain: 0 inside the
    margin, 1 outside it.
    """
    array = finite_array(differences, "differences")
    if array.size < 2:
        raise UserInputError("an equivalence test needs at least two paired differences")
    if not math.isfinite(margin) or margin <= 0.0:
        raise UserInputError(f"the equivalence margin must be a positive number, got {margin!r}")
    if np.ptp(array) == 0.0:
        return 0.0 if abs(float(array[0])) < margin else 1.0
    lower = stats.ttest_1samp(array, -margin, alternative="greater").pvalue
    upper = stats.ttest_1samp(array, margin, alternative="less").pvalue
    return float(max(lower, upper))


def paired_comparison(
    a: Mapping[int, float], b: Mapping[int, float], names: tuple[str, str] = ("a", "b"),
    margin: float = DEFAULT_EQUIVALENCE_MARGIN, search_sd: float = 0.0,
) -> PairedComparison:
    """Paired t-test, Wilcoxon signed-rank test and Cohen's ``d_z`` of ``a - b``, paired by seed (the keys).

    Both tests are two-sided, as ``scipy.stats.ttest_rel(a, b)`` and ``scipy.stats.wilcoxon(a - b)``
    (zero differences dropped, ``zero_method='wilcox'``). If every difference is zero there is no
    evidence of a difference: both p-values are 1 and both statistics 0 (``ttest_rel`` would give NaN).
    ``equivalence_pvalue`` against ``margin`` beside. The seeds of ``a`` and ``b`` must be the same;
    at least two pairs are needed. With ``search_sd`` (each method's one search assumed to carry search
    luck of that SD, independent between the methods) the t-test, TOST and the interval use
    ``SE = sqrt(2 search_sd² + s_d²/n)`` with ``n - 1`` degrees of freedom (the search term taken as known,
    which keeps the seeds' degrees of freedom: conservative); Wilcoxon stays the seeds' test.
    """
    x, y = _paired_arrays(a, b, names)
    if x.size < 2:
        raise UserInputError(f"comparing {names[0]!r} with {names[1]!r} needs at least two paired reproductions")
    differences = x - y
    exact = exact_differences(x, y)
    if not differences.any():
        t_statistic, t_pvalue, w_statistic, w_pvalue = 0.0, 1.0, 0.0, 1.0
    else:
        t_result = stats.ttest_rel(x, y)
        t_statistic, t_pvalue = float(t_result.statistic), float(t_result.pvalue)
        w_statistic, w_pvalue = 0.0, 1.0
        if exact.any():
            w_result = stats.wilcoxon(exact)
            w_statistic, w_pvalue = float(w_result.statistic), float(w_result.pvalue)
    tost = equivalence_pvalue(differences, margin)
    if zero_spread(differences):
        # No spread, no evidence: scipy's t is NaN (or astronomically large from rounding), and TOST
        # would call the equal differences certain; a p of 1 keeps them from easing Holm for the others.
        t_statistic, t_pvalue, tost = (0.0 if not differences.any() else math.nan), 1.0, 1.0
    interval = mean_interval(differences)
    low, high = interval.low, interval.high
    if search_sd > 0.0 and not zero_spread(differences):
        t_statistic, t_pvalue, tost, low, high = tests_at_se(float(differences.mean()), se_with_search_luck(differences, search_sd),
                                                             differences.size - 1, margin)
    return PairedComparison(
        a=names[0], b=names[1], n=int(x.size), mean_difference=float(differences.mean()),
        t_statistic=t_statistic, t_pvalue=t_pvalue, wilcoxon_statistic=w_statistic, wilcoxon_pvalue=w_pvalue,
        cohen_dz=cohen_dz(differences), t_pvalue_holm=t_pvalue, wilcoxon_pvalue_holm=w_pvalue,
        difference_low=low, difference_high=high, margin=margin, tost_pvalue=tost, tost_pvalue_holm=tost,
        no_verdict=spread_note(differences), search_sd=search_sd,
    )


def tests_at_se(mean: float, se: float, df: float, margin: float) -> tuple[float, float, float, float, float]:
    """t statistic, two-sided p, TOST p within ``±margin`` and the 95% interval of a mean difference whose standard
    error ``se`` and degrees of freedom ``df`` a model gives (search luck added, ``search_sd``; ``analysis.crossed``)."""
    statistic = mean / se
    tost = max(float(stats.t.sf((mean + margin) / se, df)), float(stats.t.sf((margin - mean) / se, df)))
    half = float(stats.t.ppf(0.975, df)) * se
    return statistic, float(2 * stats.t.sf(abs(statistic), df)), tost, mean - half, mean + half


def exact_differences(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x - y`` with the ties of exact arithmetic kept, for the signed-rank test: a score that is a fraction of
    queries (P@1 = hits / queries, a mean over fold models) is read as that fraction (the nearest one with a
    denominator up to ``EXACT_DENOMINATOR``, well within a float's error), so that equal differences computed
    apart rank as ties, as they are (floating-point means broke such ties: W and p of the signed-rank test were
    off in the committed studies)."""
    def exact(value: float) -> Fraction:
        return Fraction(value).limit_denominator(EXACT_DENOMINATOR)

    return np.array([float(exact(a) - exact(b)) for a, b in zip(x.tolist(), y.tolist())])


def compare_methods(scores: Mapping[str, Mapping[int, float]], margin: float = DEFAULT_EQUIVALENCE_MARGIN) -> list[PairedComparison]:
    """Every pair of methods (in the mapping's order), each paired by seed, Holm-corrected per test.

    ``scores[method][seed]`` is one reproduction's score. The family for Holm's correction is the
    set of all ``len(scores) choose 2`` pairs, corrected separately for the t-test, for Wilcoxon and
    for the equivalence test.
    """
    names = list(scores)
    if len(names) < 2:
        raise UserInputError("comparing methods needs at least two methods")
    return compare_pairs(scores, list(itertools.combinations(names, 2)), margin)


def compare_pairs(scores: Mapping[str, Mapping[int, float]], pairs: Sequence[tuple[str, str]],
                  margin: float = DEFAULT_EQUIVALENCE_MARGIN, search_sd: SearchSD = 0.0) -> list[PairedComparison]:
    """The given ``(a, b)`` pairs of methods, each paired by seed; Holm's correction across exactly these
    pairs, separately for the t-test, for Wilcoxon and for the equivalence test within ``±margin``
    (a smaller family than ``compare_methods``'s, e.g. every method against one reference);
    ``search_sd`` as for ``paired_comparison``, one for every method or one per method (``pair_search_sd``)."""
    unknown = sorted({name for pair in pairs for name in pair} - set(scores))
    if unknown:
        raise UserInputError(f"no scores for method {unknown[0]!r}")
    if not pairs:
        return []
    return holm_family([paired_comparison(scores[a], scores[b], (a, b), margin, pair_search_sd(search_sd, a, b))
                        for a, b in pairs])


def holm_family(raw: Sequence[PairedComparison]) -> list[PairedComparison]:
    """``raw`` comparisons as one family: each test's p-values Holm-adjusted across exactly these (``PAIRED_TESTS``)."""
    adjusted = {field: holm([getattr(comparison, field) for comparison in raw])
                for field in (f"{test}_pvalue" for test in PAIRED_TESTS)}
    return [
        PairedComparison(**{**vars(comparison), **{f"{field}_holm": values[index] for field, values in adjusted.items()}})
        for index, comparison in enumerate(raw)
    ]
