"""Sequential verdicts (``analysis.sequential``): the looks, Holm across the family, futility, and the error rates
under the two-level model as a study runs them (``analysis.sequential_simulation``)."""

import csv
import io
import math

import numpy as np
import pytest
from scipy import stats

from dmlbench.analysis.endpoints import declared_comparisons
from dmlbench.analysis.group_sequential import boundaries
from dmlbench.analysis.sequential import (
    SEQUENTIAL_COLUMNS,
    SequentialDesign,
    judge_sequentially,
    method_search_means,
    sequential_csv,
)
from dmlbench.analysis.sequential_simulation import TwoLevelModel, fixed_outcomes, simulate
from dmlbench.analysis.statistics import compare_pairs

METHODS = ["contrastive", "triplet_semihard", "margin", "multi_similarity", "normalized_softmax"]
FAMILY = declared_comparisons(["contrastive", "triplet_semihard"], [], METHODS)
# Search and seed SDs of MAP@R (concatenated) measured with fresh seeds and folds per search:
# results/search_luck_fresh_method_glyphs/search_variance.csv (3 reproductions) and
# results/search_luck_fresh_emoji/search_variance.csv (2 reproductions).
GLYPHS = ({"contrastive": 0.00549, "triplet_semihard": 0.00550, "margin": 0.01444, "multi_similarity": 0.0,
           "normalized_softmax": 0.00109},
          {"contrastive": 0.01445, "triplet_semihard": 0.00832, "margin": 0.00661, "multi_similarity": 0.01019,
           "normalized_softmax": 0.01066}, 3)
EMOJI = ({"contrastive": 0.0, "triplet_semihard": 0.0, "margin": 0.03524, "multi_similarity": 0.0,
          "normalized_softmax": 0.02331},
         {"contrastive": 0.01791, "triplet_semihard": 0.02010, "margin": 0.00547, "multi_similarity": 0.01621,
          "normalized_softmax": 0.00989}, 2)
STUDIES = 2000


def _bound(rate: float, alpha: float = 0.05) -> float:
    """The most a rate estimated from ``STUDIES`` studies may exceed ``alpha`` by chance (one-sided, 3 SE)."""
    return alpha + 3 * math.sqrt(alpha * (1 - alpha) / STUDIES)


@pytest.mark.parametrize(("spreads", "design"), [
    (GLYPHS, SequentialDesign(12, 3)),
    (EMOJI, SequentialDesign(12, 3)),
    (GLYPHS, SequentialDesign(30, 3, spending="obrien_fleming")),
])
def test_no_difference_is_declared_more_often_than_alpha(spreads: tuple, design: SequentialDesign) -> None:
    """Five equal methods, the seven comparisons of the built-in benchmark: the family-wise rate of any better or
    worse over all looks stays within alpha (2,000 studies, as they run: comparisons stop, methods drop out)."""
    model = TwoLevelModel(dict.fromkeys(METHODS, 0.4), spreads[0], spreads[1], spreads[2])
    summary = simulate(model, FAMILY, design, STUDIES, seed=11, fixed=False)
    assert summary.wrong_difference <= _bound(summary.wrong_difference), summary
    # Not vacuous: the repeated looks do spend the error (at least a third of it).
    assert summary.wrong_difference > 0.05 / 3


@pytest.mark.parametrize("spreads", [GLYPHS, EMOJI])
def test_no_equivalence_is_declared_more_often_than_alpha(spreads: tuple) -> None:
    """True differences of one margin or more in every comparison (two of them exactly at the margin): the
    family-wise rate of any "equivalent" stays within alpha."""
    margin = 0.01
    means = {"contrastive": 0.4, "triplet_semihard": 0.4 + margin, "margin": 0.4 + 2 * margin,
             "multi_similarity": 0.4 + 3 * margin, "normalized_softmax": 0.4 - margin}
    design = SequentialDesign(30, 3, margin=margin)
    summary = simulate(TwoLevelModel(means, spreads[0], spreads[1], spreads[2]), FAMILY, design, STUDIES, seed=12,
                       fixed=False)
    assert summary.wrong_equivalence <= _bound(summary.wrong_equivalence), summary


