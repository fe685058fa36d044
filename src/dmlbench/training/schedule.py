"""Per-epoch learning rates and the warm-up phase; both are pure functions of the epoch, so a resumed
run sets exactly the rates an uninterrupted one would."""

from __future__ import annotations

import math

import torch
from torch import nn

from dmlbench.config import OptimizerConfig


def learning_rate_factor(settings: OptimizerConfig, epoch: int, epochs: int) -> float:
    """The factor of every base learning rate in ``epoch`` (1-based) of ``epochs``.

    ``step``: ``gamma`` to the number of ``step_epochs`` reached (seed 002 §4.1: x0.1 from epoch 15);
    ``cosine``: ``(1 + cos(pi (epoch - 1) / epochs)) / 2`` (Loshchilov & Hutter 2017, Eq. 5 without
    restarts, per epoch and decaying to 0).
    """
    if settings.schedule == "step":
        return settings.gamma ** sum(epoch >= milestone for milestone in settings.step_epochs)
    if settings.schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * (epoch - 1) / epochs))
    return 1.0


def set_learning_rates(optimizer: torch.optim.Optimizer, settings: OptimizerConfig, epoch: int, epochs: int) -> dict[str, float]:
    """Set every group's rate for ``epoch`` from its ``base_lr``; returns ``{group name: rate}``."""
    factor = learning_rate_factor(settings, epoch, epochs)
    rates = {}
    for group in optimizer.param_groups:
        group["lr"] = group["base_lr"] * factor
        rates[group["name"]] = group["lr"]
    return rates


def set_warmup(model: nn.Module, trainable_trunk: list[nn.Parameter], warmup: bool) -> None:
    """In warm-up (seed 002 §4.1: "updating only new parameters") the trunk gets no gradient and its
    BatchNorm statistics stay as they are; afterwards its trainable parameters train again."""
    for parameter in trainable_trunk:
        parameter.requires_grad_(not warmup)
    if warmup:
        for trunk in model.trunk_modules():
            trunk.eval()
