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

That side says how precisely each design pins down *its own* selection, not which gives the more precise
verdict on test: only the final choice of each search was reproduced. Columns: method, trials, searches,
best_validation_mean, best_validation_sd, same_choice_share, runs_per_search, se_at_equal_cost.

The test side, with ``--short SHORT``: a second study whose search ``s`` is the first trials of this one's
search ``s`` (the same config with fewer ``protocol.trials``), its choices reproduced on the same seeds.
Per method, over the searches both studies ran: the mean and SD of the search means of test
``--metric`` (concatenated) in each study, the SE of the method's mean at the longer design's cost as
above, and how many searches chose the same configuration in both, with how many of those gave
identical reproductions (they must: the same configuration on the same seeds). Columns (``--test-output``):
method, trials, searches, test_mean, test_sd, runs_per_search, se_at_equal_cost, same_choice, identical.
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

from dmlbench.analysis.endpoints import read_search_table
from dmlbench.errors import UserInputError
from dmlbench.report.tables import OPTUNA_STARTUP_TRIALS

COLUMNS = ["method", "trials", "searches", "best_validation_mean", "best_validation_sd", "same_choice_share",
           "runs_per_search", "se_at_equal_cost"]
TEST_COLUMNS = ["method", "trials", "searches", "test_mean", "test_sd", "runs_per_search", "se_at_equal_cost", "same_choice",
                "identical"]


def committed_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a committed CSV; one cut short (reports write them whole, ending in a newline) is refused
    in one line rather than read in part."""
    try:
        text = path.read_text()
    except OSError as error:
        raise SystemExit(f"{path} cannot be read ({error.strerror})") from None
    if text and not text.endswith("\n"):
        raise SystemExit(f"{path} is truncated (it does not end with a whole row); restore it from a copy")
    return list(csv.DictReader(text.splitlines()))


def running_bests(folder: Path) -> dict[str, list[list[float]]]:
    """``method -> per search, its best validation score after 1, 2, ... trials`` (``budget.csv``)."""
    points: dict[str, dict[int, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for line, row in enumerate(committed_rows(folder / "budget.csv"), start=2):
        try:
            points[row["method"]][int(row["search"])][int(row["trials"])] = float(row["running_best"])
        except (KeyError, TypeError, ValueError):
            raise SystemExit(f"{folder / 'budget.csv'} line {line} is not a row of a report's budget.csv") from None
    return {method: [[by_trials[t] for t in sorted(by_trials)] for _, by_trials in sorted(searches.items())]
            for method, searches in points.items()}


def design(folder: Path) -> tuple[int, int, int]:
    """The recorded design: trials per search, reproductions per search and folds; a search whose later
    trials were modelled by the sampler cannot be cut short exactly, so it is refused."""
    try:
        protocol = json.loads((folder / "benchmark.json").read_text())["protocol"]
        startup = protocol.get("startup_trials")
        startup = OPTUNA_STARTUP_TRIALS if startup is None else int(startup)
        trials, reproductions_per_search, folds = int(protocol["trials"]), int(protocol["reproductions"]), int(protocol["folds"])
    except (OSError, ValueError, KeyError, TypeError):
        raise SystemExit(f"{folder / 'benchmark.json'} is missing or damaged (no protocol with trials, reproductions "
                         "and folds); restore it from a copy") from None
    if startup < trials:
        raise SystemExit(f"{folder}: trials {startup + 1}-{trials} were suggested by the sampler's model, so a "
                         "shorter search is not the first trials of this one")
    return trials, reproductions_per_search, folds


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


def search_choices(folder: Path, metric: str) -> dict[str, dict[int, tuple[str, float]]]:
    """``method -> search -> (best parameters, mean test score)`` from ``search_repeats.csv``."""
    column = f"test_concatenated_{metric}"
    found: dict[str, dict[int, tuple[str, float]]] = defaultdict(dict)
    for line, row in enumerate(committed_rows(folder / "search_repeats.csv"), start=2):
        try:
            found[row["method"]][int(row["search"])] = (row["best_params"], float(row[column]))
        except (KeyError, TypeError, ValueError):
            raise SystemExit(f"{folder / 'search_repeats.csv'} line {line} is not a row of a report's search_repeats.csv "
                             f"with {column}") from None
    return found


def reproductions(folder: Path, metric: str) -> dict[tuple[str, int], list[float]]:
    """``(method, search) -> its reproductions' test scores`` (concatenated ``metric``), read by dmlbench's own
    reader of ``runs.csv`` (which refuses a damaged copy)."""
    try:
        table = read_search_table(folder / "runs.csv")
    except (OSError, UserInputError) as error:
        raise SystemExit(str(error)) from None
    return {(method, search): list(by_reproduction.values())
            for method, by_search in table.get(("concatenated", metric), {}).items()
            for search, by_reproduction in by_search.items()}


def test_rows(long: Path, short: Path, metric: str) -> list[list[object]]:
    """Per method, one row for the short study and one for the long, over the searches both ran."""
    (long_trials, reproductions_per_search, folds), (short_trials, short_reproductions, _) = design(long), design(short)
    if short_reproductions != reproductions_per_search or short_trials >= long_trials:
        raise SystemExit(f"{short} must have fewer trials per search than {long} and as many reproductions")
    long_choices, short_choices = search_choices(long, metric), search_choices(short, metric)
    long_runs, short_runs = reproductions(long, metric), reproductions(short, metric)
    table: list[list[object]] = []
    for method, by_search in short_choices.items():
        searches = sorted(set(by_search) & set(long_choices.get(method, {})))
        same = [s for s in searches if by_search[s][0] == long_choices[method][s][0]]
        identical = sum(short_runs[method, s] == long_runs[method, s] for s in same)
        for trials, choices in ((short_trials, by_search), (long_trials, long_choices[method])):
            values = [choices[s][1] for s in searches]
            sd = statistics.stdev(values) if len(values) >= 2 else math.nan
            affordable = len(searches) * (long_trials + reproductions_per_search) / (trials + reproductions_per_search)
            table.append([method, trials, len(searches), repr(statistics.fmean(values)), repr(sd),
                          folds * (trials + reproductions_per_search), repr(sd / math.sqrt(affordable)), len(same), identical])
    return table


def write(rows: list[list[object]], columns: list[str], output: Path | None) -> None:
    stream = output.open("w", newline="") if output else sys.stdout
    try:
        csv.writer(stream, lineterminator="\n").writerows([columns, *rows])
    finally:
        if output:
            stream.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a report folder with repeated searches (budget.csv, benchmark.json)")
    parser.add_argument("-o", "--output", type=Path, help="write the CSV here (default: standard output)")
    parser.add_argument("--short", type=Path, help="a study whose searches are the first trials of this one's (the test side)")
    parser.add_argument("--test-output", type=Path, help="with --short: write the test side's CSV here")
    parser.add_argument("--metric", default="map_at_r", help="with --short: the test metric (concatenated)")
    args = parser.parse_args(argv)
    trials, reproductions_per_search, folds = design(args.folder)
    write(rows(running_bests(args.folder), trials, reproductions_per_search, folds), COLUMNS, args.output)
    if args.short:
        write(test_rows(args.folder, args.short, args.metric), TEST_COLUMNS, args.test_output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
