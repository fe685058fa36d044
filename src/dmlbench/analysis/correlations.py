"""Relations between measurements over reproductions: Pearson, Spearman and Kendall correlations with
seeded bootstrap intervals, the pooled within-group correlation, the agreement of two rankings, and
the lag-one autocorrelation of a validation curve.

``lag_one_autocorrelation`` is the statistic of seed 001 §3.2 that justifies validation accuracy as a
smooth, selectable signal (P@1 0.73, MAP@R 0.81 there), here of the curve's fluctuation around its
linear trend. Like ``analysis.statistics``, every function takes plain floats and returns plain
floats; the heavy lifting is ``scipy.stats``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from dmlbench.analysis.statistics import DEFAULT_CONFIDENCE, finite_array
from dmlbench.errors import UserInputError


@dataclass(frozen=True)
class Correlation:
    """A correlation coefficient of ``n`` points, its p-value (no correlation, two-sided, from
    ``scipy.stats``) and a percentile bootstrap interval over resampled points."""

    kind: str  # "pearson" | "spearman" | "kendall"
    n: int
    estimate: float
    pvalue: float
    low: float
    high: float
    confidence: float = DEFAULT_CONFIDENCE


def _pearson(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x - x.mean(axis=axis, keepdims=True)
    y = y - y.mean(axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):  # a constant resample has no correlation: NaN
        return (x * y).sum(axis=axis) / np.sqrt((x * x).sum(axis=axis) * (y * y).sum(axis=axis))


def _spearman(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return _pearson(stats.rankdata(x, axis=axis), stats.rankdata(y, axis=axis), axis=axis)


def _kendall(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Kendall's tau-b along ``axis``: concordant minus discordant pairs over the untied pairs."""
    x, y = np.moveaxis(x, axis, -1), np.moveaxis(y, axis, -1)
    sx = np.sign(x[..., :, None] - x[..., None, :])
    sy = np.sign(y[..., :, None] - y[..., None, :])
    with np.errstate(invalid="ignore", divide="ignore"):
        return (sx * sy).sum(axis=(-2, -1)) / np.sqrt((sx != 0).sum(axis=(-2, -1)) * (sy != 0).sum(axis=(-2, -1)))


def correlation(
    x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, kind: str = "pearson", *,
    resamples: int = 9999, seed: int = 0, confidence: float = DEFAULT_CONFIDENCE,
) -> Correlation:
    """Pearson, Spearman or Kendall (tau-b) correlation of paired points with a seeded percentile bootstrap interval
    (``scipy.stats.bootstrap``, points resampled in pairs). Resamples whose values are all equal have
    no correlation and are left out of the percentiles."""
    first, second = finite_array(x, "x"), finite_array(y, "y")
    if first.size != second.size:
        raise UserInputError(f"x and y must have the same length, got {first.size} and {second.size}")
    if first.size < 3:
        raise UserInputError(f"a correlation needs at least 3 points, got {first.size}")
    if kind not in ("pearson", "spearman", "kendall"):
        raise UserInputError(f"correlation kind must be pearson, spearman or kendall, got {kind!r}")
    if np.ptp(first) == 0.0 or np.ptp(second) == 0.0:
        raise UserInputError("a correlation needs points that are not all equal in x and in y")
    test = {"pearson": stats.pearsonr, "spearman": stats.spearmanr, "kendall": stats.kendalltau}[kind](first, second)
    statistic = {"pearson": _pearson, "spearman": _spearman, "kendall": _kendall}[kind]
    rng = np.random.default_rng(seed)
    # The resampling distribution, drawn the way scipy.stats.bootstrap draws it (paired indices),
    # so that degenerate resamples can be dropped instead of turning the interval into NaN.
    with warnings.catch_warnings():  # scipy's note on degenerate resamples: handled below
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        distribution = stats.bootstrap((first, second), statistic, paired=True, vectorized=True, n_resamples=resamples,
                                       confidence_level=confidence, method="percentile",
                                       random_state=rng).bootstrap_distribution
    finite = distribution[np.isfinite(distribution)]
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = (float(v) for v in np.percentile(finite, [tail, 100.0 - tail])) if finite.size else (math.nan, math.nan)
    return Correlation(kind, int(first.size), float(test.statistic), float(test.pvalue), low, high, confidence)


