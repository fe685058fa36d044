"""Two changes made at once, told apart: a 2 x 2 design of studies (issue 34, item 4).

The converged glyph study searched the learning rate *and* trained to convergence; the short study did
neither. Four studies, one per cell, each with the same two methods ``A`` and ``B`` at 20
reproductions, measure the gap ``A - B`` (paired by reproduction seed within a study) in every cell:

    python results/confound.py --neither results/fixed_lr_short_glyphs --lr results/lr_search_short_glyphs \
        --budget results/fixed_lr_converged_glyphs --both results/converged_glyphs_strong \
        --a normalized_softmax --b contrastive -o results/converged_glyphs_strong/confound.csv

Rows, per mode and metric (score units: 0.01 is one point):

- ``gap``, one per cell: the mean paired difference ``A - B`` and its Student-t 95% interval;
- ``score_a`` / ``score_b``, one per cell: each method's mean and interval;
- ``effect``: how a change moves the gap, with the other change held: ``lr at short budget`` (lr -
  neither), ``lr at converged budget`` (both - budget), ``budget at fixed lr`` (budget - neither),
  ``budget with lr searched`` (both - lr), and the ``interaction`` ((both - budget) - (lr - neither)).
  The cells are separate studies (other searches, other models), so an effect compares independent
  means: Welch's interval with Satterthwaite's degrees of freedom (for two cells exactly Welch's
  t-test), its two-sided p-value, and the p-value Holm-adjusted over the five effects of one mode and
  metric.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from scipy import stats

from dmlbench.analysis.statistics import holm, mean_interval
from dmlbench.protocol.layout import RUNS_CSV
from dmlbench.protocol.units.results import read_runs

CELLS = ("neither", "lr", "budget", "both")
EFFECTS = {  # name -> {cell: coefficient} of a contrast of the cells' gaps
    "lr at short budget": {"lr": 1, "neither": -1},
    "lr at converged budget": {"both": 1, "budget": -1},
    "budget at fixed lr": {"budget": 1, "neither": -1},
    "budget with lr searched": {"both": 1, "lr": -1},
    "interaction": {"both": 1, "budget": -1, "lr": -1, "neither": 1},
}
COLUMNS = ["mode", "metric", "quantity", "name", "estimate", "ci_low", "ci_high", "df", "pvalue", "pvalue_holm", "n"]


def paired_gaps(scores: Mapping[str, Mapping[int, float]], a: str, b: str) -> np.ndarray:
    """``A - B`` per reproduction both methods have, in reproduction order."""
    common = sorted(set(scores[a]) & set(scores[b]))
    return np.array([scores[a][r] - scores[b][r] for r in common])


def contrast(samples: Mapping[str, np.ndarray], coefficients: Mapping[str, int]) -> tuple[float, float, float, float, float]:
    """``sum c_i mean_i`` of independent samples: estimate, 95% interval, Satterthwaite's degrees of
    freedom and the two-sided p-value of Welch's t (Welch 1947; Satterthwaite 1946)."""
    terms = [(c, samples[cell]) for cell, c in coefficients.items()]
    estimate = float(sum(c * values.mean() for c, values in terms))
    parts = [c * c * values.var(ddof=1) / len(values) for c, values in terms]
    variance = float(sum(parts))
    freedom = variance ** 2 / sum(part ** 2 / (len(values) - 1) for part, (_, values) in zip(parts, terms))
    half = float(stats.t.ppf(0.975, freedom)) * math.sqrt(variance)
    pvalue = float(2.0 * stats.t.sf(abs(estimate) / math.sqrt(variance), freedom))
    return estimate, estimate - half, estimate + half, float(freedom), pvalue


def confound_rows(folders: Mapping[str, Path], a: str, b: str) -> list[list[object]]:
    """``COLUMNS`` rows for every mode and metric all four cells share."""
    tables = {cell: read_runs(folders[cell]) for cell in CELLS}
    endpoints = sorted(set.intersection(*(set(table) for table in tables.values())))
    rows: list[list[object]] = []
    for mode, metric in endpoints:
        gaps = {}
        for cell in CELLS:
            scores = tables[cell][mode, metric]
            for method in (a, b):
                if method not in scores:
                    raise SystemExit(f"{folders[cell]}: no {method} in {RUNS_CSV} ({mode} {metric})")
            gaps[cell] = paired_gaps(scores, a, b)
            for quantity, values in (("gap", gaps[cell]), ("score_a", np.array(list(scores[a].values()))),
                                     ("score_b", np.array(list(scores[b].values())))):
                interval = mean_interval(values)
                rows.append([mode, metric, quantity, cell, interval.mean, interval.low, interval.high, len(values) - 1, "", "", len(values)])
        effects = {name: contrast(gaps, coefficients) for name, coefficients in EFFECTS.items()}
        adjusted = holm([effect[4] for effect in effects.values()])
        for (name, (estimate, low, high, freedom, pvalue)), holm_p in zip(effects.items(), adjusted):
            n = "+".join(str(len(gaps[cell])) for cell in EFFECTS[name])
            rows.append([mode, metric, "effect", name, estimate, low, high, freedom, pvalue, holm_p, n])
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for cell, meaning in zip(CELLS, ("fixed lr, short budget", "lr searched, short budget",
                                     "fixed lr, converged budget", "lr searched, converged budget")):
        parser.add_argument(f"--{cell}", type=Path, required=True, metavar="DIR", help=f"the study of {meaning}")
    parser.add_argument("--a", required=True, help="method A of the gap A - B")
    parser.add_argument("--b", required=True, help="method B")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="CSV")
    args = parser.parse_args(argv)
    folders = {cell: getattr(args, cell) for cell in CELLS}
    for folder in folders.values():
        if not (folder / RUNS_CSV).is_file():
            parser.error(f"{folder} holds no {RUNS_CSV}")
    rows = confound_rows(folders, args.a, args.b)
    with args.output.open("w", newline="") as stream:
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    for row in rows:
        if row[:2] == ["concatenated", "map_at_r"] and row[2] in ("gap", "effect"):
            print(f"{row[2]} {row[3]}: {100 * row[4]:+.2f} [{100 * row[5]:+.2f}, {100 * row[6]:+.2f}] points"
                  + (f", Holm p {row[9]:.3g}" if row[2] == "effect" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
