"""The training loop: mini-batches from a batch sampler, optional mining, validation-only model
selection, checkpoints every epoch and exact resumption; single-process or data-parallel over the
processes of ``torchrun`` (``training.distributed``), where rank 0 alone writes the run directory.

One epoch loop for every run: its batches come from a ``training.step.BatchSource``, image batches
of the training view (``ImageBatches``) or, for a head on a frozen trunk, rows of cached trunk
features (``training.features.FeatureBatches``); records, checkpoints, resumption, tracking and
signal handling are the same for both. ``time_steps`` runs the same loop for ``protocol.dry_run.cost``."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Sampler
from tqdm import tqdm

from dmlbench import evaluation, files, plugins, provenance
from dmlbench.config import Config, to_yaml
from dmlbench.errors import RunInterrupted, StorageFailed, UserInputError
from dmlbench.files import describe, storage_error
from dmlbench.models.trunks import pretrained_weights
from dmlbench.training import acceleration, distributed, records, tracking
from dmlbench.training.acceleration import resolve_precision
from dmlbench.training.distributed import ProcessGroup
from dmlbench.training.embed import embed
from dmlbench.training.features import FeatureBatches, FoldFeatures
from dmlbench.training.placement import STANDALONE, Placement
from dmlbench.training.schedule import set_learning_rates, set_warmup
from dmlbench.training.setup import Components, TrainingSetup, miner_params, set_up_training
from dmlbench.training.step import (
    BatchSource, SelectionState, TrainingDiverged, TrainResult, apply_gradients, backward, batch_loss, fail_run,
    finish_record,
)

# What a tracked run is tagged with: the protocol's unit and the benchmark it belongs to.
TRACKING_TAGS = ("method", "stage", "trial", "reproduction", "fold", "seed", "config_hash")
# Where stderr is no terminal (no progress bar): a progress line within an epoch at most this often.
LOG_EVERY_SECONDS = 30.0


def train(
    config: Config,
    run_dir: Path,
    *,
    resume: bool = False,
    progress: bool = True,
    record: Mapping[str, Any] | None = None,
    features: FoldFeatures | None = None,
    placement: Placement = STANDALONE,
    tracker_failures: tracking.TrackerFailures | None = None,
) -> TrainResult:
    """Train one model on the training classes of ``config.data``; select on validation only.

    The loop holds only ``training_view`` of the dataset (train and validation items, no test
    item). ``record``: extra JSON fields for ``run.json`` (the protocol's method, stage, trial, fold).
    ``features``: a frozen trunk's cached features of the fold; only ``config``'s head (and the
    loss's parameters) trains, on them (``training.features.FeatureBatches``), in one process.
    ``placement``: this worker's device and threads (``training.placement``); ``tracker_failures``: the
    trackers that already failed for this worker's runs (``tracking.TrackerFailures``), not tried again.
    One process owns ``run_dir`` while it trains (``records.owned_run_dir``, rank 0 under
    ``torchrun``): another one that trains or resumes it meanwhile gets ``DirectoryInUse``.
    """
    run_dir = Path(run_dir)
    group = distributed.current()
    distributed.check_batch(config.training.batch_size, group)
    if features is not None and group.enabled:
        raise UserInputError("a head on cached trunk features (protocol.frozen_trunk) trains in one process, not under torchrun")
    with _owned_and_checked(run_dir, resume, group):
        return _train(config, run_dir, resume=resume, progress=progress, record=record, features=features,
                      placement=placement, tracker_failures=tracker_failures)


def _train(
    config: Config, run_dir: Path, *, resume: bool, progress: bool, record: Mapping[str, Any] | None,
    features: FoldFeatures | None, placement: Placement, tracker_failures: tracking.TrackerFailures | None,
) -> TrainResult:
    clock = records.Clock()
    group = distributed.current()
    main = group.is_main
    if resume:
        stored = records.read_run_record(run_dir)
        if stored.get("status") == "completed":
            # Nothing to train: the run directory stays exactly as it is.
            return TrainResult(
                run_dir, stored.get("best_epoch"), stored.get("best_validation"), stored.get("epochs_run", 0),
                already_complete=True,
            )
    device = placement.device(config.training.device)
    if group.enabled and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", group.local_rank)
    resolve_precision(config.training.precision, device)  # an impossible precision fails before any data is read
    torch.set_num_threads(placement.threads(config.training.num_threads))
    source: BatchSource = (ImageBatches(config, set_up_training(config, device)) if features is None
                           else FeatureBatches(config, features, device))
    stepper = Stepper(config, source.components, device, group)
    start_epoch, state = 0, SelectionState()
    if resume and (run_dir / records.LAST_CHECKPOINT).exists():
        start_epoch, state = _load_checkpoint(run_dir / records.LAST_CHECKPOINT, source.components, source.sampler, stepper)
        if main:
            records.truncate_metrics(run_dir, start_epoch)
    elif main:
        records.create_run_dir(run_dir)
        files.atomic_write_text(run_dir / records.CONFIG_FILE, to_yaml(config))
        (run_dir / records.METRICS_FILE).unlink(missing_ok=True)
    run_record = _start_record(run_dir, source, stepper, resume, record)
    track = _start_tracking(run_dir, config, run_record, resume, tracker_failures) if main else tracking.Tracker()
    try:
        epoch = _run_epochs(run_dir, source, stepper, state, start_epoch, progress and main, track)
    except TrainingDiverged as error:
        finish_record(run_dir, run_record, "failed", clock, write=main, reason=f"training diverged: {error}")
        raise
    except KeyboardInterrupt:
        finish_record(run_dir, run_record, "interrupted", clock, write=main)
        raise RunInterrupted(f"run {run_dir} stopped; continue it with: dmlbench train --resume -o {run_dir}") from None
    except BaseException as error:
        full = storage_error(error)
        if full is None:
            in_plugin = fail_run(run_dir, run_record, clock, error, write=main)
            if in_plugin is not None:
                raise in_plugin from error
            raise
        with contextlib.suppress(OSError):  # the record itself may not fit on the disk
            finish_record(run_dir, run_record, "interrupted", clock, write=main)
        raise StorageFailed(f"{describe(full)}; free space, then continue the run with: "
                            f"dmlbench train --resume -o {run_dir}") from error
    else:
        finish_record(
            run_dir, run_record, "completed", clock, write=main,
            best_epoch=state.best_epoch, best_validation=state.best_metrics, epochs_run=epoch,
        )
    finally:
        track.finish(str(run_record.get("status")))
    return TrainResult(run_dir, state.best_epoch, state.best_metrics, epoch)


def _start_tracking(run_dir: Path, config: Config, run_record: dict[str, Any], resume: bool,
                    failures: tracking.TrackerFailures | None) -> tracking.Tracker:
    """The run's tracker (``tracking:``), opened (or, resumed, reopened) with the config and the
    protocol's tags; what reopens it is recorded in ``run.json``."""
    track = tracking.tracker(config.tracking, run_record.get("tracking") if resume else None, failures)
    tags = {key: run_record[key] for key in TRACKING_TAGS if key in run_record}
    opened = track.start(run_dir, tracking.flatten(config.model_dump(mode="json")), tags)
    if opened:
        run_record["tracking"] = opened
        files.write_json(run_dir / records.RUN_FILE, run_record)
    return track


@contextlib.contextmanager
def _owned_and_checked(run_dir: Path, resume: bool, group: ProcessGroup) -> Iterator[None]:
    """Rank 0 alone owns and checks the run directory (it alone writes it; the others would see the
    one it creates) and tells the others, so that a refusal stops every rank with the same line."""
    with contextlib.ExitStack() as held:
        refusal: UserInputError | None = None
        if group.is_main:
            try:
                _check_run_dir(run_dir, resume)
                held.enter_context(records.owned_run_dir(run_dir))
                _check_new_run_dir_empty(run_dir, resume)
            except UserInputError as error:
                refusal = error
        message = distributed.broadcast(None if refusal is None else str(refusal), group)
        if refusal is not None:
            raise refusal
        if message is not None:
            raise UserInputError(message)
        yield


def _run_epochs(
    run_dir: Path, source: BatchSource, stepper: Stepper, state: SelectionState, start_epoch: int, progress: bool,
    track: tracking.Tracker,
) -> int:
    """Epochs ``start_epoch + 1`` onwards, each validated on its schedule and checkpointed; returns the last one run."""
    config, sampler = stepper.config, source.sampler
    device, group, main = stepper.device, stepper.group, stepper.group.is_main
    if start_epoch == 0:
        # The untrained model's validation scores: the baseline every epoch is compared with.
        untrained = _validate(source, config, device, group)
        if main:
            records.append_metrics(run_dir, {"epoch": 0, "validation": untrained})
            track.log(tracking.epoch_metrics({"validation": untrained}), 0)
    _initialize_memory(source, device, group)
    epoch = start_epoch
    for epoch in range(start_epoch + 1, config.training.epochs + 1):
        record = _train_epoch(epoch, source, stepper, progress)
        if epoch % config.training.eval_every == 0 or epoch == config.training.epochs:
            validation = _validate(source, config, device, group)
            record["validation"] = validation
            state.observe(epoch, validation, config.evaluation.selection_metric)
            if main and state.best_epoch == epoch:
                _save_checkpoint(run_dir / records.BEST_CHECKPOINT, epoch, source.components, state, sampler, stepper)
        if main:
            records.append_metrics(run_dir, record)
            track.log(tracking.epoch_metrics(record), epoch)
            _save_checkpoint(run_dir / records.LAST_CHECKPOINT, epoch, source.components, state, sampler, stepper)
        if progress:
            _print_epoch(record, config.evaluation.selection_metric)
        patience = config.training.early_stopping_patience
        if patience is not None and state.epochs_without_improvement >= patience:
            break
    return epoch


def train_or_resume(
    config: Config, run_dir: Path, *, progress: bool = True, record: Mapping[str, Any] | None = None,
    features: FoldFeatures | None = None, placement: Placement = STANDALONE,
    tracker_failures: tracking.TrackerFailures | None = None,
) -> TrainResult:
    """The protocol's way to train a run, full or (``features``) head-only: continue it after an
    interruption, return it as it is once completed, and start it afresh when a killed attempt left
    no ``run.json``, or a completed run lost its best checkpoint (a benchmark directory copied without
    its ``*.pt`` files): nothing worth keeping, and a run trains to the same digits again."""
    run_dir = Path(run_dir)
    # Owned before anything is decided or removed: another worker may still be training it.
    with records.owned_run_dir(run_dir) if distributed.current().is_main else contextlib.nullcontext():
        if (run_dir / records.RUN_FILE).is_file() and not _lost_its_model(run_dir):
            return train(config, run_dir, resume=True, progress=progress, record=record, features=features,
                         placement=placement, tracker_failures=tracker_failures)
        records.clear_run_dir(run_dir)
        return train(config, run_dir, progress=progress, record=record, features=features, placement=placement,
                     tracker_failures=tracker_failures)


def _lost_its_model(run_dir: Path) -> bool:
    """A completed run without the best checkpoint every completed run saves."""
    completed = records.read_run_record(run_dir).get("status") == "completed"
    return completed and not (run_dir / records.BEST_CHECKPOINT).is_file()


def _initialize_memory(source: BatchSource, device: torch.device, group: ProcessGroup) -> None:
    """An embedded sampler's first memory bank (a resumed run's comes from its checkpoint)."""
    sampler = source.sampler
    if getattr(sampler, "needs_embeddings", False) and sampler.memory is None:
        sampler.initialize_memory(source.train_embeddings(device, group))


class Stepper:
    """What a training step needs besides the components: the module to call (plain, DDP-wrapped and
    or compiled, rebuilt when the warm-up phase changes which parameters train), autocast and the
    fp16 gradient scaler, as ``acceleration`` resolved them (channels_last applied to the model here)."""

    def __init__(self, config: Config, components: Components, device: torch.device, group: ProcessGroup) -> None:
        self.config, self.components, self.device, self.group = config, components, device, group
        self.acceleration = acceleration.resolve(config.training, components.model, device)
        self.acceleration.prepare_model(components.model)
        self.dtype = self.acceleration.dtype
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.acceleration.precision == "fp16")
        # Frozen BatchNorm parameters never train; warm-up switches only the others.
        self.trainable_trunk = [p for p in components.model.trunk_parameters() if p.requires_grad]
        self._phase: bool | None = None
        self._module: torch.nn.Module = components.model

    def begin_epoch(self, epoch: int) -> dict[str, float]:
        """Learning rates and training mode for ``epoch``; returns the rates by group."""
        config, model = self.config, self.components.model
        warmup = epoch <= config.training.warmup_epochs
        model.train()
        set_warmup(model, self.trainable_trunk, warmup)
        if warmup != self._phase:
            self._phase, self._module = warmup, self._wrap(model)
        return set_learning_rates(self.components.optimizer, config.optimizer, epoch, config.training.epochs)

    def _wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        module = model
        if self.group.enabled:
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [self.device.index] if self.device.type == "cuda" else None
            module = DistributedDataParallel(model, device_ids=device_ids)
        if self.config.training.compile:
            module = torch.compile(module)
        return module

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None):
            return self._module(self.acceleration.prepare_images(images))

    def no_sync(self, sync: bool) -> Any:
        """DDP skips the gradient all-reduce of accumulation steps that do not end in an optimiser step."""
        ddp = getattr(self._module, "_orig_mod", self._module)
        if sync or not self.group.enabled:
            return contextlib.nullcontext()
        return ddp.no_sync()


