"""Error rates of the method-level verdict under the two designs of repeated searches, by simulation with known
truth (the numbers ``analysis/crossed.py`` and docs/protocol.md quote):

    python results/crossed_model_simulation.py -o results/crossed_model_simulation.csv

Two methods, ``searches x 3`` reproductions, at the spreads near those measured on glyphs (score units: search luck
of the difference 0.01, a seed x method effect 0.005, the rest 0.007). ``fresh``: every search draws its own seeds
(``protocol.search_seeds: fresh``); ``shared``: every search reuses the same three seeds, so the seed x method
effect is drawn once per seed (every study committed before). Analyses: ``search_means`` (the paired t-test over
the searches' means, what ``verdicts.judge_methods`` does for fresh seeds and what it did for every design
before), ``crossed`` (``analysis.crossed``: containment degrees of freedom, what it does for shared seeds) and
``crossed_satterthwaite`` (the same variance estimate with Satterthwaite's degrees of freedom, the usual choice
this project rejected). Per row: the share of studies with a "better"/"worse" verdict at a true difference of 0
(type-I error, nominal 0.05) and the share whose 95 % interval covers a true difference of one point, over
``STUDIES`` studies each, with its Monte Carlo standard error.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

from dmlbench.analysis.spec import AnalysisSpec
from dmlbench.analysis.verdicts import judge_methods

STUDIES = 2000
SEEDS = 3
SEARCH_SD, SEED_METHOD_SD, RESIDUAL_SD = 0.01, 0.005, 0.007
ENDPOINT = ("concatenated", "precision_at_1")
COLUMNS = ("design", "analysis", "searches", "seeds", "studies", "type_one_error", "type_one_se", "coverage", "coverage_se")


def _differences(rng: np.random.Generator, searches: int, difference: float, shared: bool) -> np.ndarray:
    seed_effect = (np.broadcast_to(rng.normal(0, SEED_METHOD_SD, SEEDS), (searches, SEEDS)) if shared
                   else rng.normal(0, SEED_METHOD_SD, (searches, SEEDS)))
    return difference + rng.normal(0, SEARCH_SD, (searches, 1)) + seed_effect + rng.normal(0, RESIDUAL_SD, (searches, SEEDS))


def _judged(table: np.ndarray, analysis: str) -> tuple[bool, float, float]:
    """(better/worse at 0.05, interval low, interval high) of one study's ``searches x seeds`` paired differences."""
    if analysis == "crossed_satterthwaite":
        k, n = table.shape
        grand = table.mean()
        ms_a = n * ((table.mean(1) - grand) ** 2).sum() / (k - 1)
        ms_b = k * ((table.mean(0) - grand) ** 2).sum() / (n - 1)
        residual = table - table.mean(1, keepdims=True) - table.mean(0, keepdims=True) + grand
        ms_e = (residual**2).sum() / ((k - 1) * (n - 1))
        variance = max(ms_a + ms_b - ms_e, ms_e)
        terms = [(ms_a, k - 1), (ms_b, n - 1), (-ms_e, (k - 1) * (n - 1))] if variance > ms_e else [(ms_e, (k - 1) * (n - 1))]
        df = variance**2 / sum(value**2 / freedom for value, freedom in terms)
        se = math.sqrt(variance / (k * n))
        half = stats.t.ppf(0.975, df) * se
        return bool(2 * stats.t.sf(abs(grand) / se, df) < 0.05), grand - half, grand + half
    scores = {"a": {s: {r: 0.6 + float(table[s, r]) for r in range(table.shape[1])} for s in range(table.shape[0])},
              "b": {s: {r: 0.6 for r in range(table.shape[1])} for s in range(table.shape[0])}}
    (comparison,) = judge_methods({ENDPOINT: scores}, AnalysisSpec(), shared_seeds=analysis == "crossed")[ENDPOINT]
    return comparison.outcome() in ("better", "worse"), comparison.difference_low, comparison.difference_high


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    rows = []
    for design in ("fresh", "shared"):
        for analysis in ("search_means", "crossed", "crossed_satterthwaite"):
            for searches in (3, 5, 29):
                rng = np.random.default_rng([searches, design == "shared", len(analysis)])
                rejected = covered = 0
                for _ in range(STUDIES):
                    rejected += _judged(_differences(rng, searches, 0.0, design == "shared"), analysis)[0]
                    _, low, high = _judged(_differences(rng, searches, 0.01, design == "shared"), analysis)
                    covered += low <= 0.01 <= high
                type_one, coverage = rejected / STUDIES, covered / STUDIES
                rows.append([design, analysis, searches, SEEDS, STUDIES, repr(type_one),
                             repr(math.sqrt(type_one * (1 - type_one) / STUDIES)), repr(coverage),
                             repr(math.sqrt(coverage * (1 - coverage) / STUDIES))])
                print(f"{design:6} {analysis:22} {searches:2} x {SEEDS}: type-I {type_one:.3f}, coverage {coverage:.3f}")
    with args.output.open("w", newline="") as handle:
        csv.writer(handle, lineterminator="\n").writerows([COLUMNS, *rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
