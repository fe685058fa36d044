"""What going through SLURM costs: ``dmlbench benchmark CONFIG --jobs 2`` here against the same command with
``--slurm --wait`` (two array tasks), on the same machine, in turn, ``--rounds`` times.

Uses the cluster ``SLURM_CONF`` names, or else starts the tests' one-node cluster (``tests/slurm_cluster.py``:
root and Debian's ``slurmctld slurmd slurm-client munge``). Prints each wall time (the SLURM one from the
command's start to its summary: submission, scheduling, each task's interpreter and imports, the polling
of ``--wait``), the load average before it, the ratio of the best times, and whether ``results.csv`` and
``runs.csv`` are identical (they must be). Other work on the machine distorts both; compare within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMPARED = ("results.csv", "runs.csv")


@contextlib.contextmanager
def cluster(scratch: Path) -> Iterator[dict[str, str]]:
    if os.environ.get("SLURM_CONF"):
        yield {}
        return
    sys.path.insert(0, str(REPO / "tests"))
    import slurm_cluster

    reason = slurm_cluster.missing_reason()
    if reason is not None:
        sys.exit(f"no SLURM cluster: set SLURM_CONF, or {reason}")
    with slurm_cluster.running_cluster(scratch / "cluster") as environment:
        yield environment


def timed(command: list[str], environment: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=REPO, env={**os.environ, **environment},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("config", nargs="?", type=Path, default=REPO / "configs" / "smoke.yaml")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"local --jobs 2": [], "--slurm --jobs 2 --wait": []}
    with tempfile.TemporaryDirectory() as name, cluster(Path(name)) as environment:
        scratch = Path(name)
        for round_ in range(args.rounds):
            for label, extra in (("local --jobs 2", []), ("--slurm --jobs 2 --wait", ["--slurm", "--wait"])):
                output = scratch / f"{round_}-{'slurm' if extra else 'local'}"
                command = [sys.executable, "-m", "dmlbench", "benchmark", str(args.config), "-o", str(output), "-q",
                           "--jobs", "2", *extra]
                load = os.getloadavg()[0]
                times[label].append(timed(command, environment))
                print(f"round {round_}: {label}: {times[label][-1]:.1f} s (load average before: {load:.2f})", flush=True)
            same = all((scratch / f"{round_}-local" / file).read_bytes() == (scratch / f"{round_}-slurm" / file).read_bytes()
                       for file in COMPARED)
            print(f"round {round_}: {' and '.join(COMPARED)} identical: {same}", flush=True)
    best = {label: min(values) for label, values in times.items()}
    for label, seconds in best.items():
        print(f"{label}: best {seconds:.1f} s")
    print(f"ratio (--slurm) / (local): {best['--slurm --jobs 2 --wait'] / best['local --jobs 2']:.2f}")


if __name__ == "__main__":
    main()
