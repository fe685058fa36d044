"""The fair protocol's own cost: a benchmark's wall time against the time its units of work spend
training and scoring.

Runs ``dmlbench benchmark [CONFIG] [OVERRIDES] -o DIR`` (default: the built-in benchmark) in a fresh directory as
a user would (a new process, ``--jobs`` workers), then reads what the benchmark itself recorded:
every unit of work (search trial, reproduction, untrained-baseline score) stores its ``cost``
(``wall_seconds`` from the claim of the unit to its result), and every training run its own
``cost`` in ``run.json``. Everything else is the protocol's bookkeeping: starting Python and
importing the library, preparing the benchmark, opening studies and claiming units in the storage,
heartbeats, writing records, and the report:

    overhead = 1 - sum(unit wall seconds) / (jobs x benchmark wall seconds)

The last line is ``overhead: <x>%``. Measure on a quiet machine (the load average is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def unit_costs(directory: Path) -> list[dict[str, float]]:
    """The ``cost`` of every unit of work the benchmark in ``directory`` stored."""
    from dmlbench.report.data import load_report_data

    data = load_report_data(directory)
    costs = [trial.get("cost") for trials in data.trials.values() for trial in trials]
    costs += [cost for method_costs in data.reproduction_costs.values() for cost in method_costs]
    return [cost for cost in costs if cost]


def run_seconds(directory: Path) -> float:
    """Wall seconds of every training run (``run.json`` ``cost``), validation passes included."""
    return sum(json.loads(path.read_text()).get("cost", {}).get("wall_seconds", 0.0)
               for path in directory.rglob("run.json"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, help="benchmark YAML (default: the built-in benchmark)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("-o", "--output", type=Path, help="keep the benchmark here (default: a temporary directory)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides passed to the benchmark")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.output or Path(scratch) / "bench"
        command = [sys.executable, "-m", "dmlbench", "benchmark", *([str(args.config)] if args.config else []),
                   *args.overrides, "-o", str(directory), "-q", "--jobs", str(args.jobs)]
        load = os.getloadavg()[0]
        started = time.perf_counter()
        subprocess.run(command, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        costs = unit_costs(directory)
        units = sum(cost["wall_seconds"] for cost in costs)
        runs = run_seconds(directory)
    available = args.jobs * wall
    print(f"benchmark: {args.config or 'built-in'}, --jobs {args.jobs}, load average before: {load:.2f}")
    print(f"wall: {wall:.1f} s x {args.jobs} worker(s) = {available:.1f} worker-seconds")
    print(f"units of work: {len(costs)}, {units:.1f} s (training runs {runs:.1f} s; scoring and in-unit records "
          f"{units - runs:.1f} s)")
    print(f"outside the units (start-up, preparation, claims, report): {available - units:.1f} s")
    print(f"overhead: {100 * (1 - units / available):.1f}%")


if __name__ == "__main__":
    main()
