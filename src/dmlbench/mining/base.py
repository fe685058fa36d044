"""What every miner shares: the registry, the call interface, input checks and rho-regularisation."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dmlbench.distances import check_batch
from dmlbench.mining.rho import switch_negatives
from dmlbench.mining.tuples import Tuples
from dmlbench.registry import Registry
from dmlbench.validation import check_probability

MINERS: Registry[Miner] = Registry("miner")


class Miner:
    """Selects index tuples from a batch: ``miner(embeddings, labels) -> Triplets | Pairs``.

    Miners never build autograd graphs and always compute in at least float32 (outside autocast),
    so half-precision training mines the same tuples; all randomness comes from ``self.generator``.
    A miner whose window is the loss's margin (``WINDOW_IS_LOSS_MARGIN``) takes ``loss.params.margin`` when
    a config sets the loss's margin and not the miner's (``training.setup.miner_params``).
    """

    WINDOW_IS_LOSS_MARGIN = False

    def __init__(self, generator: torch.Generator | None = None) -> None:
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)

    def __call__(self, embeddings: Tensor, labels: Tensor) -> Tuples:
        check_batch(embeddings, labels)
        embeddings = embeddings.detach()
        if embeddings.dtype in (torch.float16, torch.bfloat16):
            embeddings = embeddings.float()
        with torch.no_grad(), torch.autocast(device_type=embeddings.device.type, enabled=False):
            return self.mine(embeddings, labels.to(embeddings.device))

    def mine(self, embeddings: Tensor, labels: Tensor) -> Tuples:
        raise NotImplementedError


class RhoRegularizedMiner(Miner):
    """rho-regularisation, Roth et al. 2020 sec. 5.1: ``miner``'s tuples with negatives switched to classmates.

    See ``dmlbench.mining.rho.switch_negatives`` for what a switch does to triplets and to pairs.
    """

    def __init__(self, miner: Miner, p_switch: float, generator: torch.Generator | None = None) -> None:
        super().__init__(generator if generator is not None else miner.generator)
        self.miner = miner
        self.p_switch = check_probability("p_switch", p_switch)

    def mine(self, embeddings: Tensor, labels: Tensor) -> Tuples:
        return switch_negatives(self.miner.mine(embeddings, labels), labels, self.p_switch, self.generator)


def build(name: str, *, p_switch: float = 0.0, generator: torch.Generator | None = None, **hparams: Any) -> Miner:
    """Build miner ``name``; ``p_switch > 0`` wraps it in rho-regularisation sharing its ``generator``."""
    check_probability("p_switch", p_switch)
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    miner = MINERS.build(name, generator=generator, **hparams)
    return RhoRegularizedMiner(miner, p_switch, generator) if p_switch > 0 else miner
