"""The training loop: mini-batches from a batch sampler, optional mining, validation-only model
selection, checkpoints every epoch and exact resumption."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Sampler
from tqdm import tqdm

from dmlbench import evaluation
from dmlbench.config import Config, to_yaml
from dmlbench.data.base import ImageDataset
from dmlbench.errors import RunInterrupted, UserInputError
from dmlbench.training import records
from dmlbench.training.embed import embed, resolve_device
from dmlbench.training.setup import (
    Components,
    build_components,
    build_sampler,
    class_index,
    load_dataset,
    make_splits,
    training_view,
)


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the run is marked failed."""


@dataclass
class TrainResult:
    run_dir: Path
    best_epoch: int | None
    best_validation: dict[str, float] | None
    epochs_run: int
    already_complete: bool = False


def train(
    config: Config,
    run_dir: Path,
    *,
    resume: bool = False,
    progress: bool = True,
    record: Mapping[str, Any] | None = None,
) -> TrainResult:
    """Train one model on the training classes of ``config.data``; select on validation only.

    The loop holds only ``training_view`` of the dataset (train and validation items, no test
    item). ``record``: extra JSON fields for ``run.json`` (the protocol's method, stage, trial, fold).
    """
    run_dir = Path(run_dir)
    clock = records.Clock()
    _check_run_dir(run_dir, resume)
    if resume:
        stored = records.read_json(run_dir / records.RUN_FILE)
        if stored.get("status") == "completed":
            # Nothing to train: the run directory stays exactly as it is.
            return TrainResult(
                run_dir, stored.get("best_epoch"), stored.get("best_validation"), stored.get("epochs_run", 0),
                already_complete=True,
            )
    device = resolve_device(config.training.device)
    torch.set_num_threads(config.training.num_threads)
    full_dataset = load_dataset(config)
    dataset_hash = full_dataset.content_hash
    full_splits = make_splits(config, full_dataset)
    dataset, splits = training_view(full_dataset, full_splits)
    del full_dataset
    labels = torch.as_tensor(dataset.labels)
    to_class_index = class_index(labels[splits.train].numpy())
    num_classes = int((to_class_index >= 0).sum())
    train_set = dataset.subset(splits.train)
    validation_set = dataset.subset(splits.validation)
    train_targets = to_class_index[labels[splits.train]]
    sampler = build_sampler(config, train_targets.numpy())
    components = build_components(config, num_classes, device)

    start_epoch, state = 0, _SelectionState()
    if resume and (run_dir / records.LAST_CHECKPOINT).exists():
        start_epoch, state = _load_checkpoint(run_dir / records.LAST_CHECKPOINT, components, sampler)
        records.truncate_metrics(run_dir, start_epoch)
    else:
        records.create_run_dir(run_dir)
        records.atomic_write_text(run_dir / records.CONFIG_FILE, to_yaml(config))
        (run_dir / records.METRICS_FILE).unlink(missing_ok=True)
    run_record = _start_record(run_dir, config, dataset_hash, full_splits, resume)
    run_record["train_classes"] = sorted(int(c) for c in labels[splits.train].unique())
    run_record["val_classes"] = sorted(int(c) for c in labels[splits.validation].unique())
    run_record.update(record or {})
    records.write_json(run_dir / records.RUN_FILE, run_record)

    model = components.model
    epoch = start_epoch
    try:
        if start_epoch == 0:
            # The untrained model's validation scores: the baseline every epoch is compared with.
            records.append_metrics(run_dir, {"epoch": 0, "validation": _validate(model, validation_set, config, device)})
        if getattr(sampler, "needs_embeddings", False) and sampler.memory is None:
            sampler.initialize_memory(embed(model, train_set, config.evaluation.batch_size, device)[0])
        for epoch in range(start_epoch + 1, config.training.epochs + 1):
            record = _train_epoch(epoch, config, components, sampler, train_set, to_class_index, device, progress)
            if epoch % config.training.eval_every == 0 or epoch == config.training.epochs:
                validation = _validate(model, validation_set, config, device)
                record["validation"] = validation
                state.observe(epoch, validation, config.evaluation.selection_metric)
                if state.best_epoch == epoch:
                    _save_checkpoint(run_dir / records.BEST_CHECKPOINT, epoch, components, state, sampler)
            records.append_metrics(run_dir, record)
            _save_checkpoint(run_dir / records.LAST_CHECKPOINT, epoch, components, state, sampler)
            if progress:
                _print_epoch(record, config.evaluation.selection_metric)
            patience = config.training.early_stopping_patience
            if patience is not None and state.epochs_without_improvement >= patience:
                break
    except TrainingDiverged as error:
        _finish_record(run_dir, run_record, "failed", clock, reason=f"training diverged: {error}")
        raise
    except KeyboardInterrupt:
        _finish_record(run_dir, run_record, "interrupted", clock)
        raise RunInterrupted(f"run {run_dir} stopped; continue it with: dmlbench train --resume -o {run_dir}") from None
    except BaseException as error:
        _finish_record(run_dir, run_record, "failed", clock, reason=f"{type(error).__name__}: {error}".strip())
        raise
    _finish_record(
        run_dir, run_record, "completed", clock,
        best_epoch=state.best_epoch, best_validation=state.best_metrics, epochs_run=epoch,
    )
    return TrainResult(run_dir, state.best_epoch, state.best_metrics, epoch)


