"""Does a study's verdict transfer to another study (another dataset, budget or search)? Both studies'
declared comparisons, re-judged from their ``runs.csv`` by today's rules, side by side.

    python results/transfer.py results/reality_check_glyphs results/reality_check_emoji \
        -o results/reality_check_emoji/transfer_from_glyphs.csv

Each folder's verdicts are recomputed from its ``runs.csv`` and the analysis its ``benchmark.json``
holds in force (``BenchmarkRecord.analysis_in_force``) by the rules the report applies today
(``dmlbench.analysis.verdicts``), so studies committed before those rules are judged like a new one;
the rows and the transfer kinds are ``dmlbench.analysis.transfer``'s. It prints the count of each, and how many of the first study's inconclusive verdicts the second
study decides (better, worse or equivalent): what a stronger study settled that a weaker one could not.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from dmlbench.analysis import transfer, verdicts
from dmlbench.protocol.design.benchmark_file import read_benchmark
from dmlbench.protocol.layout import BASELINES, BENCHMARK_FILE, RUNS_CSV
from dmlbench.protocol.units.results import read_runs


def judged(folder: Path) -> verdicts.Families:
    """The study's declared families, re-judged from its committed files by today's rules."""
    return verdicts.judge(read_runs(folder), read_benchmark(folder).analysis_spec(), BASELINES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="the study whose verdicts are tested (a report or benchmark folder)")
    parser.add_argument("second", type=Path, help="the study they are tested on")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the CSV to write")
    args = parser.parse_args(argv)
    for folder in (args.first, args.second):
        for name in (RUNS_CSV, BENCHMARK_FILE):
            if not (folder / name).is_file():
                parser.error(f"{folder} holds no {name}")
    rows = transfer.transfer_rows(judged(args.first), judged(args.second))
    if not rows:
        parser.error(f"{args.first} and {args.second} declare no comparison in common")
    with args.output.open("w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(transfer.COLUMNS)
        writer.writerows(rows)
    counts = transfer.transfer_counts(rows)
    print(f"{len(rows)} comparisons in common: " + ", ".join(f"{name} {count}" for name, count in counts.items()))
    print(transfer.decided_later(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