class ImageBatches:
    """Image batches of the training view (``training.step.BatchSource``), for a full model:
    ``setup`` is ``training.setup.set_up_training``'s."""

    def __init__(self, config: Config, setup: TrainingSetup) -> None:
        self.setup, self.batch_size, self.dataset_name = setup, config.evaluation.batch_size, config.data.name
        self.sampler, self.components = setup.sampler, setup.components

    def batch(self, indices: list[int], epoch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        images, labels, items = self.setup.train_set.batch(indices, epoch=epoch)
        return images, self.setup.to_class_index[labels], items

    def train_embeddings(self, device: torch.device, group: ProcessGroup) -> torch.Tensor:
        return distributed.embed_sharded(embed, self.components.model, self.setup.train_set, self.batch_size, device, group)[0]

    def validation_embeddings(self, device: torch.device, group: ProcessGroup) -> tuple[torch.Tensor, torch.Tensor]:
        return distributed.embed_sharded(embed, self.components.model, self.setup.validation_set, self.batch_size,
                                         device, group)

    def describe(self) -> dict[str, Any]:
        setup = self.setup
        labels = torch.as_tensor(setup.dataset.labels)
        return {
            "dataset": {"name": self.dataset_name, "content_hash": setup.dataset_hash},
            "split_sizes": {name: int(len(getattr(setup.full_splits, name))) for name in ("train", "validation", "test")},
            "train_classes": sorted(int(c) for c in labels[setup.splits.train].unique()),
            "val_classes": sorted(int(c) for c in labels[setup.splits.validation].unique()),
            # Files Pillow cannot decode are left out of every split (load_dataset warns); never silently.
            "unreadable_images": len(setup.dataset.metadata.get("unreadable_items", [])),
            # uint8 images held on the GPU (training.setup.held_on): no host copy per step; recorded only
            # then, so that CPU runs keep their records.
            **({"images_on_device": True} if _images_on_device(setup.train_set) else {}),
        }


def _images_on_device(dataset: Any) -> bool:
    """Whether a dataset's images were moved off the host (``training.setup.held_on``; a plugin's dataset
    may have no ``held_device``)."""
    device = getattr(dataset, "held_device", None)
    return isinstance(device, torch.device) and device.type != "cpu"


@dataclass
class StepBudget:
    """A step budget for ``time_steps``: the loop stops after ``steps`` steps and keeps each one's seconds."""

    steps: int
    seconds: list[float] = field(default_factory=list)

    @property
    def spent(self) -> bool:
        return len(self.seconds) >= self.steps


def time_steps(config: Config, source: BatchSource, device: torch.device, steps: int) -> list[float]:
    """The seconds of each of the first ``steps`` training steps of ``source`` (fetching the batch
    included) as the loop takes them, epoch after epoch from the first after the warm-up; what
    ``protocol.dry_run.cost`` times. Nothing is written; the components train."""
    stepper = Stepper(config, source.components, device, ProcessGroup())
    _initialize_memory(source, device, stepper.group)
    budget, epoch = StepBudget(steps), config.training.warmup_epochs
    while not budget.spent:
        epoch, taken = epoch + 1, len(budget.seconds)
        _train_epoch(epoch, source, stepper, False, budget)
        if len(budget.seconds) == taken:  # a sampler without a batch
            break
    return budget.seconds


def _train_epoch(
    epoch: int, source: BatchSource, stepper: Stepper, progress: bool, budget: StepBudget | None = None
) -> dict[str, Any]:
    """One pass over the sampler's batches; raises ``TrainingDiverged`` on a non-finite loss.

    With ``accumulation_steps`` k the optimiser steps after every k batches (and after the epoch's
    last), each batch's loss divided by k. In data-parallel training ``sampler`` yields this rank's
    slice of each global batch and the loss is computed on the gathered global batch. ``budget``:
    stop once it is spent, timing each step.
    """
    config, components, device, group = stepper.config, stepper.components, stepper.device, stepper.group
    loss_fn, miner, optimizer = components.loss, components.miner, components.optimizer
    sampler = source.sampler
    accumulation = config.training.accumulation_steps
    sampler.set_epoch(epoch)
    rates = stepper.begin_epoch(epoch)
    epoch_loss, steps, images_seen, started = 0.0, 0, 0, time.perf_counter()
    total = len(sampler)
    if config.training.max_steps_per_epoch is not None:
        total = min(total, config.training.max_steps_per_epoch)
    # disable=None: no bar where stderr is no terminal (a log file would fill with carriage returns); a plain
    # line then every LOG_EVERY_SECONDS, so that a long epoch shows progress in a log too.
    bar = tqdm(total=total, desc=f"epoch {epoch}/{config.training.epochs}", disable=None if progress else True, leave=False)
    logged = time.perf_counter() if progress and bar.disable else math.inf
    optimizer.zero_grad(set_to_none=True)
    for batch_indices in sampler:
        step_started = time.perf_counter()
        inputs, batch_targets, indices = source.batch(batch_indices, epoch)
        targets = distributed.gather(batch_targets.to(device), group)
        ends_window = (steps + 1) % accumulation == 0 or steps + 1 == total
        with stepper.no_sync(ends_window):
            embeddings = distributed.gather(stepper.forward(inputs.to(device)).float(), group)
            loss = batch_loss(loss_fn, miner, embeddings, targets, epoch=epoch, step=steps + 1)
            backward(loss, stepper.scaler, accumulation)
        if ends_window:
            apply_gradients(optimizer, stepper.scaler)
        if getattr(sampler, "needs_embeddings", False):
            # Every rank writes the whole global batch, so the ranks' banks stay equal.
            sampler.update_memory(distributed.gather(indices.to(device), group).cpu(), embeddings.detach().cpu())
        epoch_loss += loss.item()
        steps += 1
        images_seen += len(inputs) * group.world_size
        if budget is not None:
            budget.seconds.append(time.perf_counter() - step_started)
        bar.set_postfix(loss=f"{epoch_loss / steps:.4f}", img_s=f"{images_seen / (time.perf_counter() - started):.0f}")
        bar.update()
        if time.perf_counter() - logged >= LOG_EVERY_SECONDS and steps < total:
            logged = time.perf_counter()
            print(f"epoch {epoch}/{config.training.epochs}: step {steps}/{total}, loss {epoch_loss / steps:.4f}, "
                  f"{images_seen / (logged - started):.0f} img/s", file=sys.stderr, flush=True)
        if steps >= total or (budget is not None and budget.spent):
            break
    bar.close()
    return {
        "epoch": epoch, "loss": epoch_loss / max(steps, 1), "steps": steps, "learning_rates": rates,
        "samples": images_seen,
        "seconds": round(time.perf_counter() - started, 3),
    }


def _validate(
    source: BatchSource, config: Config, device: torch.device, group: ProcessGroup = ProcessGroup(),
) -> dict[str, float]:
    """Validation metrics; each rank embeds its share once, rank 0 scores all of them and tells the others."""
    embeddings, labels = source.validation_embeddings(device, group)
    scores = None
    if group.is_main:
        # Re-ranked when evaluation.rerank is set, so the selection and the search see the re-ranked metric.
        # The neighbour search runs on the training device (the same numbers as on the CPU).
        results = evaluation.evaluate(embeddings, labels, metrics=config.evaluation.metrics, seed=config.seed,
                                      rerank=config.evaluation.rerank.method(), device=device)
        scores = {key: float(value) for key, value in results.items()}
    return distributed.broadcast(scores, group)


def _save_checkpoint(
    path: Path, epoch: int, components: Components, state: SelectionState, sampler: Sampler[list[int]],
    stepper: Stepper,
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
        "grad_scaler": stepper.scaler.state_dict(),
    }
    files.atomic_torch_save(path, payload)


def _load_checkpoint(
    path: Path, components: Components, sampler: Sampler[list[int]], stepper: Stepper
) -> tuple[int, SelectionState]:
    payload = files.load_checkpoint(
        path, f"copy {records.BEST_CHECKPOINT} over it to resume from the best epoch instead, or train afresh "
        "in a new directory")
    components.model.load_state_dict(payload["model"])
    components.loss.load_state_dict(payload["loss"])
    components.optimizer.load_state_dict(payload["optimizer"])
    if components.miner is not None and payload["miner_generator"] is not None:
        components.miner.generator.set_state(payload["miner_generator"])
    if payload.get("sampler_memory") is not None:
        sampler.initialize_memory(payload["sampler_memory"])
    if payload.get("grad_scaler"):
        stepper.scaler.load_state_dict(payload["grad_scaler"])
    state = SelectionState()
    state.load_state_dict(payload["selection"])
    return int(payload["epoch"]), state


def _check_run_dir(run_dir: Path, resume: bool) -> None:
    if resume:
        records.require_run_dir(run_dir)
        return
    if run_dir.exists() and not run_dir.is_dir():
        raise UserInputError(f"run directory {run_dir} is a file, not a directory")


def _check_new_run_dir_empty(run_dir: Path, resume: bool) -> None:
    """A new run starts in an empty directory (but for the lock file this process holds)."""
    if not resume and any(entry.name != records.LOCK_FILE for entry in run_dir.iterdir()):
        raise UserInputError(f"run directory {run_dir} already exists and is not empty (`resume` continues it)")


def _start_record(
    run_dir: Path, source: BatchSource, stepper: Stepper, resume: bool, extra: Mapping[str, Any] | None
) -> dict[str, Any]:
    config, group = stepper.config, stepper.group
    data = source.describe()
    record: dict[str, Any] = records.read_run_record(run_dir) if resume else {}
    record.update({
        "status": "running",
        "seed": config.seed,
        "git_commit": provenance.git_commit(),
        "packages": provenance.package_versions(),
        "dataset": data.pop("dataset"),
        "split_sizes": data.pop("split_sizes"),
        "num_threads": torch.get_num_threads(),
        "environment": provenance.environment(str(stepper.device)),
        "plugins": plugins.used(config.plugins),
        "miner": None if config.miner.name is None else {"name": config.miner.name, "params": miner_params(config)},
        "training_choices": {
            "model": config.model.model_dump(mode="json"),
            "optimizer": config.optimizer.model_dump(mode="json"),
            "training": config.training.model_dump(mode="json"),
            "acceleration": stepper.acceleration.record(),
            "world_size": group.world_size,
            "batch_per_process": config.training.batch_size // group.world_size,
        },
        "launch": distributed.launch_record(group),
        "started": record.get("started", provenance.now()),
    })
    record.setdefault("resumed", [])
    if resume:
        record["resumed"].append(provenance.now())
        record.pop("reason", None)  # an earlier attempt's failure is not this attempt's
        if group.is_main:
            (run_dir / records.ERROR_LOG).unlink(missing_ok=True)
    weights = pretrained_weights(config.model.trunk, config.model.pretrained)
    if weights is not None:  # absent for random weights, so that their run.json stays as it was
        record["pretrained_weights"] = weights
    record.update(data)  # the classes, unreadable images and the source's own fields
    record.update(extra or {})
    if group.is_main:
        files.write_json(run_dir / records.RUN_FILE, record)
    return record


def _print_epoch(record: dict[str, Any], key: str) -> None:
    line = f"epoch {record['epoch']}: loss {record['loss']:.4f} ({record['seconds']:.1f} s)"
    if "validation" in record:
        line += f", validation {key} {record['validation'][key]:.4f}"
    tqdm.write(line)
