"""Losses, one family per module; every module registers its losses in ``LOSSES`` on import."""

import importlib
import pkgutil

from dmlbench.losses.base import LOSSES, MetricLoss, build, loss_parameters, zero_loss

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["LOSSES", "MetricLoss", "build", "loss_parameters", "zero_loss"]
