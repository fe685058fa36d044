"""What every way of training shares: the loss of one batch (mining, then the loss; seed 001 §2's
miner-to-loss order), the validation-only selection of the best epoch, the result and the run
record's end. ``training.loop`` trains on image batches, ``training.features`` heads on cached
trunk features, ``protocol.cost`` times a few steps; all three go through these."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dmlbench import files, plugins, provenance
from dmlbench.errors import PluginFailed
from dmlbench.losses.base import MetricLoss
from dmlbench.mining.base import Miner
from dmlbench.training import records


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
