"""One search trial (all folds) with and without the frozen-trunk feature cache, in the same run.

Runs the search of one method of CONFIG (default: configs/smoke.yaml, its first method, with the
overrides ``DEFAULT_OVERRIDES``: 3 epochs of 10 steps, a 32-channel trunk on 32-pixel images) with
``--trials`` trials, once training full models (``protocol.frozen_trunk: false``) and once training
heads on cached trunk features, each in a fresh directory. The per-trial time is each trial's
recorded wall time (its ``cost``); the cache's one-off cost (training one trunk per fold and
extracting its features) is measured separately, since every trial of every method shares it.
The last line is ``speedup: <x>x``, the ratio of the mean per-trial times.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

import optuna
import torch

from dmlbench.protocol.design.benchmark import BenchmarkSpec, load_spec
from dmlbench.protocol.design.prepare import Prepared, prepare
from dmlbench.protocol.run.schedule import run_search_stage
from dmlbench.protocol.units.feature_cache import FeatureCache

REPO = Path(__file__).resolve().parent.parent
# The smoke config's 8-channel trunk on 16-pixel images costs about as much as the loss and miner,
# so no cache could save much there; a 32-channel trunk on 32-pixel images is still small but is,
# like any real backbone, the dominant cost of a training step.
DEFAULT_OVERRIDES = ["training.epochs=3", "training.max_steps_per_epoch=10", "model.options={width: 32}",
                     "data.options={max_classes: 60, image_size: 32, augmentations_per_font: 0}"]


def trial_seconds(prepared: Prepared) -> list[float]:
    result = next(iter(run_search_stage(prepared, progress=False).values()))
    if result.completed != prepared.search.trials:
        raise SystemExit(f"only {result.completed} of {prepared.search.trials} trials completed in {prepared.output_dir}")
    return [float(trial["user_attrs"]["cost"]["wall_seconds"]) for trial in result.trials]


def variant(spec: BenchmarkSpec, trials: int, frozen_trunk: bool) -> BenchmarkSpec:
    """The one-method spec with ``trials`` trials; no protocol epochs, so the overrides' budget applies."""
    protocol = spec.protocol.model_copy(update={"trials": trials, "epochs": None, "frozen_trunk": frozen_trunk})
    return spec.model_copy(update={"protocol": protocol})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("config", nargs="?", type=Path, default=REPO / "configs" / "smoke.yaml")
    parser.add_argument("--trials", type=int, default=2, help="trials per mode (the mean per-trial time is compared)")
    parser.add_argument("overrides", nargs="*", default=DEFAULT_OVERRIDES,
                        help="config overrides for every run (default: " + " ".join(DEFAULT_OVERRIDES) + ")")
    args = parser.parse_args()
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(logging.WARNING)
    full = load_spec(args.config)
    spec = full.model_copy(update={"methods": full.methods[:1]})
    protocol = spec.protocol
    with tempfile.TemporaryDirectory() as scratch:
        uncached_run = prepare(variant(spec, args.trials, False), Path(scratch) / "full", args.overrides)
        cached_run = prepare(variant(spec, args.trials, True), Path(scratch) / "cached", args.overrides)
        plan = next(iter(cached_run.plans.values()))
        epochs = plan.config.training.epochs
        print(f"{args.config.name}, method {spec.methods[0].name}: {protocol.folds} folds, {epochs} epochs per run, "
              f"overrides {' '.join(args.overrides) or 'none'}, {args.trials} trial(s) per mode, {torch.get_num_threads()} thread")
        uncached = trial_seconds(uncached_run)
        started = time.perf_counter()
        cache = FeatureCache(plan.budgeted, cached_run.output_dir, cached_run.dataset_hash)
        for fold in cached_run.layout.folds:
            cache.features(fold)
        one_off = time.perf_counter() - started
        cached = trial_seconds(cached_run)
    full_trial, head_trial = statistics.mean(uncached), statistics.mean(cached)
    print(f"per trial without the cache (full models): {full_trial:.3f} s  (trials: {', '.join(f'{s:.3f}' for s in uncached)})")
    print(f"per trial with the cache (heads on features): {head_trial:.3f} s  (trials: {', '.join(f'{s:.3f}' for s in cached)})")
    print(f"one-off cost of the cache (one trunk per fold + feature extraction): {one_off:.3f} s; "
          f"it pays off after {one_off / max(full_trial - head_trial, 1e-9):.1f} trial(s)")
    print(f"speedup: {full_trial / head_trial:.1f}x")


if __name__ == "__main__":
    main()
