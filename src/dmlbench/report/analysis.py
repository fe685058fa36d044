"""What a benchmark's reproductions say about the seeds' claims; computed here, rendered by ``report.build``.

* **One family per endpoint**: every declared comparison (``benchmark.declared_comparisons``: each
  method against each reference, then the pairs; none declared: every pair) is tested once per mode
  and metric, paired by reproduction seed, and Holm-corrected across that whole family, so a pair has
  one verdict per endpoint whichever table shows it. ``analysis.primary`` names the confirmatory
  endpoint; the others are secondary and not corrected across endpoints.
* **References** (seed 001 §4: under a fair protocol the newer losses barely beat the classic
  ones): every scored method against each method of ``analysis.references``, read from the family. Each
  comparison has one of four outcomes (``PairedComparison.outcome``): *better* or *worse* (Holm-adjusted
  paired t-test p < 0.05), *equivalent* (Holm-adjusted TOST p < 0.05: the difference lies within
  ``±analysis.equivalence_margin``), or *inconclusive* (neither: not a difference, not an
  equivalence). The t-test decides because with n <= 5 pairs the two-sided Wilcoxon signed-rank
  test cannot reach p < 0.0625; its p-values are reported beside.
* **Pairs** (``analysis.pairs``, e.g. a rho-regularised loss against the same loss, seed 003 §5.1):
  ``treated - control``, read from the family.
* **Sensitivity and power** (primary endpoint): the verdicts at half and twice the margin beside the
  chosen one, and each comparison's achieved power and minimal detectable difference at its observed
  SD of paired differences (``analysis.power``).
* **Embedding space against test** (seed 003 §5, Fig. 5): per reproduction, the mean over its fold
  models of rho and pi_ratio on their own training classes (``protocol.reproductions.training_space``)
  against the reproduction's test P@1; *separated* P@1 is the mean of the same fold models' P@1, so
  it matches the averaging of rho. Pearson and Spearman with a seeded bootstrap interval at three
  levels: the methods' means (one point per method, as Fig. 5 plots), within methods (every
  reproduction centred on its method's mean, ``correlations.within_group_correlation``: does a seed
  with lower rho than its method's others score better?), and all reproductions pooled. The pooled
  points mix the two and are not independent (reproductions of a method share its
  hyper-parameters), so that level gets no p-value: its interval is a description.
* **Validation curves** (seed 001 §3.2): the lag-one autocorrelation of validation P@1 and MAP@R
  around each curve's linear trend, evaluation 0 (the untrained model) left out, averaged over the
  methods (each method's value is the mean over its search and reproduction runs).
* **Concatenated against separated** (seed 001 §3.3): Kendall's tau between the two rankings of the
  methods' means, per metric, and which methods change rank.
* **All-versus-all against cross-domain** (``evaluation.cross_domain``): the same for the concatenated
  mode's two tasks, so a method that ranks differently when each query is answered from the other
  domains only is named.
* **Re-ranking** (``evaluation.rerank``): each method re-ranked against itself raw, per mode and metric,
  paired by reproduction (the same fold models scored both ways), Holm across the methods of each mode
  and metric, with the same tests and equivalence margin as the method pairs.

The untrained baseline takes part in none of these.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from dmlbench.analysis.correlations import Correlation, RankAgreement, correlation, rank_agreement, within_group_correlation
from dmlbench.analysis.endpoints import CROSS_DOMAIN_SUFFIX, MODES, declared_comparisons
from dmlbench.analysis.power import ComparisonPower, comparison_power, paired_sd
from dmlbench.analysis.spec import AnalysisSpec
from dmlbench.analysis.statistics import (
    DEFAULT_ALPHA,
    DEFAULT_EQUIVALENCE_MARGIN,
    OUTCOMES,
    PairedComparison,
    compare_pairs,
)
from dmlbench.analysis.search_sd import pair_search_sd
from dmlbench.errors import UserInputError
from dmlbench.protocol.layout import BASELINES
from dmlbench.protocol.units.results import (
    MethodReproductions,
    compare_reranking,
    compared_modes,
    result_rows,
    seed_scores,
)

CLAIM_METRICS = ("precision_at_1", "map_at_r")
FAMILY_METRICS = ("precision_at_1", "r_precision", "map_at_r")
ALPHA = DEFAULT_ALPHA
SPACE_LEVELS = ("method means", "within methods", "reproductions")
SPACE_QUANTITIES = ("rho", "pi_ratio")
SPACE_METRIC = "precision_at_1"
RANKED_METRICS = ("precision_at_1", "r_precision", "map_at_r")


@dataclass(frozen=True)
class ReferenceSummary:
    """Every other method against one reference on one mode and metric (``difference = method - reference``)."""

    reference: str
    mode: str
    metric: str
    comparisons: list[PairedComparison]

    def methods(self, outcome: str, among: Sequence[str] | None = None) -> list[str]:
        """The compared methods (of ``among``, default all) whose comparison with the reference has this outcome."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
        return [c.a for c in self.comparisons if c.outcome(ALPHA) == outcome and (among is None or c.a in among)]


