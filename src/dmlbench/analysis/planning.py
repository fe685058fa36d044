"""Planning a benchmark's declared comparisons: the power of its one Holm family at a given spread of
the paired differences (measured on a pilot study's ``runs.csv`` or stated), and the reproductions
needed; the functions of ``analysis.power`` applied to a ``Family``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dmlbench.analysis.endpoints import ScoreTable
from dmlbench.analysis.power import MAX_REPRODUCTIONS, SD_BOUND_CONFIDENCE, PilotSpread, comparison_power, paired_sd, sd_upper_bound
from dmlbench.analysis.search_luck import MAX_SEARCHES, Design, cheapest_family_design, cheapest_over_trials, design_power
from dmlbench.analysis.search_sd import pair_search_sd, search_sd_words


@dataclass(frozen=True)
class Family:
    """The declared comparisons of one endpoint as a benchmark plans them: ``(a, b)`` pairs for ``a - b``,
    the reproductions each method gets, the equivalence margin and the endpoint ``(mode, metric)``."""

    comparisons: list[tuple[str, str]]
    reproductions: int
    margin: float
    endpoint: tuple[str, str]
    searches: int = 1  # each method's searches (protocol.search_repeats)
    trials: int = 1  # trials per search
    folds: int = 1  # runs per trial and per reproduction


def pilot_sds(scores: ScoreTable, family: Family) -> dict[tuple[str, str], PilotSpread]:
    """The SD of each declared comparison's paired differences on the family's endpoint in a stored
    benchmark's scores (reproductions paired by number, i.e. by seed), with their count; comparisons
    the pilot lacks are left out."""
    values = scores.get(family.endpoint, {})
    sds = {}
    for a, b in family.comparisons:
        if a in values and b in values:
            common = sorted(set(values[a]) & set(values[b]))
            if len(common) >= 2:
                sds[(a, b)] = PilotSpread(paired_sd([values[a][r] - values[b][r] for r in common]), len(common))
    return sds


def spreads(sds: Mapping[tuple[str, str], float | PilotSpread]) -> dict[tuple[str, str], float]:
    """The finite, positive SDs of ``sds`` as plain numbers (a pilot's all-equal differences have none)."""
    found = {pair: value.sd if isinstance(value, PilotSpread) else value for pair, value in sds.items()}
    return {pair: sd for pair, sd in found.items() if math.isfinite(sd) and sd > 0.0}


def plan_text(family: Family, sds: Mapping[tuple[str, str], float | PilotSpread], source: str, alpha: float = 0.05) -> str:
    """The planning table: per declared comparison its SD, the power of both tests at the configured
    reproductions (unadjusted / strictest Holm threshold) and the reproductions needed for 80%; for
    an SD measured in a pilot also its upper confidence bound and the reproductions needed there."""
    comparisons, n, margin = family.comparisons, family.reproductions, family.margin
    mode, metric = family.endpoint
    lines = [f"power ({mode} {metric}, the primary endpoint): {len(comparisons)} comparison{'s' if len(comparisons) != 1 else ''} in one Holm "
             f"family, {n} reproductions, margin ±{100 * margin:g} points, SD of paired differences {source}; "
             f"t-test power at a true difference of one margin, TOST power at a true difference of 0, each "
             f"unadjusted / at the strictest Holm threshold alpha/{len(comparisons)} = {alpha / len(comparisons):.4g}; "
             f"reproductions needed: both tests at 80% at that threshold"]
    if n < 2:
        return "\n".join([*lines, "  fewer than 2 reproductions: no paired test is possible"])
    for a, b in comparisons:
        value = sds.get((a, b))
        if value is None:
            lines.append(f"  {a} vs {b}: no SD (the pilot lacks this comparison)")
            continue
        if isinstance(value, PilotSpread) and not math.isfinite(value.sd):
            lines.append(f"  {a} vs {b}: no SD (the pilot's {value.pairs} paired differences are all equal; "
                         "state one with --sd)")
            continue
        sd = value.sd if isinstance(value, PilotSpread) else value
        result = comparison_power(a, b, n, sd, margin, len(comparisons), alpha)
        lines.append(f"  {a} vs {b}: SD {100 * sd:.2f} points; t-test {result.ttest:.2f} / {result.ttest_holm:.2f}; "
                     f"TOST {result.tost:.2f} / {result.tost_holm:.2f}; needed {_needed(result.needed)}; "
                     f"detectable difference {100 * result.detectable:.2f} points"
                     + (_at_upper_bound(value, margin, len(comparisons), alpha) if isinstance(value, PilotSpread) else ""))
    return "\n".join(lines)


def _needed(needed: int | None) -> str:
    return f"more than {MAX_REPRODUCTIONS}" if needed is None else str(needed)


def _at_upper_bound(pilot: PilotSpread, margin: float, comparisons: int, alpha: float) -> str:
    """How uncertain a pilot's SD is: its upper bound and the reproductions needed there. A few
    reproductions estimate an SD poorly (from 2, the bound is about 4 times the estimate)."""
    bound = sd_upper_bound(pilot.sd, pilot.pairs)
    needed = comparison_power("", "", 2, bound, margin, comparisons, alpha).needed
    return (f"; but from {pilot.pairs} pilot pairs ({pilot.pairs - 1} degree(s) of freedom) the SD may be up to "
            f"{100 * bound:.2f} points ({100 * SD_BOUND_CONFIDENCE:g}% upper confidence bound, chi-square), "
            f"which needs {_needed(needed)}")


def dry_run_plan(family: Family, planning_sd: float | None, planning_search_sd: float | Mapping[str, float] | None = None) -> str:
    """What ``benchmark --dry-run`` prints about power: the plan at ``analysis.planning_sd`` (and over searches
    and seeds at ``analysis.planning_search_sd``), or how to get them."""
    if planning_sd is None:
        return ("power: no analysis.planning_sd in the config; `dmlbench plan [CONFIG] --pilot DIR` measures it on a "
                "stored benchmark, `--sd X` states it")
    sds = {pair: planning_sd for pair in family.comparisons}
    text = plan_text(family, sds, f"{100 * planning_sd:.2f} points (analysis.planning_sd)")
    if planning_search_sd is None:
        return text + ("\nsearches and seeds: no analysis.planning_search_sd in the config; `dmlbench plan [CONFIG] "
                       "--search-sd X` plans searches and seeds (a pilot with repeated searches measures it)")
    return text + "\n" + search_plan_text(family, sds, planning_search_sd, "analysis.planning_search_sd")


def search_plan_text(family: Family, sds: Mapping[tuple[str, str], float | PilotSpread], search_sd: float | Mapping[str, float],
                     source: str, alpha: float = 0.05, search_sd_bound: float | Mapping[str, float] | None = None,
                     other_trials: Mapping[int, float] | None = None) -> str:
    """Planning over searches and seeds (``analysis.search_luck``): for verdicts about the methods, the power of
    the family's design and the cheapest design (searches x reproductions, in training runs per method) at
    which every comparison's t-test and TOST reach 80% at the strictest Holm threshold, each comparison at its
    own seed SD and search luck (``search_sd``: one SD for every method, or each method's: a comparison carries
    ``sigma_a² + sigma_b²``, ``statistics.pair_search_sd``); with ``search_sd_bound`` (a pilot's upper bounds,
    ``search_luck.search_sd_upper_bound``) also the cheapest design there; with ``other_trials`` (trials per
    search -> the search SD measured at that many, one for every method) the cheapest design over trials per
    search too (``search_luck.cheapest_over_trials``)."""
    m = len(family.comparisons)
    lines = [f"searches and seeds (verdicts about the methods, their search included): search SD {search_sd_words(search_sd)} "
             f"({source}); {family.trials} trials of {family.folds} fold runs per search; designs priced in "
             f"training runs per method"]
    finite = spreads(sds)
    if not finite:
        return "\n".join([*lines, "  no SD of paired differences: nothing to plan"])
    compared = [pair for pair in family.comparisons if pair in finite]
    if family.searches >= 2:
        for a, b in compared:
            luck = pair_search_sd(search_sd, a, b)
            t_power, tost = design_power(family.searches, max(family.reproductions, 2), luck, finite[(a, b)], family.margin, m, alpha)
            lines.append(f"  this config ({family.searches} searches x {family.reproductions} reproductions), {a} vs {b} "
                         f"(search SD {100 * luck:.2f}, seed SD {100 * finite[(a, b)]:.2f} points): t-test {t_power:.2f}, TOST {tost:.2f}")
    else:
        lines.append("  this config searches once per method: its verdicts are conditional on that search "
                     "(protocol.search_repeats >= 2 judges the methods)")
    at_sd = [(pair_search_sd(search_sd, a, b), finite[(a, b)]) for a, b in compared]
    lines.append(f"  cheapest design: {_design_text(at_sd, family, m, alpha, compared)}")
    if search_sd_bound is not None:
        at_bound = [(pair_search_sd(search_sd_bound, a, b), finite[(a, b)]) for a, b in compared]
        lines.append(f"  but from the pilot's searches the search SD may be up to {search_sd_words(search_sd_bound)} "
                     f"({100 * SD_BOUND_CONFIDENCE:.0f}% upper bound, chi-square, approximate; a long tail of unlucky "
                     f"searches can exceed it): cheapest design there: {_design_text(at_bound, family, m, alpha, compared)}")
    if other_trials:
        pooled = (math.sqrt(sum(sd**2 for sd in search_sd.values()) / len(search_sd)) if isinstance(search_sd, Mapping)
                  else search_sd)  # the other trials' SDs are one for every method: compare like with like
        trial_sds = {family.trials: pooled, **other_trials}
        lines.extend(_over_trials_lines(trial_sds, [finite[pair] for pair in compared], family, m, alpha))
    return "\n".join(lines)


def _over_trials_lines(search_sds: Mapping[int, float], seed_sds: Sequence[float], family: Family, comparisons: int,
                       alpha: float) -> list[str]:
    """The cheapest design at each number of trials per search whose search SD (one for every method) is known,
    and over them."""
    designs = {trials: cheapest_family_design([(sd, seed_sd) for seed_sd in seed_sds], family.margin, comparisons, trials,
                                              family.folds, alpha=alpha)
               for trials, sd in sorted(search_sds.items())}
    lines = ["  trials per search (the search SD measured at each; Bouthillier et al. 2021):"]
    lines += [f"    {trials} trial(s), search SD {100 * search_sds[trials]:.2f} points: {_design_words(design)}"
              for trials, design in designs.items()]
    best = cheapest_over_trials(designs)
    if best is None:
        lines.append("  cheapest over trials per search: none reaches 80%")
    else:
        trials, design = best
        lines.append(f"  cheapest over trials per search: protocol.trials={trials} protocol.search_repeats={design.searches} "
                     f"protocol.reproductions={design.reproductions} ({design.runs_per_method} training runs per method)")
    return lines


def _design_text(spreads: Sequence[tuple[float, float]], family: Family, comparisons: int, alpha: float,
                 pairs: Sequence[tuple[str, str]] = ()) -> str:
    """The cheapest design for every comparison (``spreads``, in the order of ``pairs``); when none serves them all,
    the cheapest for those that some design can serve, naming the ones no design within reach decides."""
    design = cheapest_family_design(spreads, family.margin, comparisons, family.trials, family.folds, alpha=alpha)
    if design is not None or not pairs:
        return _design_words(design)
    hopeless = [pair for pair, spread in zip(pairs, spreads)
                if cheapest_family_design([spread], family.margin, comparisons, family.trials, family.folds, alpha=alpha) is None]
    rest = [spread for pair, spread in zip(pairs, spreads) if pair not in hopeless]
    named = ", ".join(f"{a} vs {b}" for a, b in hopeless)
    if not rest:
        return _design_words(None)
    return (f"none within {MAX_SEARCHES} searches for {named} (their search luck alone exceeds what the margin allows); "
            f"for the other {len(rest)}: "
            + _design_words(cheapest_family_design(rest, family.margin, comparisons, family.trials, family.folds, alpha=alpha)))


def _design_words(design: Design | None) -> str:
    if design is None:
        return f"none within {MAX_SEARCHES} searches reaches 80%: the search luck alone exceeds what the margin allows"
    return (f"protocol.search_repeats={design.searches} protocol.reproductions={design.reproductions} "
            f"({design.runs_per_method} training runs per method; t-test {design.ttest_power:.2f}, TOST {design.tost_power:.2f})")
