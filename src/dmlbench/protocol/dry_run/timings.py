"""Pieces of a run timed in this process for the dry run (``protocol.dry_run.cost``): a warm training step, a
validation pass, the scoring of a made-up test split, a checkpoint's write, a fold run's opening."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from dmlbench.protocol.dry_run.rehearsal import SplitSize, made_up_test_split

WARMUP_STEPS = 3  # discarded: the first steps allocate memory and build the kernels
TIMED_STEPS = 10


def training_identity(config: Any) -> str:
    """What sets a step's cost, less the seed (methods often differ only by their seeds)."""
    dumped = config.model_dump(mode="json")
    return repr([dumped.get(key) for key in ("loss", "miner", "sampler", "optimizer", "model", "training")])


def step_seconds(config: Any, setup: Any, device: Any) -> tuple[float, int, float]:
    """The median seconds of a training step after the warm-up, the steps of an epoch, and what the
    first step took more than the median."""
    from dmlbench.training.loop import ImageBatches, time_steps

    steps_per_epoch = len(setup.sampler)
    if config.training.max_steps_per_epoch is not None:
        steps_per_epoch = min(steps_per_epoch, config.training.max_steps_per_epoch)
    timings = time_steps(config, ImageBatches(config, setup), device, WARMUP_STEPS + TIMED_STEPS)
    timed = timings[WARMUP_STEPS:] or timings
    median = statistics.median(timed) if timed else 0.0
    return median, steps_per_epoch, max(timings[0] - median, 0.0) if timings else 0.0


def validation_seconds(config: Any, setup: Any, device: Any) -> tuple[float, float, int, float]:
    """Seconds of a warm validation pass (embedding and scoring), seconds to embed one image, the
    embedding's width, and what the first pass (its embedding at the evaluation's batch shapes, its
    scoring's first calls) took more."""
    from dmlbench.evaluation import evaluate
    from dmlbench.training.embed import embed

    model, validation_set, batch_size = setup.components.model, setup.validation_set, config.evaluation.batch_size
    passes = []
    for _ in range(2):  # the first is a warm-up
        started = time.perf_counter()
        embeddings, labels = embed(model, validation_set, batch_size, device)
        embedded = time.perf_counter()
        evaluate(embeddings, labels, metrics=config.evaluation.metrics, seed=config.seed,
                 rerank=config.evaluation.rerank.method(), device=device)
        passes.append((time.perf_counter() - started, embedded - started))
    (first, _), (warm, embedding) = passes
    return warm, embedding / max(len(validation_set), 1), int(embeddings.shape[1]), max(first - warm, 0.0)


def scoring_seconds(config: Any, test: SplitSize, folds: int, device: Any) -> tuple[float, float]:
    """Seconds to score the test split (in every setting a mode is scored in: all-versus-all,
    cross-domain, re-ranked) and to sum a reproduction's per-class scores of its ``folds`` fold models
    (``class_bootstrap.class_sums``), the neighbours searched on ``device`` as the runs search them;
    timed on random unit vectors (the test data itself is opened only by the reproductions)."""
    from dmlbench.analysis.class_bootstrap import class_sums
    from dmlbench.evaluation import evaluate

    if test.images == 0:
        return 0.0, 0.0
    embeddings, labels, domains = made_up_test_split(test, config.seed, folds)
    first = embeddings["fold 0"]
    started = time.perf_counter()
    evaluate(first, labels, metrics=config.evaluation.metrics, seed=config.seed, device=device)
    if domains is not None:  # each mode is scored cross-domain too
        evaluate(first, labels, metrics=config.evaluation.metrics, seed=config.seed, domains=domains, device=device)
    if config.evaluation.rerank.kind != "none":  # and re-ranked
        evaluate(first, labels, metrics=config.evaluation.metrics, seed=config.seed, rerank=config.evaluation.rerank.method())
    scored = time.perf_counter()
    class_sums(embeddings, labels, config.evaluation.metrics, None, domains)
    return scored - started, time.perf_counter() - scored


def fold_run_seconds(run_dir: Path) -> float:
    """Seconds a reproduction spends on a fold run besides its test embedding: opening it (record,
    config, dataset, best checkpoint) and its embedding-space analysis on its training classes."""
    from dmlbench.protocol.units.reproductions import training_space
    from dmlbench.training.runs import Run

    started = time.perf_counter()
    training_space(Run.open(run_dir))
    return time.perf_counter() - started


def checkpoint_seconds(setup: Any, directory: Path) -> float:
    """Seconds to write one checkpoint of the run's model, loss and optimiser (every epoch writes one)."""
    from dmlbench import files

    components = setup.components
    payload = {"model": components.model.state_dict(), "loss": components.loss.state_dict(),
               "optimizer": components.optimizer.state_dict()}
    started = time.perf_counter()
    files.atomic_torch_save(directory / "checkpoint.pt", payload)
    return time.perf_counter() - started