@dataclass(frozen=True)
class SpacePoint:
    """One reproduction: its fold models' mean rho and pi_ratio (training classes) and its test P@1 per mode."""

    method: str
    reproduction: int
    seed: int
    rho: float
    pi_ratio: float
    scores: dict[str, float]  # mode -> test P@1


@dataclass(frozen=True)
class SpaceCorrelation:
    quantity: str  # "rho" | "pi_ratio"
    mode: str
    level: str  # one of SPACE_LEVELS; "reproductions" carries no p-value (NaN): its points are dependent
    pearson: Correlation
    spearman: Correlation


@dataclass
class Claims:
    references: list[ReferenceSummary] = field(default_factory=list)
    pairs: list[tuple[str, str, list[PairedComparison]]] = field(default_factory=list)  # (mode, metric, comparisons)
    points: list[SpacePoint] = field(default_factory=list)
    correlations: list[SpaceCorrelation] = field(default_factory=list)
    autocorrelation: dict[str, list[float]] = field(default_factory=dict)  # metric -> one value per method
    rankings: list[tuple[str, RankAgreement]] = field(default_factory=list)  # (metric, concatenated vs separated)
    domain_rankings: list[tuple[str, RankAgreement]] = field(default_factory=list)  # (metric, all vs cross-domain)
    notes: list[str] = field(default_factory=list)  # why a part could not be computed
    margin: float = DEFAULT_EQUIVALENCE_MARGIN  # the equivalence margin the comparisons used
    # The search-luck SD the comparisons assumed, one for every method or one per method (``analysis.search_sd``; 0: none).
    search_sd: float | dict[str, float] = 0.0
    primary: tuple[str, str] = ("concatenated", "map_at_r")  # (mode, metric) of the confirmatory comparisons
    families: dict[tuple[str, str], list[PairedComparison] | str] = field(default_factory=dict)  # or why not compared
    sensitivity: list[tuple[str, str, str, str, str]] = field(default_factory=list)  # a, b, verdicts at margin/2, margin, 2x
    power: list[ComparisonPower] = field(default_factory=list)  # the primary family's, at the observed SDs
    reranking: list[tuple[str, str, list[PairedComparison]]] = field(default_factory=list)  # (mode, metric, re-ranked vs raw)


def analyse(
    results: Mapping[str, MethodReproductions],
    analysis: AnalysisSpec,
    autocorrelation: Mapping[str, Mapping[str, float]],
    computed: Sequence[str],
    *,
    seed: int = 0,
) -> Claims:
    """The claims of the module docstring for the scored methods of ``results`` (``analysis``: the
    benchmark's ``analysis`` section; ``computed``: the metrics the reproductions computed;
    ``seed``: the bootstrap's)."""
    scored = scored_methods(results)
    claims = Claims(margin=analysis.equivalence_margin, search_sd=analysis.search_sd or 0.0,
                    primary=(analysis.primary.mode, analysis.primary.metric))
    declared = declared_comparisons(analysis.references, analysis.pairs, list(scored))
    if len(scored) >= 2:
        for mode in compared_modes(scored):
            for metric in [m for m in FAMILY_METRICS if m in computed]:
                family = _compared(seed_scores(scored, mode, metric), declared, claims)
                claims.families[(mode, metric)] = family if family or not declared else claims.notes[-1]
    for (mode, metric), family in claims.families.items():
        if metric not in CLAIM_METRICS or isinstance(family, str):
            continue
        for reference in analysis.references:
            if reference not in scored:
                claims.notes.append(f"reference {reference} has no scored reproduction")
                continue
            oriented = [_oriented(c, reference) for c in family if reference in (c.a, c.b)]
            claims.references.append(ReferenceSummary(reference, mode, metric, oriented))
        wanted = [(a, b) for a, b in analysis.pairs if a in scored and b in scored]
        if wanted:
            claims.pairs.append((mode, metric, [_oriented(c, b) for a, b in wanted for c in family if {c.a, c.b} == {a, b}]))
    _sensitivity_and_power(claims, scored, declared)
    claims.reranking = _reranking(scored, computed, claims)
    claims.notes = list(dict.fromkeys(claims.notes))  # each reason once, in order
    claims.points = _space_points(scored)
    claims.correlations = _space_correlations(claims, seed)
    for metric in ("precision_at_1", "map_at_r"):
        values = [autocorrelation[name][metric] for name in scored if name in autocorrelation]
        claims.autocorrelation[metric] = [value for value in values if not math.isnan(value)]
    means = {(row["method"], row["mode"], row["metric"]): row["mean"] for row in result_rows(scored)}
    if len(scored) >= 2:
        crossed = "concatenated" + CROSS_DOMAIN_SUFFIX
        for metric in [m for m in RANKED_METRICS if m in computed]:
            ranked = {mode: {name: means[(name, mode, metric)] for name in scored} for mode in ("concatenated", "separated")}
            claims.rankings.append((metric, rank_agreement(ranked["concatenated"], ranked["separated"])))
            if all((name, crossed, metric) in means for name in scored):
                claims.domain_rankings.append((metric, rank_agreement(
                    ranked["concatenated"], {name: means[(name, crossed, metric)] for name in scored})))
    return claims


