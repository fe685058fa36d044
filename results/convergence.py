"""Has every method's validation curve flattened? One row per method and stage from a report folder's
``validation_curves.csv``, so the statement in results/README.md can be re-derived:

    python results/convergence.py results/converged_glyphs --after 20 \
        -o results/converged_glyphs/convergence.csv

Per run (one fold of one trial or reproduction): its number of validation evaluations (evaluation 0,
the untrained model, not counted), whether early stopping ended it before the protocol's last epoch,
the evaluation of its best value, and its gain after evaluation ``--after``: the best value over the
whole run minus the best up to and including that evaluation, in points (0 when the run had reached
its best by then). Columns: method, stage, metric, runs, stopped_early, evaluations_mean,
best_evaluation_mean, after, gain_after_mean, gain_after_max.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

COLUMNS = ["method", "stage", "metric", "runs", "stopped_early", "evaluations_mean", "best_evaluation_mean", "after",
           "gain_after_mean", "gain_after_max"]


def curves(folder: Path, metric: str) -> dict[tuple[str, str], list[list[float]]]:
    """``(method, stage) -> every run's curve`` (index = evaluation) of ``metric``."""
    points: dict[tuple[str, str, str, str], dict[int, float]] = defaultdict(dict)
    with (folder / "validation_curves.csv").open(newline="") as stream:
        for row in csv.DictReader(stream):
            if row["metric"] == metric:
                points[row["method"], row["stage"], row["unit"], row["fold"]][int(row["evaluation"])] = float(row["value"])
    runs: dict[tuple[str, str], list[list[float]]] = defaultdict(list)
    for (method, stage, _, _), curve in points.items():
        runs[method, stage].append([curve[index] for index in sorted(curve)])
    return runs


def last_evaluation(folder: Path) -> int:
    """The evaluation a run that is never stopped early ends with: its epochs over ``training.eval_every``."""
    benchmark = json.loads((folder / "benchmark.json").read_text())
    training = benchmark.get("spec", {}).get("base", {}).get("training", {})
    epochs = benchmark["protocol"]["epochs"] or training["epochs"]
    return math.ceil(epochs / training.get("eval_every", 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a benchmark report folder (holds validation_curves.csv)")
    parser.add_argument("--after", type=int, default=20, help="the evaluation after which gains are counted")
    parser.add_argument("--metric", default="map_at_r")
    parser.add_argument("-o", "--output", type=Path, help="write the CSV here (default: standard output)")
    args = parser.parse_args(argv)
    last = last_evaluation(args.folder)
    rows = []
    for (method, stage), runs in curves(args.folder, args.metric).items():
        evaluations = [len(curve) - 1 for curve in runs]
        best = [max(range(len(curve)), key=lambda index, c=curve: (c[index], -index)) for curve in runs]
        gains = [100 * (max(curve) - max(curve[: args.after + 1])) for curve in runs]
        rows.append([method, stage, args.metric, len(runs), sum(count < last for count in evaluations),
                     f"{sum(evaluations) / len(runs):.1f}", f"{sum(best) / len(runs):.1f}", args.after,
                     f"{sum(gains) / len(runs):.2f}", f"{max(gains):.2f}"])
    stream = args.output.open("w", newline="") if args.output else sys.stdout
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows(rows)
    if args.output:
        stream.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
