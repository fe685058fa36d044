"""The method-level verdicts under the design as it runs: fresh seeds per search (independent search means, the
paired t-test over searches) and shared seeds (the crossed search x seed model, ``analysis.crossed``), checked
against statsmodels' REML fit and by simulations with known truth through ``verdicts.judge_methods``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dmlbench.analysis.crossed import CROSSED_MODEL, crossed_comparison, crossed_fit
from dmlbench.analysis.spec import AnalysisSpec
from dmlbench.analysis.verdicts import judge_methods

ENDPOINT = ("concatenated", "precision_at_1")
# Score units (0.01 = one point), near what search_luck_method_glyphs measured: search luck of the difference,
# a seed x method effect (the part of a seed's effect that differs between methods) and the rest.
SEARCH_SD, SEED_METHOD_SD, RESIDUAL_SD = 0.01, 0.005, 0.007
STUDIES = 1000
ALPHA = 0.05
MC_ERROR = 3 * math.sqrt(ALPHA * (1 - ALPHA) / STUDIES)  # three Monte Carlo standard errors of a rate near 5 %


def _study(rng: np.random.Generator, searches: int, seeds: int, difference: float, shared: bool) -> dict:
    """One simulated study of two methods as the protocol runs it: method ``a`` scores ``difference`` above ``b``;
    every search draws its luck; the seed x method effect is drawn once per seed (``shared``) or per search and seed."""
    seed_effect = (np.broadcast_to(rng.normal(0, SEED_METHOD_SD, seeds), (searches, seeds)) if shared
                   else rng.normal(0, SEED_METHOD_SD, (searches, seeds)))
    gap = difference + rng.normal(0, SEARCH_SD, (searches, 1)) + seed_effect + rng.normal(0, RESIDUAL_SD, (searches, seeds))
    base = rng.normal(0.6, 0.02, (searches, seeds))  # what both methods share cancels in the paired difference
    to_scores = lambda table: {s: {r: float(table[s, r]) for r in range(seeds)} for s in range(searches)}  # noqa: E731
    return {ENDPOINT: {"a": to_scores(base + gap), "b": to_scores(base)}}


def _rates(searches: int, seeds: int, shared: bool, analysed_shared: bool) -> tuple[float, float]:
    """(share of "better"/"worse" verdicts at a true difference of 0, share of 95 % intervals covering a true
    difference of one point) over ``STUDIES`` simulated studies, judged as ``judge_methods`` judges them."""
    rng = np.random.default_rng([searches, seeds, shared, analysed_shared])
    rejected = covered = 0
    for _ in range(STUDIES):
        null = judge_methods(_study(rng, searches, seeds, 0.0, shared), AnalysisSpec(), shared_seeds=analysed_shared)
        rejected += null[ENDPOINT][0].outcome(ALPHA) in ("better", "worse")
        true = 0.01
        found = judge_methods(_study(rng, searches, seeds, true, shared), AnalysisSpec(), shared_seeds=analysed_shared)
        covered += found[ENDPOINT][0].difference_low <= true <= found[ENDPOINT][0].difference_high
    return rejected / STUDIES, covered / STUDIES


@pytest.mark.parametrize("searches", [3, 5, 29])
def test_fresh_seeds_give_independent_search_means_and_an_exact_test(searches):
    type_one, coverage = _rates(searches, 3, shared=False, analysed_shared=False)
    assert abs(type_one - ALPHA) <= MC_ERROR
    assert abs(coverage - (1 - ALPHA)) <= MC_ERROR


@pytest.mark.parametrize("searches", [3, 5, 29])
def test_shared_seeds_judged_by_the_crossed_model_keep_the_error_rate(searches):
    """The crossed model's containment degrees of freedom are conservative: at or below alpha, never above."""
    type_one, coverage = _rates(searches, 3, shared=True, analysed_shared=True)
    assert type_one <= ALPHA + MC_ERROR
    assert coverage >= 1 - ALPHA - MC_ERROR


def test_shared_seeds_judged_as_independent_search_means_reject_a_true_null_too_often():
    """What every committed repeated-search study did before: at 29 x 3 the search means share their seed effect."""
    type_one, coverage = _rates(29, 3, shared=True, analysed_shared=False)
    assert type_one > 2 * ALPHA
    assert coverage < 1 - 2 * ALPHA