@pytest.mark.filterwarnings("ignore:Precision loss occurred:RuntimeWarning")  # scipy, on the constant difference
@pytest.mark.parametrize("searches", [2, 3, 12])
def test_the_fixed_design_is_judged_as_the_report_judges_it(searches: int) -> None:
    """``fixed_outcomes`` (every simulated study at once) gives ``compare_pairs``' outcome for every comparison of
    every study: differences near the margin and the boundary, equal methods, a difference without spread."""
    rng = np.random.default_rng(5)
    means = {"contrastive": 0.40, "triplet_semihard": 0.40, "margin": 0.41, "multi_similarity": 0.388,
             "normalized_softmax": 0.397}
    draws = [{m: {k: means[m] + 0.006 * value for k, value in enumerate(rng.normal(size=searches))} for m in METHODS}
             for _ in range(100)]
    draws.append({m: {k: 0.4 + (0.003 * k if m == "margin" else 0.0) for k in range(searches)} for m in METHODS})
    draws[-1]["normalized_softmax"] = {k: 0.4 - 0.002 for k in range(searches)}  # a constant difference
    differences = np.array([[[d[a][k] - d[b][k] for k in range(searches)] for a, b in FAMILY] for d in draws])
    vectorised = fixed_outcomes(differences, 0.01, 0.05)
    expected = [[c.outcome(0.05) for c in compare_pairs(d, FAMILY, 0.01)] for d in draws]
    assert vectorised == expected
    assert len({outcome for row in expected for outcome in row}) == (1 if searches < 3 else 4)  # not vacuous


def test_equal_methods_with_little_noise_are_found_equivalent() -> None:
    """Equivalence has power where it should: equal methods whose per-search differences spread well within the
    margin are declared equivalent in nearly every study, early, and never better or worse."""
    design = SequentialDesign(12, 3, margin=0.01)
    model = TwoLevelModel({"a": 0.4, "b": 0.4}, {"a": 0.0, "b": 0.0}, {"a": 0.002, "b": 0.002}, 1)
    summary = simulate(model, [("a", "b")], design, 500, seed=13)
    assert summary.decided[("a", "b")] > 0.95 and summary.searches[("a", "b")] < 7
    assert summary.fixed_decided[("a", "b")] > 0.95  # the fixed design decides it too, with all 12 searches
    assert summary.wrong_difference <= 0.05


def test_large_differences_stop_early_and_cost_less_than_the_fixed_design() -> None:
    """The glyphs study's differences (2 to 5 points against a per-search SD near 1.5): decided at the first looks,
    with far fewer searches than the fixed design of the same maximum, which decides them as often."""
    means = {"contrastive": 0.40, "triplet_semihard": 0.37, "margin": 0.38, "multi_similarity": 0.355,
             "normalized_softmax": 0.345}
    design = SequentialDesign(12, 3)
    summary = simulate(TwoLevelModel(means, *GLYPHS), FAMILY, design, 300, seed=14)
    large = [pair for pair in FAMILY if abs(means[pair[0]] - means[pair[1]]) >= 0.025]
    assert len(large) == 4
    for pair in large:
        assert summary.decided[pair] > 0.95 and summary.fixed_decided[pair] > 0.95
        assert summary.searches[pair] <= 7, summary.searches
    assert summary.method_searches < 0.75 * summary.fixed_method_searches


def _means(differences: dict[tuple[str, str], list[float]]) -> dict[str, dict[int, float]]:
    """Search means for methods ``b`` at 0 and each ``a`` at its given differences."""
    found: dict[str, dict[int, float]] = {}
    for (a, b), values in differences.items():
        found[a] = dict(enumerate(values))
        found[b] = {k: 0.0 for k in range(len(values))}
    return found


def test_a_look_is_the_t_test_on_the_per_search_differences_with_the_spent_boundary() -> None:
    rng = np.random.default_rng(0)
    values = list(0.004 + 0.01 * rng.standard_normal(6))
    design = SequentialDesign(12, 3, margin=0.001, futility_power=0.0)
    judgement = judge_sequentially(_means({("a", "b"): values}), [("a", "b")], design)
    first, second = judgement.rows
    assert (first.look, first.searches, second.look, second.searches) == (1, 3, 2, 6)
    result = stats.ttest_1samp(values, 0.0)
    assert second.t_statistic == pytest.approx(result.statistic)
    assert second.estimate == pytest.approx(np.mean(values)) and second.sd == pytest.approx(np.std(values, ddof=1))
    z = boundaries(0.05, [0.25, 0.5], "pocock")[1]
    assert second.boundary == pytest.approx(stats.t.isf(stats.norm.sf(z), 5))
    half = second.boundary * second.sd / math.sqrt(6)
    assert (second.ci_low, second.ci_high) == pytest.approx((second.estimate - half, second.estimate + half))
    # The next look needs the ninth search of both methods.
    assert judgement.next_searches == {"a": 9, "b": 9} and not judgement.finished


