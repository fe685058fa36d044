"""Training only the embedding head (and the loss's own parameters) on cached trunk features.

With a frozen trunk every search trial of seed 001's protocol (Musgrave et al. 2020 §3.3) trains the
same trunk function, so its output can be computed once per fold (``trunk_features``) and the trial
trains ``EmbeddingHead`` on it (``train_head``): the same loss, miner, sampler, optimiser groups,
schedule, validation and selection as ``training.loop``, without images or augmentation.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from dmlbench import evaluation, files, provenance
from dmlbench.config import Config, to_yaml
from dmlbench.data.base import ImageDataset
from dmlbench.errors import UserInputError
from dmlbench.models.embedding import EmbeddingHead, binarize
from dmlbench.training import records
from dmlbench.training.embed import embed, resolve_device
from dmlbench.training.schedule import set_learning_rates
from dmlbench.training.setup import build_loss_and_miner, build_model, build_optimizer, build_sampler, class_index
from dmlbench.training.step import SelectionState, TrainingDiverged, TrainResult, batch_loss, fail_run, finish_record
from dmlbench.training.threads import resolve_threads

HEAD_CHECKPOINT = "head_best.pt"


@dataclass(frozen=True)
class FoldFeatures:
    """A fold's trunk features (float32, CPU) and labels of its train and validation items; ``source``
    describes where they come from (recorded in each head run's ``run.json``)."""

    train: Tensor
    train_labels: Tensor
    validation: Tensor
    validation_labels: Tensor
    source: Mapping[str, Any]


def trunk_features(config: Config, trunk_state: Mapping[str, Tensor] | None, split: ImageDataset) -> Tensor:
    """The trunk output (before the head) of every item of ``split`` in evaluation mode; ``trunk_state``:
    a full model's state dict to load (a trained trunk's checkpoint), ``None``: the model as built
    (a pre-trained trunk used as is)."""
    if config.model.ensemble != 1:
        raise UserInputError("protocol.frozen_trunk needs a single trunk (model.ensemble=1)")
    device = resolve_device(config.training.device)
    model = build_model(config)
    if trunk_state is not None:
        model.load_state_dict(trunk_state)
    features, _ = embed(model.trunk.to(device), split, config.evaluation.batch_size, device)  # type: ignore[union-attr]
    return features


class _HeadOnly(nn.Module):
    """The head with the model interface ``build_optimizer`` needs (no trunk parameters)."""

    def __init__(self, head: EmbeddingHead) -> None:
        super().__init__()
        self.head = head

    def trunk_parameters(self) -> list[nn.Parameter]:
        return []

    def head_parameters(self) -> list[nn.Parameter]:
        return list(self.head.parameters())


def train_head(config: Config, run_dir: Path, features: FoldFeatures, record: Mapping[str, Any]) -> TrainResult:
    """Train ``config``'s head, loss and miner on ``features`` for ``training.epochs`` epochs of the
    sampler's batches; validate after each evaluation epoch on the validation features and keep the
    best epoch by ``evaluation.selection_metric``. Writes ``config.yaml``, ``run.json`` and
    ``metrics.jsonl`` (epoch 0: the untrained head) like ``training.train``. A completed run is
    returned as recorded; an unfinished one is trained again from the start (it is cheap). One
    process owns ``run_dir`` meanwhile (``records.owned_run_dir``)."""
    run_dir = Path(run_dir)
    with records.owned_run_dir(run_dir):
        return _train_head(config, run_dir, features, record)


def _train_head(config: Config, run_dir: Path, features: FoldFeatures, record: Mapping[str, Any]) -> TrainResult:
    run_file = run_dir / records.RUN_FILE
    if run_file.is_file():
        stored = files.read_json(run_file)
        if stored.get("status") == "completed":
            return TrainResult(run_dir, stored.get("best_epoch"), stored.get("best_validation"), stored.get("epochs_run", 0),
                              already_complete=True)
    records.clear_run_dir(run_dir)
    clock = records.Clock()
    device = resolve_device(config.training.device)
    torch.set_num_threads(resolve_threads(config.training.num_threads))
    settings = config.model
    to_class_index = class_index(features.train_labels.numpy())
    targets_all = to_class_index[features.train_labels]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        head = EmbeddingHead(features.train.shape[1], settings.embedding_dim, settings.layer_norm, settings.normalize,
                             settings.bias).to(device)
    loss_fn, miner = build_loss_and_miner(config, int((to_class_index >= 0).sum()), device)
    optimizer = build_optimizer(config, _HeadOnly(head), loss_fn)
    sampler = build_sampler(config, targets_all.numpy())
    train_x, val_x = features.train.to(device), features.validation.to(device)

    records.create_run_dir(run_dir)
    files.atomic_write_text(run_dir / records.CONFIG_FILE, to_yaml(config))
    run_record: dict[str, Any] = {
        "status": "running", "seed": config.seed, "git_commit": provenance.git_commit(),
        "train_classes": sorted(int(c) for c in features.train_labels.unique()),
        "val_classes": sorted(int(c) for c in features.validation_labels.unique()),
        "split_sizes": {"train": len(features.train), "validation": len(features.validation), "test": 0},
        "frozen_trunk": dict(features.source), "started": provenance.now(), **record,
    }
    files.write_json(run_file, run_record)

    def validate() -> dict[str, float]:
        head.eval()
        with torch.no_grad():
            embeddings = head(val_x).float().cpu()
        if not bool(torch.isfinite(embeddings).all()):
            raise TrainingDiverged(f"the head's validation embeddings are not finite after epoch {epoch}")
        if settings.binarize:
            embeddings = binarize(embeddings)
        results = evaluation.evaluate(embeddings, features.validation_labels, metrics=config.evaluation.metrics, seed=config.seed,
                                      rerank=config.evaluation.rerank.method())
        return {key: float(value) for key, value in results.items()}

    key = config.evaluation.selection_metric
    state = SelectionState()
    epoch = 0
    try:
        records.append_metrics(run_dir, {"epoch": 0, "validation": validate()})
        if getattr(sampler, "needs_embeddings", False):
            with torch.no_grad():
                sampler.initialize_memory(head(train_x).float().cpu())
        accumulation = config.training.accumulation_steps
        for epoch in range(1, config.training.epochs + 1):
            entry = _head_epoch(epoch, config, head, loss_fn, miner, optimizer, sampler, train_x, targets_all, accumulation)
            if epoch % config.training.eval_every == 0 or epoch == config.training.epochs:
                entry["validation"] = validate()
                if state.observe(epoch, entry["validation"], key):
                    files.atomic_torch_save(run_dir / HEAD_CHECKPOINT, {
                        "epoch": epoch, "head": head.state_dict(), "loss": loss_fn.state_dict()})
            records.append_metrics(run_dir, entry)
            patience = config.training.early_stopping_patience
            if patience is not None and state.epochs_without_improvement >= patience:
                break
    except TrainingDiverged as error:
        finish_record(run_dir, run_record, "failed", clock, reason=f"training diverged: {error}")
        raise
    except BaseException as error:
        in_plugin = fail_run(run_dir, run_record, clock, error)
        if in_plugin is not None:
            raise in_plugin from error
        raise
    finish_record(run_dir, run_record, "completed", clock, best_epoch=state.best_epoch,
                  best_validation=state.best_metrics, epochs_run=epoch)
    return TrainResult(run_dir, state.best_epoch, state.best_metrics, epoch)


def _head_epoch(
    epoch: int, config: Config, head: EmbeddingHead, loss_fn: Any, miner: Any, optimizer: torch.optim.Optimizer,
    sampler: Any, train_x: Tensor, targets_all: Tensor, accumulation: int,
) -> dict[str, Any]:
    """One pass over the sampler's batches of cached features (``training.loop._train_epoch`` without images)."""
    sampler.set_epoch(epoch)
    head.train()
    rates = set_learning_rates(optimizer, config.optimizer, epoch, config.training.epochs)
    total = len(sampler)
    if config.training.max_steps_per_epoch is not None:
        total = min(total, config.training.max_steps_per_epoch)
    epoch_loss, steps, seen, started = 0.0, 0, 0, time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    for batch in sampler:
        index = torch.as_tensor(batch, dtype=torch.long)
        targets = targets_all[index].to(train_x.device)
        embeddings = head(train_x[index.to(train_x.device)])
        loss = batch_loss(loss_fn, miner, embeddings, targets, epoch=epoch, step=steps + 1)
        (loss / accumulation if accumulation > 1 else loss).backward()
        if (steps + 1) % accumulation == 0 or steps + 1 == total:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if getattr(sampler, "needs_embeddings", False):
            sampler.update_memory(index, embeddings.detach().cpu())
        epoch_loss += loss.item()
        steps += 1
        seen += len(index)
        if steps >= total:
            break
    return {"epoch": epoch, "loss": epoch_loss / max(steps, 1), "steps": steps, "learning_rates": rates, "samples": seen,
            "seconds": round(time.perf_counter() - started, 3)}
