"""Random choices for miners, drawn only from an explicit ``torch.Generator``."""

from __future__ import annotations

import torch
from torch import Tensor


def uniform(count: int, generator: torch.Generator, device: torch.device) -> Tensor:
    """``count`` float64 numbers in ``[0, 1)`` from ``generator``, moved to ``device``.

    Drawn on the generator's own device, so a CPU generator also drives miners on the GPU.
    """
    return torch.rand(count, generator=generator, device=generator.device, dtype=torch.float64).to(device)


def draw_from_log_weights(log_weights: Tensor, generator: torch.Generator) -> Tensor:
    """One column index per row, with probability ``softmax(log_weights[row])``; ``-inf`` entries are never drawn.

    Gumbel-max trick: exact, vectorised over rows, and works in log space so that weights spanning
    hundreds of orders of magnitude (distance-weighted sampling in high dimension) stay representable.
    Every row needs at least one finite entry.
    """
    rows, columns = log_weights.shape
    noise = uniform(rows * columns, generator, log_weights.device).view(rows, columns)
    gumbel = -torch.log(-torch.log(noise.clamp_min(torch.finfo(torch.float64).tiny)))
    return (log_weights.double() + gumbel).argmax(dim=1)


def draw_from_masks(mask: Tensor, generator: torch.Generator) -> Tensor:
    """One column index per row, uniform over that row's ``True`` entries (every row needs one)."""
    log_weights = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
    return draw_from_log_weights(log_weights.masked_fill(~mask, float("-inf")), generator)