def within_group_correlation(
    x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, groups: Sequence[str], kind: str = "pearson", *,
    resamples: int = 9999, seed: int = 0, confidence: float = DEFAULT_CONFIDENCE,
) -> Correlation:
    """The pooled within-group correlation: ``x`` and ``y`` centred on their group's mean, then correlated.

    What remains once each group's (method's) own level is taken out, so a trend across groups
    cannot masquerade as one within them. The p-value is the t-test of ``r`` with ``n - k - 1``
    degrees of freedom for ``k`` groups (each centring uses one); the interval is ``correlation``'s
    bootstrap of the centred points. Groups with a single point carry no within-group information
    and are left out.
    """
    if kind not in ("pearson", "spearman"):
        raise UserInputError(f"a within-group correlation is pearson or spearman (its t-test), got {kind!r}")
    first, second = finite_array(x, "x"), finite_array(y, "y")
    labels = np.asarray(list(groups))
    if not first.size == second.size == labels.size:
        raise UserInputError(f"x, y and groups must have the same length, got {first.size}, {second.size} and {labels.size}")
    kept = np.isin(labels, [name for name in dict.fromkeys(labels.tolist()) if int((labels == name).sum()) >= 2])
    first, second, labels = first[kept], second[kept], labels[kept]
    names = list(dict.fromkeys(labels.tolist()))
    for name in names:
        members = labels == name
        first[members] -= first[members].mean()
        second[members] -= second[members].mean()
    freedom = first.size - len(names) - 1
    if freedom < 1:
        raise UserInputError(f"a within-group correlation needs more points than groups + 1, got {first.size} in {len(names)} groups")
    pooled = correlation(first, second, kind, resamples=resamples, seed=seed, confidence=confidence)
    r = pooled.estimate
    pvalue = 0.0 if abs(r) >= 1.0 else float(2.0 * stats.t.sf(abs(r) * math.sqrt(freedom / (1.0 - r * r)), freedom))
    return Correlation(kind, int(first.size), r, pvalue, pooled.low, pooled.high, confidence)


@dataclass(frozen=True)
class RankAgreement:
    """Kendall's tau between two rankings of the same methods, its p-value, and each method's ranks."""

    tau: float
    pvalue: float
    ranks: dict[str, tuple[int, int]]  # method -> (rank in the first, rank in the second), 1 = best

    @property
    def changed(self) -> list[str]:
        return [name for name, (first, second) in self.ranks.items() if first != second]


def rank_agreement(first: Mapping[str, float], second: Mapping[str, float]) -> RankAgreement:
    """How far two scorings of the same methods rank them alike (higher is better; ties by name order)."""
    if set(first) != set(second):
        raise UserInputError(f"rankings must cover the same methods; unmatched: {sorted(set(first) ^ set(second))}")
    names = list(first)
    if len(names) < 2:
        raise UserInputError("a ranking needs at least two methods")

    def ranks(scores: Mapping[str, float]) -> dict[str, int]:
        order = sorted(range(len(names)), key=lambda index: (-scores[names[index]], index))
        return {names[index]: rank + 1 for rank, index in enumerate(order)}

    a, b = ranks(first), ranks(second)
    result = stats.kendalltau([first[name] for name in names], [second[name] for name in names])
    return RankAgreement(float(result.statistic), float(result.pvalue), {name: (a[name], b[name]) for name in names})


def lag_one_autocorrelation(series: Sequence[float] | np.ndarray) -> float:
    """Lag-one autocorrelation of a validation curve's fluctuation around its trend (seed 001 §3.2).

    The curve's least-squares straight line is removed, then the standard estimator (Box & Jenkins)
    is applied to the residuals ``e``: ``r1 = sum_t (e_t - ē)(e_{t+1} - ē) / sum_t (e_t - ē)^2``.
    Seed 001 gives no formula; the Pearson correlation of ``x[:-1]`` with ``x[1:]`` that stood here
    before is 1 for any straight line, so on rising curves it measured the rise, not the noise that
    makes checkpoint selection hard. Residual curvature (a curve that rises and levels off) still
    raises ``r1``, so compare metrics on the same runs. A curve with no fluctuation around its line
    (constant or straight) has none to correlate: NaN. At least three values are needed; callers
    leave out the untrained evaluation 0.
    """
    array = finite_array(series, "series")
    if array.size < 3:
        raise UserInputError(f"lag-one autocorrelation needs at least 3 values, got {array.size}")
    steps = np.arange(array.size, dtype=np.float64)
    slope, intercept = np.polyfit(steps, array, 1)
    residuals = array - (slope * steps + intercept)
    residuals -= residuals.mean()
    scale = max(float(np.abs(array).max()), 1.0)
    if float(np.abs(residuals).max()) <= 1e-12 * scale:  # a straight line up to rounding
        return math.nan
    return float(np.dot(residuals[:-1], residuals[1:]) / np.dot(residuals, residuals))


