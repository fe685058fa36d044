"""Training speed with and without ``torch.compile`` (``training.compile``), measured in the same run.

Each round trains the same config twice for two short epochs, eager and compiled; the first epoch
includes the compilation, so the step time is taken from the second. Reported: the median seconds per
step of each mode, the ratio compiled / eager, and the compiled run's one-off first-epoch overhead.

    python benchmarks/compile.py                                  # default config, CPU, 2 rounds of 20 steps
    python benchmarks/compile.py --rounds 3 --steps 50 model.trunk=resnet50 model.options={} \\
        data.options={image_size: 64} training.batch_size=64 training.device=cuda
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


def two_epochs(compiled: bool, steps: int, overrides: list[str], directory: Path) -> tuple[float, float]:
    """Seconds per step of the second epoch, and the first epoch's extra seconds over the second."""
    config = config_module.load(
        REPO / "configs" / "glyphs.yaml",
        [*overrides, "training.epochs=2", f"training.max_steps_per_epoch={steps}", f"training.compile={compiled}"],
    )
    run_dir = directory / f"compile-{compiled}-{time.monotonic_ns()}"
    train(config, run_dir, progress=False)
    first, second = records.read_metrics(run_dir)[1:3]
    return second["seconds"] / second["steps"], first["seconds"] - second["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. model.trunk=resnet50")
    arguments = parser.parse_args()
    step_times: dict[bool, list[float]] = {False: [], True: []}
    overhead: list[float] = []
    with tempfile.TemporaryDirectory() as directory:
        for _ in range(arguments.rounds):
            for compiled in (False, True):
                step, extra = two_epochs(compiled, arguments.steps, arguments.overrides, Path(directory))
                step_times[compiled].append(step)
                if compiled:
                    overhead.append(extra)
    eager, compiled = statistics.median(step_times[False]), statistics.median(step_times[True])
    print(f"eager: {eager:.4f} s per step; compiled: {compiled:.4f} s per step "
          f"(first compiled epoch {statistics.median(overhead):.1f} s longer: compilation)")
    print(f"step time, compiled / eager: {compiled / eager:.2f}")


if __name__ == "__main__":
    main()