def test_the_crossed_fit_equals_statsmodels_reml_on_a_balanced_table():
    pandas = pytest.importorskip("pandas")
    mixedlm = pytest.importorskip("statsmodels.formula.api").mixedlm
    rng = np.random.default_rng(7)
    searches, seeds = 8, 5
    table = (0.3 + rng.normal(0, 1.0, (searches, 1)) + rng.normal(0, 0.8, (1, seeds))
             + rng.normal(0, 0.5, (searches, seeds)))
    fit = crossed_fit(table)
    assert fit.search > 0 and fit.seed > 0  # REML equals the ANOVA estimates only off the boundary
    frame = pandas.DataFrame([{"d": table[s, r], "search": s, "seed": r, "all": 0}
                              for s in range(searches) for r in range(seeds)])
    reml = mixedlm("d ~ 1", frame, groups="all", re_formula="0",
                   vc_formula={"search": "0 + C(search)", "seed": "0 + C(seed)"}).fit(reml=True)
    components = dict(zip(reml.model.exog_vc.names, reml.vcomp))
    assert components["search"] == pytest.approx(fit.search, rel=1e-4)
    assert components["seed"] == pytest.approx(fit.seed, rel=1e-4)
    assert reml.scale == pytest.approx(fit.residual, rel=1e-4)
    assert reml.fe_params.iloc[0] == pytest.approx(fit.mean, rel=1e-9)
    assert reml.bse_fe.iloc[0] == pytest.approx(fit.se, rel=1e-4)


def test_a_crossed_comparison_reads_its_degrees_of_freedom_off_the_smaller_factor():
    rng = np.random.default_rng(3)
    a = {s: {r: 0.6 + 0.01 * s + rng.normal(0, 0.01) for r in range(3)} for s in range(10)}
    b = {s: {r: 0.55 + rng.normal(0, 0.01) for r in range(3)} for s in range(10)}
    comparison = crossed_comparison(a, b, ("a", "b"))
    assert comparison.model == CROSSED_MODEL
    assert comparison.n == 10 and comparison.degrees_of_freedom == 2
    assert comparison.difference_low < comparison.mean_difference < comparison.difference_high


def test_a_crossed_comparison_needs_two_searches_of_two_common_seeds():
    from dmlbench.errors import UserInputError

    with pytest.raises(UserInputError, match="2 searches of 2 common seeds"):
        crossed_comparison({0: {0: 0.5, 1: 0.6}}, {0: {0: 0.4, 1: 0.5}}, ("a", "b"))


def test_the_committed_table_of_changed_verdicts_is_what_the_script_computes(tmp_path):
    """``results/crossed_rejudge.csv`` (quoted by the studies' READMEs) recomputes from the committed runs.csv files."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "results" / "crossed_rejudge.py"
    spec = importlib.util.spec_from_file_location("crossed_rejudge", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["-o", str(tmp_path / "changed.csv")]) == 0
    assert (tmp_path / "changed.csv").read_text() == (script.parent / "crossed_rejudge.csv").read_text()


def test_the_planned_power_of_a_design_is_what_the_design_as_run_achieves():
    """``search_luck.design_power`` at one comparison's own search luck (two methods of unequal search SDs,
    ``statistics.pair_search_sd``) against 2,000 simulated studies of that design with fresh seeds, judged by
    ``judge_methods``: the t-test's power at a true difference of one margin, TOST's at a true difference of 0 (the
    test's; the verdict "equivalent" also needs the t-test not to have found a difference)."""
    from dmlbench.analysis.search_luck import design_power
    from dmlbench.analysis.search_sd import pair_search_sd

    searches, seeds, margin, studies = 8, 3, 0.01, 2000
    search_sd = {"a": 0.006, "b": 0.002}
    seed_sd = 0.008  # SD of one reproduction's paired difference
    planned_t, planned_tost = design_power(searches, seeds, pair_search_sd(search_sd, "a", "b"), seed_sd, margin, 1)
    rng = np.random.default_rng(11)

    def judged(difference: float):
        gap = (difference + rng.normal(0, search_sd["a"], (searches, 1)) - rng.normal(0, search_sd["b"], (searches, 1))
               + rng.normal(0, seed_sd, (searches, seeds)))
        table = {"a": {s: {r: 0.6 + float(gap[s, r]) for r in range(seeds)} for s in range(searches)},
                 "b": {s: {r: 0.6 for r in range(seeds)} for s in range(searches)}}
        analysis = AnalysisSpec(equivalence_margin=margin)
        return judge_methods({ENDPOINT: table}, analysis)[ENDPOINT][0]

    t_power = sum(judged(margin).outcome(ALPHA) == "better" for _ in range(studies)) / studies
    tost_power = sum(judged(0.0).tost_pvalue_holm < ALPHA for _ in range(studies)) / studies
    for planned, simulated in ((planned_t, t_power), (planned_tost, tost_power)):
        assert abs(planned - simulated) <= 3 * math.sqrt(planned * (1 - planned) / studies) + 0.005


@pytest.mark.slow
def test_the_committed_error_rates_are_what_the_simulation_gives(tmp_path):
    """``results/crossed_model_simulation.csv`` (quoted by analysis/crossed.py and docs/protocol.md) recomputes, to the
    last digit, from its seeded script (about 5 minutes on 2 cores: ``pytest -m slow tests/test_crossed_model.py``)."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "results" / "crossed_model_simulation.py"
    spec = importlib.util.spec_from_file_location("crossed_model_simulation", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["-o", str(tmp_path / "rates.csv")]) == 0
    assert (tmp_path / "rates.csv").read_text() == (script.parent / "crossed_model_simulation.csv").read_text()