def mean_lag_one_autocorrelation(series: Sequence[Sequence[float] | np.ndarray]) -> float:
    """The average of ``lag_one_autocorrelation`` over several runs' curves (NaN ones skipped), as in seed 001 §3.2."""
    values = [lag_one_autocorrelation(one) for one in series]
    finite = [value for value in values if not math.isnan(value)]
    return float(np.mean(finite)) if finite else math.nan


@dataclass(frozen=True)
class StudyAgreement:
    """Kendall's tau-b between two studies' rankings of the same methods by their mean scores; its
    percentile interval from resampling each method's reproductions within each study (the noise of
    the means, which an interval over methods leaves out); and each study's split-half tau, the
    agreement of the rankings from two random halves of its own reproductions (the mean over random
    splits): a study that does not agree with itself cannot be expected to agree with another."""

    methods: int
    tau: float
    low: float
    high: float
    first_split_half: float
    second_split_half: float
    confidence: float = DEFAULT_CONFIDENCE


def study_agreement(
    first: Mapping[str, Sequence[float]], second: Mapping[str, Sequence[float]], *, resamples: int = 9999,
    splits: int = 1000, seed: int = 0, confidence: float = DEFAULT_CONFIDENCE,
) -> StudyAgreement:
    """``first[method]``, ``second[method]``: the reproductions' scores of each method in each study
    (higher is better). Draws come from one ``numpy`` generator seeded with ``seed``."""
    if set(first) != set(second):
        raise UserInputError(f"the two studies must score the same methods; unmatched: {sorted(set(first) ^ set(second))}")
    if len(first) < 3:
        raise UserInputError(f"a rank agreement needs at least three methods, got {len(first)}")
    names = list(first)
    values = [[finite_array(study[name], f"scores of {name!r}") for name in names] for study in (first, second)]
    if any(array.size < 2 for study in values for array in study):
        raise UserInputError("every method needs at least two reproductions in each study")
    generator = np.random.default_rng(seed)
    means = [np.array([array.mean() for array in study]) for study in values]
    taus = resampled_taus(values, resamples, generator)
    taus = taus[np.isfinite(taus)]
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = (np.percentile(taus, [tail, 100.0 - tail]) if taus.size else (math.nan, math.nan))
    return StudyAgreement(len(names), float(_kendall(means[0], means[1])), float(low), float(high),
                          split_half_tau(values[0], splits, generator), split_half_tau(values[1], splits, generator),
                          confidence)


def resampled_taus(values: Sequence[Sequence[np.ndarray]], resamples: int, generator: np.random.Generator) -> np.ndarray:
    """Tau-b between the two studies' method means, each mean over its method's reproductions drawn
    with replacement, once per resample (NaN where a resample ties every method)."""
    resampled = []
    for study in values:
        columns = [array[generator.integers(0, array.size, size=(resamples, array.size))].mean(axis=1) for array in study]
        resampled.append(np.stack(columns, axis=1))
    return _kendall(resampled[0], resampled[1])


def split_half_tau(study: Sequence[np.ndarray], splits: int, generator: np.random.Generator) -> float:
    """Mean tau-b between the method rankings of two disjoint random halves of a study's
    reproductions. Reproductions are paired by position across methods (seed ``r`` of every method),
    so each split takes the same positions from every method holding them."""
    longest = max(array.size for array in study)
    taus = []
    for _ in range(splits):
        order = generator.permutation(longest)
        halves = []
        for array in study:
            own = order[order < array.size]
            half = own.size // 2
            halves.append((array[own[:half]].mean(), array[own[half:2 * half]].mean()))
        a, b = np.array(halves).T
        taus.append(float(_kendall(a, b)))
    finite = [tau for tau in taus if math.isfinite(tau)]
    return float(np.mean(finite)) if finite else math.nan
