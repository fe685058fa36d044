"""Turning a ``Config`` into the objects of a run: data splits, model, loss, miner, sampler, optimiser."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.data import Sampler

from dmlbench import data, losses, mining, models, sampling
from dmlbench.config import Config
from dmlbench.data.base import ImageDataset
from dmlbench.data.splits import Splits, standard_splits
from dmlbench.losses.base import MetricLoss, loss_parameters
from dmlbench.mining.base import Miner
from dmlbench.registry import accepted_parameters


@dataclass
class Components:
    model: nn.Module
    loss: MetricLoss
    miner: Miner | None
    optimizer: torch.optim.Optimizer


def make_splits(config: Config, dataset: ImageDataset) -> Splits:
    return standard_splits(dataset.labels, config.data.validation_fraction, config.seed)


def class_index(labels: np.ndarray) -> torch.Tensor:
    """A lookup table from the training classes' ids to ``0 .. C-1`` (losses with class weights need it)."""
    classes = np.unique(labels)
    table = torch.full((int(classes.max()) + 1,), -1, dtype=torch.long)
    table[torch.as_tensor(classes)] = torch.arange(len(classes))
    return table


def load_dataset(config: Config) -> ImageDataset:
    return data.build(config.data.name, **config.data.options)


def build_model(config: Config) -> nn.Module:
    return models.build(
        config.model.trunk,
        embedding_dim=config.model.embedding_dim,
        layer_norm=config.model.layer_norm,
        normalize=config.model.normalize,
        seed=config.seed,
        **config.model.options,
    )


def build_sampler(config: Config, train_labels: np.ndarray) -> Sampler[list[int]]:
    return sampling.build(
        config.sampler.name,
        labels=train_labels,
        batch_size=config.training.batch_size,
        seed=config.seed,
        **config.sampler.params,
    )


def build_components(config: Config, num_classes: int, device: torch.device) -> Components:
    model = build_model(config).to(device)
    loss_params = dict(config.loss.params)
    if "seed" in (accepted_parameters(losses.LOSSES.get(config.loss.name)) or set()):
        loss_params["seed"] = config.seed
    loss = losses.build(
        config.loss.name, num_classes=num_classes, embedding_dim=config.model.embedding_dim, **loss_params
    ).to(device)
    miner = None
    if config.miner.name is not None:
        generator = torch.Generator().manual_seed(config.seed + 1)
        miner = mining.build(config.miner.name, generator=generator, p_switch=config.miner.p_switch, **config.miner.params)
    optimizer = build_optimizer(config, model, loss)
    return Components(model=model, loss=loss, miner=miner, optimizer=optimizer)


def build_optimizer(config: Config, model: nn.Module, loss: nn.Module) -> torch.optim.Optimizer:
    """One parameter group for the network and one, with ``loss_lr``, for the loss's own parameters."""
    settings = config.optimizer
    groups = [{"params": list(model.parameters()), "lr": settings.lr}]
    own = loss_parameters(loss)
    if own:
        groups.append({"params": own, "lr": settings.loss_lr})
    if settings.name == "adam":
        return torch.optim.Adam(groups, weight_decay=settings.weight_decay)
    if settings.name == "adamw":
        return torch.optim.AdamW(groups, weight_decay=settings.weight_decay)
    if settings.name == "rmsprop":
        return torch.optim.RMSprop(groups, weight_decay=settings.weight_decay, momentum=settings.momentum)
    return torch.optim.SGD(groups, weight_decay=settings.weight_decay, momentum=settings.momentum)