def scored_methods(results: Mapping[str, MethodReproductions]) -> dict[str, MethodReproductions]:
    """The methods with at least one scored reproduction, in order; never a baseline row."""
    return {name: result for name, result in results.items()
            if name not in BASELINES and any(outcome.scores for outcome in result.outcomes)}


def _oriented(comparison: PairedComparison, control: str) -> PairedComparison:
    """The comparison as ``other - control`` (the same test and p-values, the signs turned where needed)."""
    return comparison if comparison.b == control else comparison.swapped()


def _sensitivity_and_power(claims: Claims, scored: Mapping[str, MethodReproductions], declared: list[tuple[str, str]]) -> None:
    """The primary family's verdicts at half and twice the margin, and its achieved power at the observed SDs."""
    family = claims.families.get(claims.primary)
    if not family or isinstance(family, str):
        return
    scores = seed_scores(scored, *claims.primary)
    half, twice = (_compared(scores, declared, replace(claims, margin=factor * claims.margin)) for factor in (0.5, 2.0))
    claims.sensitivity = [(c.a, c.b, low.outcome(ALPHA), c.outcome(ALPHA), high.outcome(ALPHA))
                          for c, low, high in zip(family, half, twice)]
    for c in family:
        differences = [scores[c.a][seed] - scores[c.b][seed] for seed in scores[c.a]]
        sd = paired_sd(differences)
        if c.n >= 2 and math.isfinite(sd) and sd > 0.0:
            claims.power.append(comparison_power(c.a, c.b, c.n, sd, claims.margin, len(family), ALPHA,
                                                 pair_search_sd(claims.search_sd, c.a, c.b)))


def _reranking(scored: Mapping[str, MethodReproductions], computed: Sequence[str], claims: Claims
               ) -> list[tuple[str, str, list[PairedComparison]]]:
    """Re-ranked against raw per mode and metric (nothing when the benchmark re-ranks nothing)."""
    found = []
    for mode in MODES:
        for metric in [m for m in FAMILY_METRICS if m in computed]:
            try:
                with warnings.catch_warnings():  # scipy's precision notes on near-identical pairs
                    warnings.simplefilter("ignore", RuntimeWarning)
                    comparisons = compare_reranking(scored, mode, metric, claims.margin)
            except UserInputError as error:  # too few paired reproductions so far
                claims.notes.append(f"re-ranking ({mode}, {metric}): {error}")
                continue
            if comparisons:
                found.append((mode, metric, comparisons))
    return found


def _compared(scores: Mapping[str, Mapping[int, float]], pairs: list[tuple[str, str]], claims: Claims) -> list[PairedComparison]:
    try:
        with warnings.catch_warnings():  # scipy's precision notes on near-identical pairs
            warnings.simplefilter("ignore", RuntimeWarning)
            return compare_pairs(scores, pairs, claims.margin, claims.search_sd)
    except UserInputError as error:  # too few paired reproductions so far
        claims.notes.append(str(error))
        return []


def _space_points(results: Mapping[str, MethodReproductions]) -> list[SpacePoint]:
    points = []
    for name, result in results.items():
        for outcome in result.outcomes:
            if not outcome.scores or not outcome.embedding_space:
                continue
            points.append(SpacePoint(
                name, outcome.reproduction, outcome.seed,
                float(np.mean([fold["rho"] for fold in outcome.embedding_space])),
                float(np.mean([fold["pi_ratio"] for fold in outcome.embedding_space])),
                {mode: float(outcome.scores[mode][SPACE_METRIC]) for mode in MODES if SPACE_METRIC in outcome.scores[mode]},
            ))
    return points


def _space_correlations(claims: Claims, seed: int) -> list[SpaceCorrelation]:
    rows = []
    for quantity in SPACE_QUANTITIES:
        for mode in MODES:
            points = [p for p in claims.points if mode in p.scores and math.isfinite(getattr(p, quantity))]
            x, y, methods = [getattr(p, quantity) for p in points], [p.scores[mode] for p in points], [p.method for p in points]
            for level in SPACE_LEVELS:
                try:
                    rows.append(SpaceCorrelation(quantity, mode, level, *(_level_correlation(level, kind, x, y, methods, seed)
                                                                          for kind in ("pearson", "spearman"))))
                except UserInputError as error:
                    claims.notes.append(f"{quantity} against test P@1 ({mode}, {level}): {error}")
    return rows


def _level_correlation(level: str, kind: str, x: list[float], y: list[float], methods: list[str], seed: int) -> Correlation:
    if level == "within methods":
        return within_group_correlation(x, y, methods, kind, seed=seed)
    if level == "method means":
        names = list(dict.fromkeys(methods))
        means = lambda values: [float(np.mean([v for v, m in zip(values, methods) if m == name])) for name in names]  # noqa: E731
        return correlation(means(x), means(y), kind, seed=seed)
    return replace(correlation(x, y, kind, seed=seed), pvalue=math.nan)  # dependent points: a description, not a test
