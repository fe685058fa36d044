"""``--jobs 2`` with one torch thread each against one worker with two threads, on the same benchmark.

Runs ``dmlbench benchmark CONFIG`` (default: configs/smoke.yaml) both ways in turn, ``--rounds``
times, each in a fresh directory, and prints the wall times, the ratio and the load average of the
machine before each run (other jobs on the machine distort both; compare only within one run).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def timed(config: Path, jobs: int, threads: int, directory: Path) -> float:
    command = [sys.executable, "-m", "dmlbench", "benchmark", str(config), f"training.num_threads={threads}",
               "-o", str(directory), "-q", "--jobs", str(jobs)]
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("config", nargs="?", type=Path, default=REPO / "configs" / "smoke.yaml")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"jobs 2 x 1 thread": [], "jobs 1 x 2 threads": []}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for label, (jobs, threads) in (("jobs 2 x 1 thread", (2, 1)), ("jobs 1 x 2 threads", (1, 2))):
                load = os.getloadavg()[0]
                seconds = timed(args.config, jobs, threads, Path(scratch) / f"{label}-{round_}".replace(" ", "_"))
                times[label].append(seconds)
                print(f"round {round_}: {label}: {seconds:.1f} s (load average before: {load:.2f})", flush=True)
    best = {label: min(values) for label, values in times.items()}
    for label, seconds in best.items():
        print(f"{label}: best {seconds:.1f} s")
    print(f"ratio (1 x 2 threads) / (2 x 1 thread): {best['jobs 1 x 2 threads'] / best['jobs 2 x 1 thread']:.2f}")


if __name__ == "__main__":
    main()
