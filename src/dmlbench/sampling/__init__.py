"""Batch samplers; every module registers its samplers in ``SAMPLERS`` on import.

``dmlbench.sampling.build(name, labels=..., batch_size=..., seed=..., **options)`` returns a
``torch.utils.data.Sampler[list[int]]`` for ``DataLoader(dataset, batch_sampler=sampler)``.
"""

import importlib
import pkgutil

from dmlbench.sampling.base import SAMPLERS, BatchSampler, LabelSampler, build

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["SAMPLERS", "BatchSampler", "LabelSampler", "build"]
