"""``dmlbench benchmark --dry-run``: what a benchmark costs before it runs.

Counts the training runs and epochs the config implies (every method: ``trials`` search trials and
``reproductions`` reproductions, each ``folds`` runs of at most ``epochs`` epochs; early stopping can
only shorten them) and estimates the time from a few measured training steps and one validation pass
of the first method's first fold, on this machine, in this process (one worker).
"""

from __future__ import annotations

import time

from dmlbench.protocol.pipeline import Prepared
from dmlbench.training.threads import resolve_threads

MEASURED_STEPS = 3


def dry_run(prepared: Prepared) -> str:
    """The lines ``--dry-run`` prints."""
    protocol = prepared.spec.protocol
    methods = len(prepared.configs)
    runs = methods * (protocol.trials + protocol.reproductions) * protocol.folds
    config = next(iter(prepared.configs.values()))
    epochs = config.training.epochs
    step_seconds, steps_per_epoch, validation_seconds, setup_seconds = measure(prepared)
    evaluations = epochs // config.training.eval_every + (epochs % config.training.eval_every != 0) + 1
    per_run = setup_seconds + epochs * steps_per_epoch * step_seconds + evaluations * validation_seconds
    total = runs * per_run
    return "\n".join([
        f"{methods} methods x ({protocol.trials} search trials + {protocol.reproductions} reproductions) x "
        f"{protocol.folds} folds = {runs} training runs",
        f"at most {epochs} epochs each = {runs * epochs} epochs of {steps_per_epoch} steps "
        f"({runs * epochs * steps_per_epoch * config.training.batch_size:,} training samples)",
        f"measured here: {setup_seconds:.2f} s to set up a run, {step_seconds:.3f} s per training step, "
        f"{validation_seconds:.2f} s per validation pass "
        f"({MEASURED_STEPS} steps of method {next(iter(prepared.configs))!r}, fold 0)",
        f"estimate: {_hours(total)} for one worker at this speed (early stopping can only shorten it; "
        f"the test embeddings of the reproductions are not included); with N workers about 1/N of it",
        "this is an estimate: nothing was trained or stored",
    ])


def measure(prepared: Prepared) -> tuple[float, int, float, float]:
    """Seconds per training step, steps per epoch, seconds per validation pass and seconds to set up
    a run (data, model, sampler; first method, fold 0)."""
    import torch

    from dmlbench.training.embed import embed, resolve_device
    from dmlbench.training.setup import set_up_training
    from dmlbench.training.step import batch_loss

    setup_started = time.perf_counter()
    config = next(iter(prepared.plans.values())).run_config({}, prepared.layout.folds[0])
    torch.set_num_threads(resolve_threads(config.training.num_threads))
    device = resolve_device(config.training.device)
    setup = set_up_training(config, device)
    sampler, components, train_set = setup.sampler, setup.components, setup.train_set
    if getattr(sampler, "needs_embeddings", False):
        sampler.initialize_memory(embed(components.model, train_set, config.evaluation.batch_size, device)[0])
    steps_per_epoch = len(sampler)
    if config.training.max_steps_per_epoch is not None:
        steps_per_epoch = min(steps_per_epoch, config.training.max_steps_per_epoch)
    sampler.set_epoch(1)
    batches = iter(sampler)
    setup_seconds = time.perf_counter() - setup_started
    timings = []
    for _ in range(MEASURED_STEPS + 1):  # the first step warms up allocations; not counted
        batch = next(batches, None)
        if batch is None:
            break
        started = time.perf_counter()
        images, batch_labels, _ = train_set.batch(batch)
        embeddings = components.model(images.to(device))
        targets = setup.to_class_index[batch_labels].to(device)
        loss = batch_loss(components.loss, components.miner, embeddings, targets, epoch=1, step=len(timings) + 1)
        components.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        components.optimizer.step()
        timings.append(time.perf_counter() - started)
    step = sum(timings[1:]) / max(len(timings) - 1, 1) if len(timings) > 1 else (timings[0] if timings else 0.0)
    started = time.perf_counter()
    embed(components.model, setup.validation_set, config.evaluation.batch_size, device)
    return step, steps_per_epoch, time.perf_counter() - started, setup_seconds


def _hours(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600} h {seconds // 60 % 60:02d} min {seconds % 60:02d} s"
