"""Tuple miners; every module registers its miners in ``MINERS`` on import."""

import importlib
import pkgutil

from dmlbench.mining.base import MINERS, Miner, build
from dmlbench.mining.tuples import Pairs, Triplets, Tuples, all_pairs, all_triplets, to_pairs, to_triplets

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "MINERS", "Miner", "build", "Pairs", "Triplets", "Tuples",
    "all_pairs", "all_triplets", "to_pairs", "to_triplets",
]
