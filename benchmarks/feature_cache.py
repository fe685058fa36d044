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
from dataclasses import replace
from pathlib import Path

import optuna
import torch

from dmlbench import config as config_module
from dmlbench.protocol.benchmark import BenchmarkSpec, load_spec
from dmlbench.protocol.feature_cache import FeatureCache
from dmlbench.protocol.folds import fold_layout
from dmlbench.protocol.search import SearchSettings, apply_budget, method_raw_config, search_methods
from dmlbench.training.setup import load_dataset

REPO = Path(__file__).resolve().parent.parent
# The smoke config's 8-channel trunk on 16-pixel images costs about as much as the loss and miner,
# so no cache could save much there; a 32-channel trunk on 32-pixel images is still small but is,
# like any real backbone, the dominant cost of a training step.
DEFAULT_OVERRIDES = ["training.epochs=3", "training.max_steps_per_epoch=10", "model.options={width: 32}",
                     "data.options={max_classes: 60, image_size: 32, augmentations_per_font: 0}"]


def trial_seconds(spec: BenchmarkSpec, directory: Path, settings: SearchSettings, overrides: list[str]) -> list[float]:
    result = next(iter(search_methods(spec, directory, settings, overrides).values()))
    if result.completed != settings.trials:
        raise SystemExit(f"only {result.completed} of {settings.trials} trials completed in {directory}")
    return [float(trial["user_attrs"]["cost"]["wall_seconds"]) for trial in result.trials]


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
    raw = method_raw_config(spec, spec.methods[0].name, args.overrides)
    epochs = config_module.from_dict(dict(raw)).training.epochs  # the overrides' budget, not the smoke protocol's
    settings = SearchSettings(trials=args.trials, folds=protocol.folds, fold_mode=protocol.fold_mode, epochs=None,
                              patience=protocol.patience, sampler=protocol.sampler, seed=protocol.search_seed)
    print(f"{args.config.name}, method {spec.methods[0].name}: {protocol.folds} folds, {epochs} epochs per run, "
          f"overrides {' '.join(args.overrides) or 'none'}, {args.trials} trial(s) per mode, {torch.get_num_threads()} thread")
    with tempfile.TemporaryDirectory() as scratch:
        uncached = trial_seconds(spec, Path(scratch) / "full", settings, args.overrides)
        cached_dir = Path(scratch) / "cached"
        started = time.perf_counter()
        trunk_raw = apply_budget(raw, settings.epochs, settings.patience)
        dataset = load_dataset(config_module.from_dict(dict(trunk_raw)))
        cache = FeatureCache(trunk_raw, cached_dir, dataset.content_hash)
        for fold in fold_layout(dataset, k=settings.folds, mode=settings.fold_mode).folds:
            cache.features(fold)
        one_off = time.perf_counter() - started
        cached = trial_seconds(spec, cached_dir, replace(settings, frozen_trunk=True), args.overrides)
    full_trial, head_trial = statistics.mean(uncached), statistics.mean(cached)
    print(f"per trial without the cache (full models): {full_trial:.3f} s  (trials: {', '.join(f'{s:.3f}' for s in uncached)})")
    print(f"per trial with the cache (heads on features): {head_trial:.3f} s  (trials: {', '.join(f'{s:.3f}' for s in cached)})")
    print(f"one-off cost of the cache (one trunk per fold + feature extraction): {one_off:.3f} s; "
          f"it pays off after {one_off / max(full_trial - head_trial, 1e-9):.1f} trial(s)")
    print(f"speedup: {full_trial / head_trial:.1f}x")


if __name__ == "__main__":
    main()
