"""SPC-n: each batch holds ``batch_size / n`` distinct classes with ``n`` images each.

An epoch is one pass without replacement over the training set, organised as follows. Every
class's images are shuffled and cut into groups of ``n``; a class's last ``n_c mod n`` images sit
out the epoch (a different random subset each epoch). The groups are then dealt into ``B`` batches
of ``C = batch_size / n`` groups of distinct classes, where ``B`` is the largest number with
``sum_c min(k_c, B) >= B * C`` (``k_c`` = groups of class ``c``): no schedule can make more batches
of distinct classes without repeating an image, and the deal below always reaches ``B``.

Documented visiting frequency: every image appears at most once per epoch; class ``c`` takes part
in at most ``min(k_c, B)`` batches, and of the ``sum_c min(k_c, B)`` groups available fewer than
``C`` are left out (so with ``k_c <= B`` for all classes, all but ``< C`` groups are visited).

The deal: batch after batch, take the ``C`` classes with the most groups left, ties broken at
random. This largest-first rule always completes ``B`` batches: if a class outside the chosen ``C``
still has ``>= B`` groups, every chosen class has ``>= B`` too, which keeps
``sum_c min(k_c, B) >= B * C`` true for the remaining batches. With equal class sizes it cycles
through all classes in a fresh random order each round, so batches mix classes as uniformly
random draws would. The batch order is shuffled at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from dmlbench.errors import UserInputError
from dmlbench.sampling.base import SAMPLERS, LabelSampler, classes_too_small
from dmlbench.validation import check_positive_int


def max_distinct_class_batches(groups_per_class: Tensor, classes_per_batch: int) -> int:
    """Largest ``B`` with ``sum_c min(k_c, B) >= B * C``: the most batches of ``C`` distinct classes."""
    # f(B) = sum_c min(k_c, B) - B * C is concave with f(0) = 0, so {B : f(B) >= 0} is an interval.
    low, high = 0, int(groups_per_class.sum()) // classes_per_batch
    while low < high:
        middle = (low + high + 1) // 2
        if int(groups_per_class.clamp_max(middle).sum()) >= middle * classes_per_batch:
            low = middle
        else:
            high = middle - 1
    return low


def deal_groups(
    groups_per_class: Tensor, num_batches: int, classes_per_batch: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Largest-remaining-first deal of class groups into batches of distinct classes.

    Returns ``(classes, group_numbers)``, both ``[num_batches, classes_per_batch]``: batch ``t``
    takes group ``group_numbers[t, j]`` (0-based, in the class's shuffled order) of class
    ``classes[t, j]``.
    """
    remaining = groups_per_class.clamp_max(num_batches).to(torch.float64)
    used = torch.zeros_like(groups_per_class)
    classes = torch.empty(num_batches, classes_per_batch, dtype=torch.int64)
    group_numbers = torch.empty_like(classes)
    for batch in range(num_batches):
        # Noise in [0, 1) only reorders classes with equal counts, never a larger count behind a smaller.
        noise = torch.rand(remaining.shape, generator=generator, dtype=torch.float64)
        chosen = (remaining + noise).topk(classes_per_batch).indices
        classes[batch] = chosen
        group_numbers[batch] = used[chosen]
        used[chosen] += 1
        remaining[chosen] -= 1
    return classes, group_numbers


@dataclass(kw_only=True, eq=False, repr=False)
class SamplesPerClassSampler(LabelSampler):
    """SPC-n batches, Roth et al. 2020 sec. 3.2 "Label Samplers": b/n distinct classes x n images
    (default n = 2, their recommendation of sec. 4.3)."""

    samples_per_class: int = 2

    def check_options(self) -> None:
        super().check_options()
        self.samples_per_class = check_positive_int("samples_per_class", self.samples_per_class)
        if self.batch_size % self.samples_per_class:
            raise UserInputError(
                f"batch_size={self.batch_size} is not divisible by samples_per_class={self.samples_per_class}"
            )
        self.classes_per_batch = self.batch_size // self.samples_per_class
        if (self.class_sizes < self.samples_per_class).any():
            raise classes_too_small(self.samples_per_class, self.class_ids, self.class_sizes, (self.batch_size,))
        if self.num_classes < self.classes_per_batch:
            raise UserInputError(
                f"batch_size={self.batch_size} with samples_per_class={self.samples_per_class} needs "
                f"{self.classes_per_batch} distinct classes per batch, but the training set has only "
                f"{self.num_classes}"
            )
        self.groups_per_class = self.class_sizes // self.samples_per_class
        self._num_global_batches = max_distinct_class_batches(self.groups_per_class, self.classes_per_batch)

    def num_global_batches(self) -> int:
        return self._num_global_batches

    def epoch_batches(self, generator: torch.Generator) -> Tensor:
        num_batches, n = self._num_global_batches, self.samples_per_class
        by_class = self.shuffled_by_class(generator)
        classes, group_numbers = deal_groups(self.groups_per_class, num_batches, self.classes_per_batch, generator)
        first = self.class_starts[classes] + group_numbers * n
        batches = by_class[first.unsqueeze(-1) + torch.arange(n)].reshape(num_batches, self.batch_size)
        return batches[torch.randperm(num_batches, generator=generator)]


SAMPLERS.register("spc")(SamplesPerClassSampler)


@SAMPLERS.register("classification")
@dataclass(kw_only=True, eq=False, repr=False)
class ClassificationSampler(SamplesPerClassSampler):
    """Batches of C = batch_size distinct classes x 1 image, Musgrave et al. 2020 sec. 3.1 (M = 1)."""

    samples_per_class: int = field(default=1, init=False)