def test_holm_passes_a_decided_comparisons_share_to_the_others() -> None:
    """Two comparisons: one clearly decided at the first look, the other tested at alpha/2 there and at alpha from
    then on (the graphical Holm procedure)."""
    clear = [0.05, 0.051, 0.049, 0.05, 0.05, 0.05]
    rng = np.random.default_rng(3)
    unclear = list(0.003 + 0.01 * rng.standard_normal(6))
    means = {"b": dict.fromkeys(range(6), 0.0), "a": dict(enumerate(clear)), "c": dict(enumerate(unclear))}
    judgement = judge_sequentially(means, [("a", "b"), ("c", "b")], SequentialDesign(12, 3, margin=0.001, futility_power=0.0))
    rows = {(row.a, row.look): row for row in judgement.rows}
    assert rows[("a", 1)].decision == "better" and rows[("a", 1)].level == 0.025
    assert rows[("c", 1)].level == 0.05  # raised at the same look, after a's rejection
    assert rows[("c", 2)].level == 0.05
    assert ("a", 2) not in rows  # a stopped


def test_equivalence_and_futility_stop_a_comparison() -> None:
    tiny = [0.001, -0.001, 0.0005, -0.0005, 0.0, 0.0002]
    judgement = judge_sequentially(_means({("a", "b"): tiny}), [("a", "b")], SequentialDesign(12, 3, margin=0.01))
    assert judgement.latest[("a", "b")].decision == "equivalent" and judgement.finished
    # Noise far larger than the margin and a mean near zero: nothing can be decided by 12 searches.
    noisy = [0.05, -0.06, 0.04, -0.05, 0.06, -0.045]
    judgement = judge_sequentially(_means({("a", "b"): noisy}), [("a", "b")], SequentialDesign(12, 3, margin=0.01))
    row = judgement.latest[("a", "b")]
    assert row.decision == "futile" and row.conditional_power < 0.1 and row.searches_to_decide > 12


def test_the_last_look_closes_what_is_left_as_inconclusive() -> None:
    noisy = [0.02, -0.01, 0.015, -0.02, 0.01, -0.015]
    design = SequentialDesign(6, 3, margin=0.01, futility_power=0.0)
    judgement = judge_sequentially(_means({("a", "b"): noisy}), [("a", "b")], design)
    assert [row.decision for row in judgement.rows] == ["continue", "inconclusive"] and judgement.finished


def test_the_design_looks_at_every_round_and_at_the_maximum() -> None:
    assert SequentialDesign(12, 3).looks == (3, 6, 9, 12)
    assert SequentialDesign(10, 4).looks == (4, 8, 10)
    with pytest.raises(ValueError, match="round_searches"):
        SequentialDesign(10, 1)
    with pytest.raises(ValueError, match="max_searches"):
        SequentialDesign(2, 3)


def test_sequential_csv_has_a_row_per_comparison_and_look() -> None:
    scores = {"a": {k: {0: 0.5 + 0.01 * k, 1: 0.52} for k in range(6)}, "b": {k: {0: 0.4, 1: 0.41} for k in range(6)}}
    judgement = judge_sequentially(method_search_means(scores), [("a", "b")], SequentialDesign(6, 3))
    rows = list(csv.DictReader(io.StringIO(sequential_csv(judgement, ("concatenated", "map_at_r")))))
    assert tuple(rows[0]) == SEQUENTIAL_COLUMNS
    assert [(row["look"], row["searches"], row["decision"]) for row in rows] == [("1", "3", "better")]
    assert float(rows[0]["estimate"]) == pytest.approx(np.mean([0.5 + 0.01 * k + 0.52 for k in range(3)]) / 2 - 0.405)
