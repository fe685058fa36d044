"""``protocol.fold_units: true`` against trials that train their folds themselves, with ``--jobs 2``.

Runs one method of ``--config`` (default: the first of configs/smoke.yaml) as a one-method benchmark with
``--folds`` folds (default 4), ``--jobs 2`` both ways in turn, each in a fresh directory; checks that
the two ``results.csv`` and ``runs.csv`` are byte-identical (the setting changes who runs a fold, never
its result) and prints the wall times, the ratio fold_units / sequential and the machine's load
average before each run. With one method a trial holds one worker for its folds, so the second worker
idles through the search unless each fold is a unit; other jobs on the machine distort both sides
(compare only within one run, on a quiet machine). Extra arguments are overrides for both runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
SIDES = {"sequential": "false", "fold_units": "true"}


def one_method(config: Path, method: str | None) -> dict[str, Any]:
    """The benchmark ``config`` with only ``method`` (default: its first) and no declared comparisons, its
    plugin files named by absolute paths."""
    spec = yaml.safe_load(config.read_text())
    chosen = [entry for entry in spec["methods"] if method in (None, entry["name"])][:1]
    if not chosen:
        raise SystemExit(f"{config} has no method {method!r}")
    plugins = [str((config.parent / name).resolve()) if name.endswith(".py") else name for name in spec.get("plugins", [])]
    # The comparisons it declares name the other methods: one method is compared with nothing; a search SD given
    # per method keeps this method's.
    analysis = {key: value for key, value in (spec.get("analysis") or {}).items() if key not in ("references", "pairs")}
    for key in ("search_sd", "planning_search_sd"):
        if isinstance(analysis.get(key), dict):
            analysis[key] = {name: sd for name, sd in analysis[key].items() if name in {entry["name"] for entry in chosen}}
    return {**spec, "methods": chosen, "analysis": analysis, **({"plugins": plugins} if plugins else {})}


def timed(config: Path, fold_units: str, folds: int, overrides: list[str], directory: Path) -> float:
    command = [sys.executable, "-m", "dmlbench", "benchmark", str(config), f"protocol.folds={folds}",
               f"protocol.fold_units={fold_units}", *overrides, "-o", str(directory), "-q", "--jobs", "2"]
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "smoke.yaml")
    parser.add_argument("--method", help="the method to run (default: the config's first)")
    parser.add_argument("--folds", type=int, default=4)
    parser.add_argument("overrides", nargs="*", help="overrides for both runs, e.g. protocol.trials=4")
    args = parser.parse_args()
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "one_method.yaml"
        config.write_text(yaml.safe_dump(one_method(args.config, args.method)))
        for side, fold_units in SIDES.items():
            load = os.getloadavg()[0]
            seconds[side] = timed(config, fold_units, args.folds, args.overrides, Path(scratch) / side)
            print(f"{side}: {seconds[side]:.1f} s (load average before: {load:.2f})", flush=True)
        for name in ("results.csv", "runs.csv"):
            if (Path(scratch) / "sequential" / name).read_bytes() != (Path(scratch) / "fold_units" / name).read_bytes():
                raise SystemExit(f"{name} differs between the two runs: fold units changed a result")
    print("results.csv and runs.csv: identical")
    print(f"wall-time ratio fold_units / sequential: {seconds['fold_units'] / seconds['sequential']:.2f}")


if __name__ == "__main__":
    main()
