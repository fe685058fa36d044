"""The main job against its target (issue 62): ``dmlbench benchmark`` (the built-in benchmark, a sequential study
within its default budget, ``protocol.budget``) should end within 15 minutes with at least 3 of its primary
comparisons decided.

Runs the command as a user would (a new process, one worker) in a fresh directory, times it, and reads its
``sequential.csv``: each comparison's last look. Prints the wall time, its ratio to the 15-minute target, the
decisions and the load average before and after (measure on a quiet machine), and with ``--csv`` writes them:

    python benchmarks/main_job.py --csv results/main_job_sequential.csv

A ratio above 1 or fewer than 3 decided is a missed target; docs/protocol.md ("Sequential studies") says what
``dmlbench plan`` expects instead and what budget decides three.
"""

from __future__ import annotations

import argparse
import csv
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", type=Path, help="write the measurement here")
    parser.add_argument("-o", "--output", type=Path, help="keep the benchmark here (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.output or Path(scratch) / "bench"
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "dmlbench", "benchmark", "-o", str(directory), "-q"], check=True,
                       cwd=REPO, stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - started
        load_after = os.getloadavg()[0]
        looks = last_looks(directory)
    decided = [pair for pair, row in looks.items() if row["decision"] in DECIDED]
    searches = max(int(row["searches"]) for row in looks.values())
    print(f"load average before {load_before:.2f}, after {load_after:.2f}")
    for (a, b), row in looks.items():
        print(f"{a} vs {b}: {row['decision']} after {row['searches']} searches (estimate {100 * float(row['estimate']):+.2f} "
              f"points; about {row['searches_to_decide'] or '-'} searches to decide)")
    print(f"main job: {seconds / 60:.1f} min (ratio to the 15-minute target: {seconds / TARGET_SECONDS:.2f}), "
          f"{len(decided)} of {len(looks)} primary comparisons decided (target: {TARGET_DECIDED}) after {searches} searches")
    if args.csv is not None:
        with args.csv.open("w", newline="") as stream:
            writer = csv.writer(stream, lineterminator="\n")
            writer.writerow(["wall_seconds", "target_ratio", "decided", "comparisons", "searches", "load_before", "load_after"])
            writer.writerow([f"{seconds:.1f}", f"{seconds / TARGET_SECONDS:.3f}", len(decided), len(looks), searches,
                             f"{load_before:.2f}", f"{load_after:.2f}"])
    return 0 if seconds <= TARGET_SECONDS and len(decided) >= TARGET_DECIDED else 1


if __name__ == "__main__":
    sys.exit(main())
