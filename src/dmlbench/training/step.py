"""What every way of training shares: where batches come from (``BatchSource``), the loss of one
batch (mining, then the loss; seed 001 §2's miner-to-loss order), the backward pass and the one
optimiser step (``apply_gradients``), the validation-only selection of the best epoch, the result
and the run record's end. ``training.loop`` runs the epochs over a source of image batches or of
cached trunk features (``training.features``); ``protocol.dry_run.cost`` times steps through that loop; the
toy experiment (``toy.experiment``) keeps its own loop of stacked networks and steps through
``apply_gradients``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.utils.data import Sampler

from dmlbench import files, plugins, provenance
from dmlbench.errors import PluginFailed
from dmlbench.losses.base import MetricLoss
from dmlbench.mining.base import Miner
from dmlbench.training import records
from dmlbench.training.distributed import ProcessGroup
from dmlbench.training.setup import Components

# Steps an optimiser without loss scaling: a disabled scaler's ``step`` is the optimiser's own.
_UNSCALED = torch.amp.GradScaler("cpu", enabled=False)


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the run is marked failed."""


@dataclass
class TrainResult:
    """A finished run: its best epoch by the validation selection metric and that epoch's scores."""

    run_dir: Path
    best_epoch: int | None
    best_validation: dict[str, float] | None
    epochs_run: int
    already_complete: bool = False


class BatchSource(Protocol):
    """Where a run's batches come from, the one thing the ways of training differ in (as
    pytorch-metric-learning's trainers differ only in how they fetch a batch): image batches of the
    training view (``training.loop.ImageBatches``) or rows of cached trunk features
    (``training.features.FeatureBatches``). ``components.model`` maps a batch's inputs to embeddings."""

    sampler: Sampler[list[int]]
    components: Components

    def batch(self, indices: list[int], epoch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(inputs, targets, items)`` of the sampler's ``indices``: the model's inputs, the training
        class indices ``0 .. C-1`` and the items' indices (for an embedded sampler's memory bank)."""
        ...

    def train_embeddings(self, device: torch.device, group: ProcessGroup) -> torch.Tensor:
        """Every training item's embedding in evaluation mode (an embedded sampler's first memory bank)."""
        ...

    def validation_embeddings(self, device: torch.device, group: ProcessGroup) -> tuple[torch.Tensor, torch.Tensor]:
        """The validation items' embeddings (float32, CPU) and labels, in evaluation mode."""
        ...

    def describe(self) -> dict[str, Any]:
        """What ``run.json`` records of the data: ``dataset`` (name, content hash), ``split_sizes``,
        ``train_classes``, ``val_classes``, ``unreadable_images`` and anything particular to the source."""
        ...


def batch_loss(loss_fn: MetricLoss, miner: Miner | None, embeddings: torch.Tensor, targets: torch.Tensor,
               *, epoch: int, step: int) -> torch.Tensor:
    """The batch's loss: the miner's index tuples (when the loss takes tuples), then the loss;
    ``TrainingDiverged`` when the embeddings or the loss are not finite, so a NaN fails the run
    instead of scoring it."""
    # Checked before the miner and the loss: several of them mask or clamp a NaN distance into a
    # finite value, and a sampling miner would fail on it with an error of its own.
    if not bool(torch.isfinite(embeddings).all()):
        raise TrainingDiverged(f"embeddings are not finite (NaN or infinite) at epoch {epoch}, step {step}")
    tuples = miner(embeddings, targets) if miner is not None and loss_fn.uses_tuples else None
    loss = loss_fn(embeddings, targets, tuples)
    if not torch.isfinite(loss):
        raise TrainingDiverged(f"loss is {loss.item()} at epoch {epoch}, step {step}")
    return loss


def backward(loss: torch.Tensor, scaler: torch.amp.GradScaler, accumulation: int) -> None:
    """Add the batch's gradients: the loss divided by the ``accumulation`` steps of its window, scaled
    by the fp16 gradient scaler (a disabled scaler leaves it as it is)."""
    scaler.scale(loss / accumulation if accumulation > 1 else loss).backward()


def apply_gradients(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None = None) -> None:
    """Step ``optimizer`` on the gradients gathered since the last step (through the fp16 gradient
    ``scaler`` when given, which skips a step with infinite gradients) and clear them. The one place
    in the package that steps an optimiser (``tests/test_architecture.py`` checks it)."""
    scaler = _UNSCALED if scaler is None else scaler
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


class SelectionState:
    """Best epoch by the validation selection metric (the test split is never looked at); ties keep
    the earlier epoch. ``epochs_without_improvement`` drives early stopping."""

    def __init__(self) -> None:
        self.best_epoch: int | None = None
        self.best_value = -math.inf
        self.best_metrics: dict[str, float] | None = None
        self.epochs_without_improvement = 0

    def observe(self, epoch: int, metrics: dict[str, float], key: str) -> bool:
        """Record an evaluation; ``True`` when it is the new best."""
        if metrics[key] > self.best_value:
            self.best_epoch, self.best_value, self.best_metrics = epoch, metrics[key], metrics
            self.epochs_without_improvement = 0
            return True
        self.epochs_without_improvement += 1
        return False

    def state_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        vars(self).update(state)


def finish_record(run_dir: Path, record: dict[str, Any], status: str, clock: records.Clock, *, write: bool = True,
                  **fields: Any) -> None:
    """End the run record: status, time, cost (added to a resumed run's earlier cost) and any
    ``fields``; ``write``: this process writes the run directory (rank 0 of a data-parallel run)."""
    record.update(status=status, finished=provenance.now(), cost=clock.cost(run_dir, record.get("cost")), **fields)
    record["samples_seen"] = record["cost"]["samples_seen"]
    if write:
        files.write_json(run_dir / records.RUN_FILE, record)


def fail_run(run_dir: Path, record: dict[str, Any], clock: records.Clock, error: BaseException, *,
             write: bool = True) -> PluginFailed | None:
    """End the run record as ``failed`` by ``error`` and keep its full traceback in ``error.log``.
    An error raised in a plugin's code is returned as a ``PluginFailed`` to raise instead (one line
    naming the plugin, the exception, its frame in the plugin, the run and its ``error.log``); the
    reason in ``run.json`` is that line without the run."""
    in_plugin = plugins.failure(error)
    reason = in_plugin or f"{type(error).__name__}: {error}".strip()
    if write:
        records.write_error_log(run_dir, error)
    finish_record(run_dir, record, "failed", clock, write=write, reason=reason)
    if in_plugin is None:
        return None
    return PluginFailed(f"{in_plugin}; run {run_dir} marked failed, traceback in {run_dir / records.ERROR_LOG}")