def _train_epoch(
    epoch: int,
    config: Config,
    components: Components,
    sampler: Sampler[list[int]],
    train_set: ImageDataset,
    to_class_index: torch.Tensor,
    device: torch.device,
    progress: bool,
) -> dict[str, Any]:
    """One pass over the sampler's batches; raises ``TrainingDiverged`` on a non-finite loss."""
    model, loss_fn, miner, optimizer = components.model, components.loss, components.miner, components.optimizer
    sampler.set_epoch(epoch)
    model.train()
    epoch_loss, steps, images_seen, started = 0.0, 0, 0, time.perf_counter()
    total = len(sampler)
    if config.training.max_steps_per_epoch is not None:
        total = min(total, config.training.max_steps_per_epoch)
    bar = tqdm(total=total, desc=f"epoch {epoch}/{config.training.epochs}", disable=not progress, leave=False)
    for batch_indices in sampler:
        images, batch_labels, indices = train_set.batch(batch_indices)
        targets = to_class_index[batch_labels].to(device)
        embeddings = model(images.to(device))
        tuples = miner(embeddings, targets) if miner is not None and loss_fn.uses_tuples else None
        loss = loss_fn(embeddings, targets, tuples)
        if not torch.isfinite(loss):
            raise TrainingDiverged(f"loss is {loss.item()} at epoch {epoch}, step {steps + 1}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if getattr(sampler, "needs_embeddings", False):
            sampler.update_memory(indices, embeddings.detach().cpu())
        epoch_loss += loss.item()
        steps += 1
        images_seen += len(images)
        bar.set_postfix(loss=f"{epoch_loss / steps:.4f}", img_s=f"{images_seen / (time.perf_counter() - started):.0f}")
        bar.update()
        if steps >= total:
            break
    bar.close()
    return {
        "epoch": epoch, "loss": epoch_loss / max(steps, 1), "steps": steps, "samples": images_seen,
        "seconds": round(time.perf_counter() - started, 3),
    }


class _SelectionState:
    """Best epoch by the validation selection metric (the test split is never looked at)."""

    def __init__(self) -> None:
        self.best_epoch: int | None = None
        self.best_value = -math.inf
        self.best_metrics: dict[str, float] | None = None
        self.epochs_without_improvement = 0

    def observe(self, epoch: int, metrics: dict[str, float], key: str) -> None:
        if metrics[key] > self.best_value:
            self.best_epoch, self.best_value, self.best_metrics = epoch, metrics[key], metrics
            self.epochs_without_improvement = 0
        else:
            self.epochs_without_improvement += 1

    def state_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        vars(self).update(state)


def _validate(model: torch.nn.Module, validation_set: ImageDataset, config: Config, device: torch.device) -> dict[str, float]:
    embeddings, labels = embed(model, validation_set, config.evaluation.batch_size, device)
    results = evaluation.evaluate(embeddings, labels, metrics=config.evaluation.metrics, seed=config.seed)
    return {key: float(value) for key, value in results.items()}


def _save_checkpoint(
    path: Path, epoch: int, components: Components, state: _SelectionState, sampler: Sampler[list[int]]
) -> None:
    payload = {
        "epoch": epoch,
        "model": components.model.state_dict(),
        "loss": components.loss.state_dict(),
        "optimizer": components.optimizer.state_dict(),
        "miner_generator": components.miner.generator.get_state() if components.miner is not None else None,
        "selection": state.state_dict(),
        # An embedded sampler's batches depend on its memory bank: a resumed run must continue with
        # the bank as it was, not one rebuilt from the current model.
        "sampler_memory": getattr(sampler, "memory", None),
    }
    records.atomic_torch_save(path, payload)


def _load_checkpoint(
    path: Path, components: Components, sampler: Sampler[list[int]]
) -> tuple[int, _SelectionState]:
    payload = torch.load(path, map_location="cpu", weights_only=False)
    components.model.load_state_dict(payload["model"])
    components.loss.load_state_dict(payload["loss"])
    components.optimizer.load_state_dict(payload["optimizer"])
    if components.miner is not None and payload["miner_generator"] is not None:
        components.miner.generator.set_state(payload["miner_generator"])
    if payload.get("sampler_memory") is not None:
        sampler.initialize_memory(payload["sampler_memory"])
    state = _SelectionState()
    state.load_state_dict(payload["selection"])
    return int(payload["epoch"]), state


def _check_run_dir(run_dir: Path, resume: bool) -> None:
    if resume:
        records.require_run_dir(run_dir)
        return
    if run_dir.exists() and not run_dir.is_dir():
        raise UserInputError(f"run directory {run_dir} is a file, not a directory")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise UserInputError(f"run directory {run_dir} already exists and is not empty (use --resume to continue it)")


def _start_record(run_dir: Path, config: Config, dataset_hash: str, splits: Any, resume: bool) -> dict[str, Any]:
    record: dict[str, Any] = records.read_json(run_dir / records.RUN_FILE) if resume else {}
    record.update({
        "status": "running",
        "seed": config.seed,
        "git_commit": records.git_commit(),
        "packages": records.package_versions(),
        "dataset": {"name": config.data.name, "content_hash": dataset_hash},
        "split_sizes": {name: int(len(getattr(splits, name))) for name in ("train", "validation", "test")},
        "num_threads": torch.get_num_threads(),
        "started": record.get("started", records.now()),
    })
    record.setdefault("resumed", [])
    if resume:
        record["resumed"].append(records.now())
    records.write_json(run_dir / records.RUN_FILE, record)
    return record


def _finish_record(run_dir: Path, record: dict[str, Any], status: str, clock: records.Clock, **fields: Any) -> None:
    record.update(status=status, finished=records.now(), cost=clock.cost(run_dir, record.get("cost")), **fields)
    record["samples_seen"] = record["cost"]["samples_seen"]
    records.write_json(run_dir / records.RUN_FILE, record)


def _print_epoch(record: dict[str, Any], key: str) -> None:
    line = f"epoch {record['epoch']}: loss {record['loss']:.4f} ({record['seconds']:.1f} s)"
    if "validation" in record:
        line += f", validation {key} {record['validation'][key]:.4f}"
    tqdm.write(line)
