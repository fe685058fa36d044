"""Kendall's tau between two benchmark studies' rankings of the methods they share, by the methods'
mean scores, with a percentile bootstrap interval over the methods (``correlations.correlation``), an
interval over each study's reproductions and each study's split-half tau
(``correlations.study_agreement``).

    python results/compare_rankings.py results/reality_check_glyphs results/converged_glyphs \
        -o results/converged_glyphs/ranking_against_short_study.csv

Reads each folder's ``runs.csv`` (one row per method, reproduction, mode and metric), leaves out the
baseline rows, and writes one row per mode and metric: the methods compared, tau-b, its 95%
interval with the methods resampled in pairs (would the agreement hold for another set of methods)
and its p-value (scipy.stats.kendalltau), its 95% interval with each method's reproductions resampled
within each study (``repro_ci_low``, ``repro_ci_high``: would it hold for other seeds), each study's
split-half tau (``first_split_half``, ``second_split_half``: how far a study's ranking agrees with
itself across two halves of its seeds, a ceiling for the agreement of two studies), and both
rankings (best first).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from dmlbench.analysis.correlations import correlation, rank_agreement, study_agreement
from dmlbench.protocol.layout import BASELINES, RUNS_CSV
from dmlbench.protocol.units.results import read_runs

COLUMNS = ["mode", "metric", "methods", "kendall_tau", "ci_low", "ci_high", "pvalue", "first_ranking", "second_ranking",
           "repro_ci_low", "repro_ci_high", "first_split_half", "second_split_half"]


def scores(folder: Path) -> dict[tuple[str, str], dict[str, list[float]]]:
    """``(mode, metric) -> method -> the reproductions' scores`` from ``folder/runs.csv``, baselines left out."""
    return {endpoint: {method: list(values.values()) for method, values in by_method.items() if method not in BASELINES}
            for endpoint, by_method in read_runs(folder).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="a benchmark report folder (holds runs.csv)")
    parser.add_argument("second", type=Path, help="another one")
    parser.add_argument("-o", "--output", type=Path, help="write the CSV here (default: standard output)")
    parser.add_argument("--resamples", type=int, default=9999)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for folder in (args.first, args.second):
        if not (folder / RUNS_CSV).is_file():
            parser.error(f"{folder} holds no {RUNS_CSV}")
    first, second = scores(args.first), scores(args.second)
    rows = []
    for key in sorted(set(first) & set(second)):
        shared = sorted(set(first[key]) & set(second[key]))
        if len(shared) < 3:
            continue
        a, b = ({name: sum(study[key][name]) / len(study[key][name]) for name in shared} for study in (first, second))
        tau = correlation([a[n] for n in shared], [b[n] for n in shared], "kendall", resamples=args.resamples, seed=args.seed)
        ranks = rank_agreement(a, b).ranks
        order = [" > ".join(sorted(shared, key=lambda name: ranks[name][side])) for side in (0, 1)]
        seeds = study_agreement({name: first[key][name] for name in shared}, {name: second[key][name] for name in shared},
                                resamples=args.resamples, seed=args.seed)
        rows.append([*key, len(shared), f"{tau.estimate:.4f}", f"{tau.low:.4f}", f"{tau.high:.4f}", f"{tau.pvalue:.4g}", *order,
                     f"{seeds.low:.4f}", f"{seeds.high:.4f}", f"{seeds.first_split_half:.4f}", f"{seeds.second_split_half:.4f}"])
    stream = args.output.open("w", newline="") if args.output else sys.stdout
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows(rows)
    if args.output:
        stream.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
