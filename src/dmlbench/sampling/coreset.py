"""Greedy coreset (k-center) distillation of the big batch, Roth et al. 2020 sec. 3.2 "GC".

The batch approximately solves ``min_{B, |B| = b} max_{x* in B*} min_{x in B} d(x, x*)`` by the
greedy farthest-point rule (Agarwal et al. 2005; a 2-approximation for n = 1): start from a random
group of the big batch, then repeatedly add the group of the point of ``B*`` farthest from
everything selected so far. Adding a point adds its whole SPC group (see ``memory.py``), and all of
the group's points become centres. Distances are Euclidean; ties go to the lower position in the
big batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.distances import euclidean, squared_euclidean
from dmlbench.sampling.base import SAMPLERS
from dmlbench.sampling.memory import EmbeddedSampler


def covering_radius(points: Tensor, centers: Tensor) -> Tensor:
    """``max_{x* in points} min_{x in centers} ||x - x*||``, the GC objective (Roth et al. 2020 sec. 3.2)."""
    return euclidean(points, centers).min(dim=1).values.max()


def greedy_k_center_groups(
    points: Tensor, samples_per_class: int, num_groups: int, first_group: int
) -> Tensor:
    """Greedy farthest-point selection of ``num_groups`` groups of ``samples_per_class`` consecutive
    rows of ``points`` (Roth et al. 2020 sec. 3.2 "GC"), starting from ``first_group``; returns the
    selected group positions in selection order."""
    n = samples_per_class
    grouped = squared_euclidean(points).reshape(-1, n, points.shape[0])  # squares keep the argmax
    nearest = torch.full((points.shape[0],), float("inf"), dtype=points.dtype, device=points.device)
    selected = []
    group = first_group
    for _ in range(num_groups):
        selected.append(group)
        torch.minimum(nearest, grouped[group].amin(dim=0), out=nearest)
        # -inf (not the 0 distance to themselves) so that selected points never win again, even
        # when duplicate embeddings put unselected points at distance 0 too.
        nearest[group * n : group * n + n] = float("-inf")
        group = int(nearest.argmax()) // n
    return torch.tensor(selected, dtype=torch.int64, device=points.device)


class GreedyCoresetSampler(EmbeddedSampler):
    """Greedy coreset batches from a memory bank (Roth et al. 2020 sec. 3.2 "Greedy Coreset Distillation")."""

    def select_groups(self, points: Tensor, generator: torch.Generator) -> Tensor:
        first = int(torch.randint(self.groups_per_big_batch, (1,), generator=generator))
        return greedy_k_center_groups(points, self.samples_per_class, self.groups_per_batch, first)


SAMPLERS.register("greedy_coreset")(GreedyCoresetSampler)
