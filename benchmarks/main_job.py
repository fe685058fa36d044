"""The main job against its target (issue 62): ``dmlbench benchmark`` (the built-in benchmark, a sequential study
within its default budget, ``protocol.budget``) should end within 15 minutes with at least 3 of its primary
comparisons decided.

Runs the command as a user would (a new process, one worker) in a fresh directory, times it, and reads its
``sequential.csv``: each comparison's last look. Prints the wall time, its ratio to the 15-minute target, the
decisions and the load average before and after (measure on a quiet machine), and with ``--csv`` writes them:

    python benchmarks/main_job.py --csv results/main_job_sequential.csv -o DIR
    python benchmarks/main_job.py --measured DIR --csv results/main_job_sequential_looks.csv

The rows: one per look (seconds from the first unit's start until the look could be judged, and the comparisons
decided by then), and the whole command. Exit 0 when some look met the target (3 decided within 15 minutes).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_SECONDS = 15 * 60
TARGET_DECIDED = 3
DECIDED = ("better", "worse", "equivalent")


def last_looks(directory: Path) -> dict[tuple[str, str], dict[str, str]]:
    """Each comparison's last row of ``sequential.csv``."""
    with (directory / "sequential.csv").open() as stream:
        return {(row["a"], row["b"]): row for row in csv.DictReader(stream)}


def study_clock(directory: Path) -> float:
    """The study's wall time as its rounds recorded it (``protocol.run.rounds``: the union of its commands' spans)."""
    import optuna

    from dmlbench.protocol.design.benchmark_file import read_benchmark
    from dmlbench.protocol.run.rounds import COMMAND_SPANS, union_seconds

    record = read_benchmark(directory)
    marker = optuna.load_study(study_name=record.methods[0], storage=record.storage)
    return union_seconds(list(marker.user_attrs[COMMAND_SPANS].values()))


def look_seconds(directory: Path) -> dict[int, float]:
    """Seconds from the first unit's start to the last reproduction each look needed, per look's searches: when
    the study could judge it (read from the storage's unit records)."""
    import optuna

    from dmlbench.protocol.design.benchmark_file import read_benchmark
    from dmlbench.protocol.layout import BASELINES, SEARCH_REPEAT_MARK, reproduction_study

    storage = read_benchmark(directory).storage
    starts, ends = [], {}
    for summary in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        trials = [t for t in study.get_trials(deepcopy=False) if t.datetime_start is not None]
        starts += [t.datetime_start.timestamp() for t in trials]
        prefix = reproduction_study("")
        name = summary.study_name[len(prefix):] if summary.study_name.startswith(prefix) else None
        if name is not None and name not in BASELINES:
            search = int(name.partition(SEARCH_REPEAT_MARK)[2] or 0)
            done = [t.datetime_complete.timestamp() for t in trials if t.datetime_complete is not None]
            ends[search] = max([ends.get(search, 0.0), *done])
    first = min(starts)
    with (directory / "sequential.csv").open() as stream:
        searches = sorted({int(row["searches"]) for row in csv.DictReader(stream)})
    return {n: max(end for search, end in ends.items() if search < n) - first for n in searches}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", type=Path, help="write the measurement here")
    parser.add_argument("-o", "--output", type=Path, help="keep the benchmark here (default: a temporary directory)")
    parser.add_argument("--measured", type=Path, metavar="DIR", help="read a main job kept with -o instead of running "
                        "one: its time is the study's own clock (the union of its commands' spans)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.measured or args.output or Path(scratch) / "bench"
        load_before = load_after = math.nan
        if args.measured is None:
            load_before = os.getloadavg()[0]
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "dmlbench", "benchmark", "-o", str(directory), "-q"], check=True,
                           cwd=REPO, stdout=subprocess.DEVNULL)
            seconds = time.perf_counter() - started
            load_after = os.getloadavg()[0]
        else:
            seconds = study_clock(directory)
        looks = last_looks(directory)
        at_look = look_seconds(directory)
    decided = [pair for pair, row in looks.items() if row["decision"] in DECIDED]
    searches = max(int(row["searches"]) for row in looks.values())
    print(f"load average before {load_before:.2f}, after {load_after:.2f}")
    for (a, b), row in looks.items():
        print(f"{a} vs {b}: {row['decision']} after {row['searches']} searches (estimate {100 * float(row['estimate']):+.2f} "
              f"points; about {row['searches_to_decide'] or '-'} searches to decide)")
    by_look = {n: sum(row["decision"] in DECIDED and int(row["searches"]) <= n for row in looks.values()) for n in at_look}
    for n, elapsed in at_look.items():
        print(f"look at {n} searches: judged {elapsed / 60:.1f} min after the first unit started, {by_look[n]} decided by then")
    print(f"main job: {seconds / 60:.1f} min (ratio to the 15-minute target: {seconds / TARGET_SECONDS:.2f}), "
          f"{len(decided)} of {len(looks)} primary comparisons decided (target: {TARGET_DECIDED}) after {searches} searches")
    if args.csv is not None:
        with args.csv.open("w", newline="") as stream:
            writer = csv.writer(stream, lineterminator="\n")
            writer.writerow(["row", "searches", "seconds", "target_ratio", "decided", "comparisons", "load_before", "load_after"])
            for n, elapsed in at_look.items():
                writer.writerow(["look", n, f"{elapsed:.1f}", f"{elapsed / TARGET_SECONDS:.3f}", by_look[n], len(looks),
                                 f"{load_before:.2f}", f"{load_after:.2f}"])
            writer.writerow(["command", searches, f"{seconds:.1f}", f"{seconds / TARGET_SECONDS:.3f}", len(decided),
                             len(looks), f"{load_before:.2f}", f"{load_after:.2f}"])
    reached = [n for n, elapsed in at_look.items() if elapsed <= TARGET_SECONDS and by_look[n] >= TARGET_DECIDED]
    return 0 if reached else 1


if __name__ == "__main__":
    sys.exit(main())
