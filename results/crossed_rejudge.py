"""The method-level verdicts of the committed studies whose searches shared their reproduction seeds, judged both
ways from their ``runs.csv``: as independent search means (what their ``method_comparisons.csv`` held before the
crossed model) and by the crossed search x seed model (``dmlbench.analysis.crossed``, what ``dmlbench rejudge``
writes now). One row per comparison whose outcome differs, for every study with repeated searches:

    python results/crossed_rejudge.py -o results/crossed_rejudge.csv

Columns: study, mode, metric, a, b, searches, seeds, outcome_search_means, outcome_crossed,
t_pvalue_holm_search_means, t_pvalue_holm_crossed. The summary printed gives, per study, how many
method-level verdicts were decided under each analysis and how many changed.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from dmlbench.analysis.endpoints import read_search_table
from dmlbench.protocol.design.benchmark import SHARED_SEEDS
from dmlbench.protocol.design.benchmark_file import read_benchmark
from dmlbench.report.uncertainty import judged_method_families, repeated_scores

RESULTS = Path(__file__).resolve().parent
COLUMNS = ("study", "mode", "metric", "a", "b", "searches", "seeds", "outcome_search_means", "outcome_crossed",
           "t_pvalue_holm_search_means", "t_pvalue_holm_crossed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    rows = []
    for study in sorted(path.parent for path in RESULTS.glob("*/runs.csv")):
        record = read_benchmark(study)
        scores = repeated_scores(read_search_table(study / "runs.csv"))
        if not scores or record.protocol.search_seeds != SHARED_SEEDS:
            continue
        analysis = record.analysis_spec()
        before = judged_method_families(scores, analysis, shared_seeds=False)
        now = judged_method_families(scores, analysis, shared_seeds=True)
        decided = [0, 0]
        for (mode, metric, old), (_, _, new) in zip(before, now):
            for a, b in zip(old, new):
                decided[0] += a.outcome() != "inconclusive"
                decided[1] += b.outcome() != "inconclusive"
                if a.outcome() != b.outcome():
                    seeds = len(scores[(mode, metric)][a.a][0])
                    rows.append([study.name, mode, metric, a.a, a.b, a.n, seeds, a.outcome(), b.outcome(),
                                 repr(a.t_pvalue_holm), repr(b.t_pvalue_holm)])
        changed = sum(row[0] == study.name for row in rows)
        print(f"{study.name}: decided {decided[0]} as independent search means, {decided[1]} by the crossed model; "
              f"{changed} changed")
    with args.output.open("w", newline="") as handle:
        csv.writer(handle, lineterminator="\n").writerows([COLUMNS, *rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
