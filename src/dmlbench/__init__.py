"""dmlbench: train and fairly compare deep metric learning methods.

The Python API (docs/api.md): ``benchmark``, ``train``, ``evaluate``, ``load_results``; your own
components (docs/your-method.md): ``register_loss``, ``register_miner``, ``register_sampler``,
``register_trunk``, ``register_dataset``, ``register_metric``. They are imported on first use, so ``import dmlbench``
stays cheap (the command line answers ``--help`` at once).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "benchmark": "dmlbench.api", "train": "dmlbench.api", "evaluate": "dmlbench.api", "load_results": "dmlbench.api",
    "register_loss": "dmlbench.plugins", "register_miner": "dmlbench.plugins", "register_sampler": "dmlbench.plugins",
    "register_trunk": "dmlbench.plugins", "register_dataset": "dmlbench.plugins", "register_metric": "dmlbench.plugins",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dmlbench' has no attribute {name!r}")
