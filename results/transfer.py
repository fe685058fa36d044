"""Does a study's verdict transfer to another study (another dataset, budget or search)? Both studies'
declared comparisons, re-judged from their ``runs.csv`` by today's rules, side by side.

    python results/transfer.py results/reality_check_glyphs results/reality_check_emoji \
        -o results/reality_check_emoji/transfer_from_glyphs.csv

Each folder's verdicts are recomputed from its ``runs.csv`` and the analysis its ``benchmark.json``
holds in force (``BenchmarkRecord.analysis_in_force``) (references, pairs, equivalence margin), by the rules the report applies today: one
Holm family per mode and metric holding every declared comparison (``benchmark.declared_comparisons``),
reproductions paired by number (each reproduction number is one seed for every method; as in the
report, only the numbers every method scored), better / worse
from the Holm-adjusted paired t-test, equivalent from the Holm-adjusted TOST
(``statistics.compare_pairs``, ``PairedComparison.outcome``). So studies committed before those rules
(whose ``claim_comparisons.csv`` used other families) are judged like a new one.

Writes one row per comparison that both studies declare (either orientation, written as the first
study's), per mode and metric: each study's reproductions, mean difference, 95% interval, Holm-adjusted
p-values and verdict, and ``transfer``:

- ``holds``: the first study's verdict is better, worse or equivalent and the second's is the same;
- ``reversed``: better in one and worse in the other;
- ``not confirmed``: the first study decided, the second did not reach that verdict (another or none);
- ``nothing to transfer``: the first study's verdict was inconclusive (the second's is shown, new).

It prints the count of each, and how many of the first study's inconclusive verdicts the second
study decides (better, worse or equivalent): what a stronger study settled that a weaker one could not.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

from dmlbench.protocol.benchmark import declared_comparisons
from dmlbench.protocol.benchmark_file import read_benchmark
from dmlbench.protocol.layout import BASELINES, BENCHMARK_FILE, RUNS_CSV
from dmlbench.protocol.results import common_seeds, read_runs
from dmlbench.protocol.statistics import PairedComparison, compare_pairs

STUDY_COLUMNS = ["n", "mean_difference", "ci_low", "ci_high", "t_pvalue_holm", "tost_pvalue_holm", "outcome"]
COLUMNS = ["mode", "metric", "a", "b",
           *[f"first_{name}" for name in STUDY_COLUMNS], *[f"second_{name}" for name in STUDY_COLUMNS],
           "family_size_first", "family_size_second", "transfer"]
DECIDED = ("better", "worse", "equivalent")


def verdicts(folder: Path) -> dict[tuple[str, str], tuple[int, dict[frozenset[str], PairedComparison]]]:
    """``(mode, metric) -> (family size, {frozenset({a, b}): comparison})``: the study's declared family,
    re-judged by today's rules."""
    analysis = read_benchmark(folder).analysis_in_force()
    margin = float(analysis.get("equivalence_margin", 0.01))
    families = {}
    for endpoint, stored in sorted(read_runs(folder).items()):
        # Paired as the report pairs them: the reproductions every method scored.
        scores = common_seeds({method: values for method, values in stored.items() if method not in BASELINES})
        declared = declared_comparisons(analysis.get("references", []), analysis.get("pairs", []), list(scores))
        family = compare_pairs(scores, declared, margin) if declared else []
        families[endpoint] = (len(family), {frozenset((c.a, c.b)): c for c in family})
    return families


def oriented(comparison: PairedComparison, a: str) -> list[object]:
    """``STUDY_COLUMNS`` of ``comparison`` written as ``a - other``."""
    c = comparison if comparison.a == a else comparison.swapped()
    return [c.n, c.mean_difference, c.difference_low, c.difference_high, c.t_pvalue_holm, c.tost_pvalue_holm, c.outcome()]


def transfer(first: str, second: str) -> str:
    if first not in DECIDED:
        return "nothing to transfer"
    if first == second:
        return "holds"
    return "reversed" if {first, second} == {"better", "worse"} else "not confirmed"


def transfer_rows(first: Path, second: Path) -> list[list[object]]:
    first_families, second_families = verdicts(first), verdicts(second)
    rows = []
    for endpoint, (first_size, first_family) in first_families.items():
        second_size, second_family = second_families.get(endpoint, (0, {}))
        for key, comparison in first_family.items():
            if key in second_family:
                a, b = comparison.a, comparison.b
                left, right = oriented(comparison, a), oriented(second_family[key], a)
                rows.append([*endpoint, a, b, *left, *right, first_size, second_size, transfer(str(left[-1]), str(right[-1]))])
    return rows


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
    rows = transfer_rows(args.first, args.second)
    if not rows:
        parser.error(f"{args.first} and {args.second} declare no comparison in common")
    with args.output.open("w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    counts = defaultdict(int)
    for row in rows:
        counts[row[-1]] += 1
    print(f"{len(rows)} comparisons in common: " + ", ".join(f"{name} {count}" for name, count in sorted(counts.items())))
    print(decided_later(rows))
    return 0


def decided_later(rows: list[list[object]]) -> str:
    """How many of the first study's inconclusive verdicts the second study decides, by verdict."""
    first, second = COLUMNS.index("first_outcome"), COLUMNS.index("second_outcome")
    undecided = [row for row in rows if row[first] == "inconclusive"]
    decided = defaultdict(int)
    for row in undecided:
        if row[second] in DECIDED:
            decided[row[second]] += 1
    shown = "".join(f", {name} {decided[name]}" for name in DECIDED if decided[name])
    return f"of the first study's {len(undecided)} inconclusive verdicts, the second decides {sum(decided.values())}{shown}"


if __name__ == "__main__":
    sys.exit(main())
