"""Opening a finished run once (``training.runs.Run.open``) against opening it for every use.

BENCHMARK_DIR is a finished benchmark (``dmlbench benchmark configs/smoke.yaml -o DIR``). Two
measurements, each before and after in the same process or on the same run:

1. A reproduction's reads of its fold runs, in this process: the calls ``protocol.reproductions``
   makes for one reproduction (the training split of every fold run for the embedding-space
   analysis, the test domains, the test split of every fold run, the query mask), once with run
   directories (every call opens its run again: config, dataset and its hash, splits, as the code
   did before ``Run``) and once with each fold run opened once and passed on. Printed: the opens
   of each, the seconds per open, the median seconds of each and their ratio.
2. ``dmlbench evaluate RUN --analysis --per-query --verification --open-set`` on a copy of one fold
   run (so no stored result short-cuts it), with the code of ``--before-src`` (default: the
   snapshot at /work/snap/src) and of ``--after-src`` (default: this tree's), alternated: the
   dataset loads each made and the median wall time of each, and their ratio. Most of that time is
   importing torch and friends, so compare the two on a quiet machine, from static copies of src.

The last line is ``reproduction reads: <x>x, evaluate command: <y>x`` (before over after).
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
from collections.abc import Callable
from pathlib import Path

import torch

from dmlbench.training import runs
from dmlbench.training.records import read_run_record
from dmlbench.training.runs import Run, embed_run, embed_test_split, load_run_config, run_test_domains, test_query_mask

REPO = Path(__file__).resolve().parent.parent

# Runs the command-line interface with every ``load_dataset`` of the imported code counted; the
# count goes to stderr at exit. The same wrapper runs the old code and the new.
COUNTING_MAIN = """
import atexit, sys, time
import dmlbench.training.setup as setup
original, loads = setup.load_dataset, [0, 0.0]
def counted(config):
    started = time.perf_counter()
    try:
        return original(config)
    finally:
        loads[0] += 1
        loads[1] += time.perf_counter() - started
for module in list(sys.modules.values()):
    if getattr(module, "__name__", "").startswith("dmlbench") and getattr(module, "load_dataset", None) is original:
        module.load_dataset = counted
atexit.register(lambda: print(f"dataset loads: {loads[0]} ({loads[1]:.3f} s)", file=sys.stderr))
sys.argv = ["dmlbench", *sys.argv[1:]]
from dmlbench.cli import main
main()
"""


def reproduction_reads(run_dirs: list[Path], open_once: bool) -> None:
    """What ``protocol.reproductions`` reads of one reproduction's fold runs."""
    targets: list[Path] | list[Run] = [Run.open(run_dir) for run_dir in run_dirs] if open_once else run_dirs
    for target in targets:
        embed_run(target, "train")
    run_test_domains(targets[0])
    if not open_once:
        load_run_config(run_dirs[0], read_run_record(run_dirs[0]))  # the old code read the first run's config once more for its re-ranking
    for target in targets:
        embed_test_split(target)
    test_query_mask(targets[0])


def counted_opens(action: Callable[[], None]) -> tuple[int, float]:
    """How many runs ``action`` opened and the seconds their opening took: ``Run.open``, the dataset
    loads with their hash checks and the splits."""
    original_open, original_dataset, original_splits = Run.__dict__["open"], runs.trained_dataset, runs.make_splits
    calls, seconds = [0], [0.0]

    def timed(function: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                seconds[0] += time.perf_counter() - started
        return wrapper

    def opening(cls: type[Run], run_dir: Path) -> Run:
        calls[0] += 1
        return timed(original_open.__func__)(cls, run_dir)

    Run.open = classmethod(opening)
    runs.trained_dataset, runs.make_splits = timed(original_dataset), timed(original_splits)
    try:
        action()
    finally:
        Run.open, runs.trained_dataset, runs.make_splits = original_open, original_dataset, original_splits
    return calls[0], seconds[0]


def evaluate_seconds(python_path: Path, run_dir: Path, scratch: Path) -> tuple[float, str]:
    """Wall seconds of one ``dmlbench evaluate`` of a fresh copy of ``run_dir``, and its dataset loads."""
    copy = scratch / "run"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(run_dir, copy)
    command = [sys.executable, "-c", COUNTING_MAIN, "evaluate", str(copy), "--analysis", "--per-query",
               str(scratch / "per_query.csv"), "--verification", "--open-set", "--json", str(scratch / "out.json")]
    environment = {**os.environ, "PYTHONPATH": str(python_path)}
    started = time.perf_counter()
    done = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"evaluate failed with {python_path}:\n{done.stderr}")
    loads = re.search(r"dataset loads: .*", done.stderr)
    return seconds, loads.group(0) if loads else "dataset loads: ?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("benchmark_dir", type=Path)
    parser.add_argument("--before-src", type=Path, default=Path("/work/snap/src"),
                        help="the src folder of the code to compare against (default: /work/snap/src)")
    parser.add_argument("--after-src", type=Path, default=REPO / "src",
                        help="the src folder of the new code (default: this tree's; a copy keeps others' edits out)")
    parser.add_argument("--repeats", type=int, default=3, help="alternated repeats of each measurement (medians)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    reproduction = sorted(args.benchmark_dir.glob("*/reproduction_00"))[0]
    run_dirs = sorted(path.parent for path in reproduction.glob("fold_*/config.yaml"))
    print(f"reproduction {reproduction} ({len(run_dirs)} fold runs)")

    timings: dict[bool, list[float]] = {False: [], True: []}
    for repeat in range(args.repeats):
        for open_once in (False, True):
            started = time.perf_counter()
            opens, open_seconds = counted_opens(lambda: reproduction_reads(run_dirs, open_once))
            timings[open_once].append(time.perf_counter() - started)
            if repeat == 0:
                print(f"  {'after ' if open_once else 'before'}: {opens} opens, {open_seconds / opens:.3f} s per open "
                      f"(config, dataset and its hash, splits), {open_seconds:.3f} s opening in all")
    reads = {key: statistics.median(values) for key, values in timings.items()}
    print(f"  median seconds: before {reads[False]:.3f}, after {reads[True]:.3f}")

    run_dir = run_dirs[0]
    seconds: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            for label, source in (("before", args.before_src), ("after", args.after_src)):
                elapsed, loads = evaluate_seconds(source.resolve(), run_dir, Path(scratch))
                seconds[label].append(elapsed)
                if repeat == 0:
                    print(f"evaluate {label}: {loads}")
    wall = {label: statistics.median(values) for label, values in seconds.items()}
    print(f"evaluate median wall seconds: before {wall['before']:.2f}, after {wall['after']:.2f}")
    print(f"reproduction reads: {reads[False] / reads[True]:.2f}x, evaluate command: {wall['before'] / wall['after']:.2f}x")


if __name__ == "__main__":
    main()
