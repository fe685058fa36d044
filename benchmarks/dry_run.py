"""The ``benchmark --dry-run`` estimate against the real wall time of the same benchmark.

Runs ``dmlbench benchmark CONFIG --dry-run`` and then ``dmlbench benchmark CONFIG`` (default: the
built-in benchmark; ``configs/smoke.yaml`` takes seconds) in a fresh temporary directory, each as
its own process like a user's command, and prints the estimate, the measured wall time, their ratio
and the load average before each. The estimate should land within 30 % of the measured time on a
quiet machine; other jobs on the machine slow the two commands differently, so a ratio taken under
load says little.

``--repeat N`` takes N such pairs one after the other and prints each ratio and their median.

``--one-run`` compares, in this process, the estimate of one training run (the first method's fold
0, default parameters) with that run trained for real right after: the part of the estimate that
dominates a long benchmark, in a minute.

    python benchmarks/dry_run.py configs/smoke.yaml
    python benchmarks/dry_run.py configs/smoke.yaml --repeat 5
    python benchmarks/dry_run.py            # the built-in benchmark: minutes
    python benchmarks/dry_run.py --one-run  # one run of the built-in benchmark
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dmlbench.protocol.layout import RESULTS_CSV, RUNS_CSV

REPO = Path(__file__).resolve().parent.parent
ESTIMATE = re.compile(r"^estimate: (\d+) h (\d+) min (\d+) s", re.MULTILINE)


def dmlbench(arguments: list[str]) -> tuple[float, str]:
    """Wall seconds and stdout of ``dmlbench ARGUMENTS`` run as its own process (exit 0 required)."""
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "dmlbench", *arguments], cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"dmlbench {' '.join(arguments)} exited {result.returncode}: {result.stderr.strip()[-2000:]}")
    return seconds, result.stdout


def one_run(config: Path | None) -> None:
    """The estimate of one training run against the run itself, in this process."""
    from dmlbench.protocol.dry_run import cost
    from dmlbench.protocol.design.benchmark import load_spec
    from dmlbench.protocol.design.prepare import prepare
    from dmlbench.training import train

    with tempfile.TemporaryDirectory() as scratch:
        prepared = prepare(load_spec(config), Path(scratch) / "benchmark")
        load_before_estimate = os.getloadavg()[0]
        estimate = cost.run_seconds(prepared, cost.measure(prepared))
        run_config = next(iter(prepared.plans.values())).run_config({}, prepared.layout.folds[0])
        load_before_run = os.getloadavg()[0]
        started = time.perf_counter()
        train(run_config, Path(scratch) / "run", progress=False)
        measured = time.perf_counter() - started
    print(f"config: {config or 'the built-in benchmark'}, one run ({os.cpu_count()} cores): estimate {estimate:.1f} s "
          f"(load average {load_before_estimate:.1f} before it), measured {measured:.1f} s (load average "
          f"{load_before_run:.1f} before it): estimate / measured = {estimate / measured:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", type=Path, help="benchmark YAML (default: the built-in benchmark)")
    parser.add_argument("--one-run", action="store_true", help="compare the estimate of one training run with that run")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="copy the benchmark's results.csv and runs.csv here (e.g. for a byte-identity check)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="estimate and run N times; print each ratio and their median")
    arguments = parser.parse_args()
    config = arguments.config
    if arguments.one_run:
        one_run(config)
        return
    print(f"config: {config or 'the built-in benchmark'} ({os.cpu_count()} cores)")
    ratios = [compare(config, arguments.keep) for _ in range(max(arguments.repeat, 1))]
    if len(ratios) > 1:
        print(f"estimate / measured over {len(ratios)} pairs: {', '.join(f'{ratio:.2f}' for ratio in ratios)}; "
              f"median {statistics.median(ratios):.2f}, {sum(0.7 <= ratio <= 1.3 for ratio in ratios)} within 30 %")


def compare(config: Path | None, keep: Path | None) -> float:
    """One dry run and one real run of the benchmark, each as its own process: prints both and returns
    the estimate / measured ratio."""
    given = [str(config.resolve())] if config else []
    with tempfile.TemporaryDirectory() as scratch:
        output = str(Path(scratch) / "benchmark")
        load_before_estimate = os.getloadavg()[0]
        _, printed = dmlbench(["benchmark", *given, "-o", output, "--dry-run"])
        found = ESTIMATE.search(printed)
        if found is None:
            sys.exit(f"no estimate in the dry run's output:\n{printed}")
        hours, minutes, seconds = map(int, found.groups())
        estimate = 3600 * hours + 60 * minutes + seconds
        load_before_run = os.getloadavg()[0]
        measured, _ = dmlbench(["benchmark", *given, "-o", output, "-q"])
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for name in (RESULTS_CSV, RUNS_CSV):
                shutil.copyfile(Path(output) / name, keep / name)
    print(next(line for line in printed.splitlines() if line.startswith("measured here")))
    print(f"estimate {estimate:.0f} s (load average {load_before_estimate:.1f} before it), "
          f"measured {measured:.1f} s (load average {load_before_run:.1f} before it): "
          f"estimate / measured = {estimate / measured:.2f}", flush=True)
    return estimate / measured


if __name__ == "__main__":
    main()
