"""Training only the embedding head (and the loss's own parameters) on cached trunk features.

With a frozen trunk every search trial of seed 001's protocol (Musgrave et al. 2020 §3.3) trains the
same trunk function, so its output can be computed once per fold (``trunk_features``) and the trial
trains ``EmbeddingHead`` on it: ``training.train(config, run_dir, features=...)`` runs the one loop
over ``FeatureBatches``, the head-only set-up, with the same loss, miner, sampler, optimiser groups,
schedule, validation, selection, records, checkpoints and resumption as a full run, without images
or augmentation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from dmlbench.config import Config
from dmlbench.data.base import ImageDataset
from dmlbench.errors import UserInputError
from dmlbench.models.embedding import EmbeddingHead, binarize
from dmlbench.training.distributed import ProcessGroup
from dmlbench.training.embed import embed
from dmlbench.training.setup import (
    Components, build_loss_and_miner, build_model, build_optimizer, build_sampler, class_index,
)
from dmlbench.training.step import TrainingDiverged


@dataclass(frozen=True)
class FoldFeatures:
    """A fold's trunk features (float32, CPU) and labels of its train and validation items; ``source``
    describes where they come from (recorded in each head run's ``run.json`` as ``frozen_trunk``),
    ``dataset_hash`` the content hash of the dataset they were computed from."""

    train: Tensor
    train_labels: Tensor
    validation: Tensor
    validation_labels: Tensor
    source: Mapping[str, Any]
    dataset_hash: str
    # Images that could not be decoded, left out of the splits; None: a cache that predates the count.
    unreadable_images: int | None = None


def trunk_features(config: Config, trunk_state: Mapping[str, Tensor] | None, split: ImageDataset,
                   device: torch.device) -> Tensor:
    """The trunk output (before the head) of every item of ``split`` in evaluation mode on ``device``; ``trunk_state``:
    a full model's state dict to load (a trained trunk's checkpoint), ``None``: the model as built
    (a pre-trained trunk used as is)."""
    if config.model.ensemble != 1:
        raise UserInputError("protocol.frozen_trunk needs a single trunk (model.ensemble=1)")
    model = build_model(config)
    if trunk_state is not None:
        model.load_state_dict(trunk_state)
    features, _ = embed(model.trunk.to(device), split, config.evaluation.batch_size, device)  # type: ignore[union-attr]
    return features


class _HeadOnly(nn.Module):
    """The head with the model interface the loop and ``build_optimizer`` need (no trunk)."""

    def __init__(self, head: EmbeddingHead) -> None:
        super().__init__()
        self.head = head

    def forward(self, features: Tensor) -> Tensor:
        return self.head(features)

    def trunk_parameters(self) -> list[nn.Parameter]:
        return []

    def head_parameters(self) -> list[nn.Parameter]:
        return list(self.head.parameters())

    def trunk_modules(self) -> list[nn.Module]:
        return []


class FeatureBatches:
    """The head-only set-up: batches of cached trunk features (``training.step.BatchSource``) and
    the components that train on them, ``config``'s head (``EmbeddingHead`` on the features'
    width, seeded by ``config.seed``), loss, miner, optimiser (head and loss groups) and sampler
    over the training rows. ``training.train(config, run_dir, features=...)`` trains it."""

    def __init__(self, config: Config, features: FoldFeatures, device: torch.device) -> None:
        self.config, self.features = config, features
        settings = config.model
        to_class_index = class_index(features.train_labels.numpy())
        self.targets = to_class_index[features.train_labels]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            head = EmbeddingHead(features.train.shape[1], settings.embedding_dim, settings.layer_norm,
                                 settings.normalize, settings.bias).to(device)
        loss, miner = build_loss_and_miner(config, int((to_class_index >= 0).sum()), device)
        model = _HeadOnly(head)
        self.components = Components(model=model, loss=loss, miner=miner,  # type: ignore[arg-type]
                                     optimizer=build_optimizer(config, model, loss))
        self.sampler = build_sampler(config, self.targets.numpy())
        self.train_rows, self.validation_rows = features.train.to(device), features.validation.to(device)

    def batch(self, indices: list[int], epoch: int) -> tuple[Tensor, Tensor, Tensor]:
        items = torch.as_tensor(indices, dtype=torch.long)
        return self.train_rows[items.to(self.train_rows.device)], self.targets[items], items

    def train_embeddings(self, device: torch.device, group: ProcessGroup) -> Tensor:
        return self._embed(self.train_rows)

    def validation_embeddings(self, device: torch.device, group: ProcessGroup) -> tuple[Tensor, Tensor]:
        embeddings = self._embed(self.validation_rows)
        if not bool(torch.isfinite(embeddings).all()):
            raise TrainingDiverged("the head's validation embeddings are not finite")
        if self.config.model.binarize:
            embeddings = binarize(embeddings)
        return embeddings, self.features.validation_labels

    @torch.no_grad()
    def _embed(self, rows: Tensor) -> Tensor:
        """All rows at once (a row's embedding does not depend on the others), in evaluation mode."""
        model = self.components.model
        was_training = model.training
        model.eval()
        embeddings = model(rows).float().cpu()
        model.train(was_training)
        return embeddings

    def describe(self) -> dict[str, Any]:
        features = self.features
        return {
            "dataset": {"name": self.config.data.name, "content_hash": features.dataset_hash},
            "split_sizes": {"train": len(features.train), "validation": len(features.validation), "test": 0},
            "train_classes": sorted(int(c) for c in features.train_labels.unique()),
            "val_classes": sorted(int(c) for c in features.validation_labels.unique()),
            "unreadable_images": features.unreadable_images,
            "frozen_trunk": dict(features.source),
        }
