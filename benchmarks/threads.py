"""Training speed with 1 and 2 torch threads, measured in the same run (it sets ``training.num_threads``).

Each round trains the default config (``configs/glyphs.yaml``: small CNN, SPC-4 batches of 112,
triplet + semihard) for one short epoch with each thread count in turn, so that both see the same
machine load; reported are the median seconds per training step and per validation pass.

    python benchmarks/threads.py                    # 3 rounds of 20 steps
    python benchmarks/threads.py --rounds 5 --steps 40

The same steps beside a competing process (OpenMP's spinning against passive waits, the reason the
command line sets ``OMP_WAIT_POLICY=PASSIVE``) are ``benchmarks/oversubscription.py``'s.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from dmlbench import config as config_module
from dmlbench.training import records, train

REPO = Path(__file__).resolve().parent.parent


def one_epoch(threads: int, steps: int, directory: Path) -> tuple[float, float]:
    """Seconds per training step and seconds of everything else (validation, setup) of one short run."""
    config = config_module.load(
        REPO / "configs" / "glyphs.yaml",
        ["training.epochs=1", f"training.max_steps_per_epoch={steps}", f"training.num_threads={threads}"],
    )
    run_dir = directory / f"threads-{threads}-{time.monotonic_ns()}"
    started = time.perf_counter()
    train(config, run_dir, progress=False)
    total = time.perf_counter() - started
    epoch = records.read_metrics(run_dir)[-1]
    return epoch["seconds"] / epoch["steps"], total - epoch["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    arguments = parser.parse_args()
    step_times: dict[int, list[float]] = {1: [], 2: []}
    other_times: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as directory:
        one_epoch(1, 2, Path(directory))  # generate and cache the dataset before timing anything
        for _ in range(arguments.rounds):
            for threads in (1, 2):
                step, other = one_epoch(threads, arguments.steps, Path(directory))
                step_times[threads].append(step)
                other_times[threads].append(other)
    for threads in (1, 2):
        print(f"{threads} thread(s): {statistics.median(step_times[threads]):.3f} s per step, "
              f"{statistics.median(other_times[threads]):.1f} s validation and setup")
    ratio = statistics.median(step_times[2]) / statistics.median(step_times[1])
    print(f"step time, 2 threads / 1 thread: {ratio:.2f}")


if __name__ == "__main__":
    main()
