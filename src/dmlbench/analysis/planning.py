"""Planning a benchmark's declared comparisons: the power of its one Holm family at a given spread of
the paired differences (measured on a pilot study's ``runs.csv`` or stated), and the reproductions
needed; the functions of ``analysis.power`` applied to a ``Family``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from dmlbench.analysis.endpoints import ScoreTable
from dmlbench.analysis.power import MAX_REPRODUCTIONS, comparison_power, paired_sd


@dataclass(frozen=True)
class Family:
    """The declared comparisons of one endpoint as a benchmark plans them: ``(a, b)`` pairs for ``a - b``,
    the reproductions each method gets, the equivalence margin and the endpoint ``(mode, metric)``."""

    comparisons: list[tuple[str, str]]
    reproductions: int
    margin: float
    endpoint: tuple[str, str]


def pilot_sds(scores: ScoreTable, family: Family) -> dict[tuple[str, str], float]:
    """The SD of each declared comparison's paired differences on the family's endpoint in a stored
    benchmark's scores (reproductions paired by number, i.e. by seed); comparisons the pilot lacks, or
    whose differences have no spread, are left out."""
    values = scores.get(family.endpoint, {})
    sds = {}
    for a, b in family.comparisons:
        if a in values and b in values:
            common = sorted(set(values[a]) & set(values[b]))
            sd = paired_sd([values[a][r] - values[b][r] for r in common])
            if math.isfinite(sd) and sd > 0.0:
                sds[(a, b)] = sd
    return sds


def plan_text(family: Family, sds: Mapping[tuple[str, str], float], source: str, alpha: float = 0.05) -> str:
    """The planning table: per declared comparison its SD, the power of both tests at the configured
    reproductions (unadjusted / strictest Holm threshold) and the reproductions needed for 80%."""
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
        sd = sds.get((a, b))
        if sd is None:
            lines.append(f"  {a} vs {b}: no SD (the pilot lacks this comparison)")
            continue
        result = comparison_power(a, b, n, sd, margin, len(comparisons), alpha)
        needed = f"more than {MAX_REPRODUCTIONS}" if result.needed is None else str(result.needed)
        lines.append(f"  {a} vs {b}: SD {100 * sd:.2f} points; t-test {result.ttest:.2f} / {result.ttest_holm:.2f}; "
                     f"TOST {result.tost:.2f} / {result.tost_holm:.2f}; needed {needed}; "
                     f"detectable difference {100 * result.detectable:.2f} points")
    return "\n".join(lines)


def dry_run_plan(family: Family, planning_sd: float | None) -> str:
    """What ``benchmark --dry-run`` prints about power: the plan at ``analysis.planning_sd``, or how to get one."""
    if planning_sd is None:
        return ("power: no analysis.planning_sd in the config; `dmlbench plan CONFIG --pilot DIR` measures it on a "
                "stored benchmark, `--sd X` states it")
    return plan_text(family, {pair: planning_sd for pair in family.comparisons},
                     f"{100 * planning_sd:.2f} points (analysis.planning_sd)")
