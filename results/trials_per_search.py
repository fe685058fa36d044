"""Fewer trials per search and more searches, or the reverse? The selection side of the question, from a
report folder with repeated searches (``budget.csv``, ``benchmark.json``):

    python results/trials_per_search.py results/search_luck_method_glyphs \
        -o results/search_luck_method_glyphs/trials_per_search.csv

Bouthillier et al. (MLSys 2021, "Accounting for variance in machine learning benchmarks", §4) found that
an estimate which redraws every source of variation, the search included, is better per unit of compute
than one long search followed by seeds. Here a search of ``t`` trials is the first ``t`` trials of each
recorded search: exact when the search is random (every trial one of the sampler's start-up trials, as
the report's "sampler" line says), since trial ``j`` is then an independent draw whatever the budget;
the script refuses a search whose later trials were modelled. Per method and ``t``: over the ``k``
searches, the mean and SD of the best validation score after ``t`` trials (the score by which the search
chose its configuration), the share of searches whose choice after ``t`` trials is already the final one,
and the standard error of the method's mean at the *cost* of the recorded design: a budget that buys
``k`` searches of ``T`` trials and ``r`` reproductions (``folds`` runs each) buys
``k (T + r) / (t + r)`` searches of ``t`` trials, so ``se_at_equal_cost = sd_t / sqrt(k (T + r) / (t + r))``.

What this does not measure: the test score of a shorter search's choice (only the final choice of each
search was reproduced), so it says how precisely each design pins down *its own* selection, not which
design gives the more precise verdict on test. Columns: method, trials, searches, best_validation_mean,
best_validation_sd, same_choice_share, runs_per_search, se_at_equal_cost.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

COLUMNS = ["method", "trials", "searches", "best_validation_mean", "best_validation_sd", "same_choice_share",
           "runs_per_search", "se_at_equal_cost"]
OPTUNA_STARTUP_TRIALS = 10  # Optuna's n_startup_trials default (report.tables.OPTUNA_STARTUP_TRIALS)


def running_bests(folder: Path) -> dict[str, list[list[float]]]:
    """``method -> per search, its best validation score after 1, 2, ... trials`` (``budget.csv``)."""
    points: dict[str, dict[int, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    with (folder / "budget.csv").open(newline="") as stream:
        for row in csv.DictReader(stream):
            points[row["method"]][int(row["search"])][int(row["trials"])] = float(row["running_best"])
    return {method: [[by_trials[t] for t in sorted(by_trials)] for _, by_trials in sorted(searches.items())]
            for method, searches in points.items()}


def design(folder: Path) -> tuple[int, int, int]:
    """The recorded design: trials per search, reproductions per search and folds; a search whose later
    trials were modelled by the sampler cannot be cut short exactly, so it is refused."""
    protocol = json.loads((folder / "benchmark.json").read_text())["protocol"]
    startup = protocol.get("startup_trials")
    startup = OPTUNA_STARTUP_TRIALS if startup is None else int(startup)
    if startup < protocol["trials"]:
        raise SystemExit(f"{folder}: trials {startup + 1}-{protocol['trials']} were suggested by the sampler's model, so a "
                         "shorter search is not the first trials of this one")
    return int(protocol["trials"]), int(protocol["reproductions"]), int(protocol["folds"])


def rows(bests: dict[str, list[list[float]]], trials: int, reproductions: int, folds: int) -> list[list[object]]:
    """One row per method and number of trials ``1..trials`` (see the module docstring)."""
    table: list[list[object]] = []
    for method, searches in bests.items():
        complete = [search for search in searches if len(search) == trials]
        k = len(complete)
        for t in range(1, trials + 1):
            values = [search[t - 1] for search in complete]
            sd = statistics.stdev(values) if k >= 2 else math.nan
            same = sum(search[t - 1] == search[-1] for search in complete) / k if k else math.nan
            affordable = k * (trials + reproductions) / (t + reproductions)
            table.append([method, t, k, repr(statistics.fmean(values)) if k else "", repr(sd), repr(same),
                          folds * (t + reproductions), repr(sd / math.sqrt(affordable))])
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a report folder with repeated searches (budget.csv, benchmark.json)")
    parser.add_argument("-o", "--output", type=Path, help="write the CSV here (default: standard output)")
    args = parser.parse_args(argv)
    trials, reproductions, folds = design(args.folder)
    table = rows(running_bests(args.folder), trials, reproductions, folds)
    stream = args.output.open("w", newline="") if args.output else sys.stdout
    try:
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerows([COLUMNS, *table])
    finally:
        if args.output:
            stream.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
