"""``dmlbench benchmark --dry-run``: what a benchmark costs before it runs.

Counts the training runs and epochs the config implies (every method: ``trials`` search trials and
``reproductions`` reproductions, each ``folds`` runs of at most ``epochs`` epochs; early stopping can
only shorten them) and estimates the time from a few measured training steps and one validation pass
of the first method's first fold, on this machine, in this process (one worker).
"""

from __future__ import annotations

import copy
import time
from typing import Any

from dmlbench import config as config_module
from dmlbench.protocol.pipeline import Prepared
from dmlbench.protocol.search_space import apply_assignment
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
    from dmlbench.training.setup import (
        build_components,
        build_sampler,
        class_index,
        load_dataset,
        make_splits,
        training_view,
    )

    setup_started = time.perf_counter()
    method_config = next(iter(prepared.configs.values()))
    fold = prepared.layout.folds[0]
    raw: dict[str, Any] = apply_assignment(copy.deepcopy(method_config.model_dump(mode="json")), {
        "data.train_classes": list(fold.train_classes), "data.val_classes": list(fold.val_classes),
    })
    config = config_module.from_dict(raw)
    torch.set_num_threads(resolve_threads(config.training.num_threads))
    device = resolve_device(config.training.device)
    full = load_dataset(config)
    dataset, splits = training_view(full, make_splits(config, full))
    labels = torch.as_tensor(dataset.labels)
    to_class_index = class_index(labels[splits.train].numpy())
    train_set = dataset.subset(splits.train)
    sampler = build_sampler(config, to_class_index[labels[splits.train]].numpy())
    components = build_components(config, int((to_class_index >= 0).sum()), device)
    if getattr(sampler, "needs_embeddings", False):
        sampler.initialize_memory(embed(components.model, train_set, config.evaluation.batch_size, device)[0])
    steps_per_epoch = len(sampler)
    if config.training.max_steps_per_epoch is not None:
        steps_per_epoch = min(steps_per_epoch, config.training.max_steps_per_epoch)
    sampler.set_epoch(1)
    batches = iter(sampler)
    setup = time.perf_counter() - setup_started
    timings = []
    for _ in range(MEASURED_STEPS + 1):  # the first step warms up allocations; not counted
        batch = next(batches, None)
        if batch is None:
            break
        started = time.perf_counter()
        images, batch_labels, _ = train_set.batch(batch)
        embeddings = components.model(images.to(device))
        targets = to_class_index[batch_labels].to(device)
        miner, loss_fn = components.miner, components.loss
        tuples = miner(embeddings, targets) if miner is not None and loss_fn.uses_tuples else None
        loss = loss_fn(embeddings, targets, tuples)
        components.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        components.optimizer.step()
        timings.append(time.perf_counter() - started)
    step = sum(timings[1:]) / max(len(timings) - 1, 1) if len(timings) > 1 else (timings[0] if timings else 0.0)
    started = time.perf_counter()
    embed(components.model, dataset.subset(splits.validation), config.evaluation.batch_size, device)
    return step, steps_per_epoch, time.perf_counter() - started, setup


def _hours(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600} h {seconds // 60 % 60:02d} min {seconds % 60:02d} s"
