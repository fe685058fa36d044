"""SPC-R: ``batch_size - 1`` uniformly random images plus one image that guarantees a positive pair.

An epoch is one random permutation of the training set cut into ``B = N // (batch_size - 1)``
groups of ``batch_size - 1`` images (every image fills a random slot at most once per epoch; the
``N mod (batch_size - 1)`` images at the end of the permutation sit out). The last slot of each
batch is an image of the same class as one of the random slots and not already in the batch: the
random slot is chosen uniformly among those whose class has an image outside the batch, the image
uniformly among those. If no slot qualifies, every class in the batch lies entirely inside it and,
since every class has at least two images, the batch already holds a positive pair; the last slot
is then a random image from outside the batch. So an image can appear twice in an epoch (once in a
random slot, once in a last slot) but never twice in a batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.errors import UserInputError
from dmlbench.sampling.base import SAMPLERS, LabelSampler, format_classes


def first_outside_batch(candidates: Tensor, valid: Tensor, batch_of: Tensor, batch_ids: Tensor) -> Tensor:
    """Per row, the first valid candidate image that is not in batch ``batch_ids[row]``.

    ``candidates``/``valid`` are ``[rows, K]``; the caller guarantees that every row has one.
    """
    outside = valid & (batch_of[candidates] != batch_ids.unsqueeze(1))
    # argmax over a 0/1 tensor returns the first maximum, i.e. the first qualifying column.
    column = outside.to(torch.int8).argmax(dim=1)
    return candidates.gather(1, column.unsqueeze(1)).squeeze(1)


class SpcRandomSampler(LabelSampler):
    """SPC-R batches (Roth et al. 2020, sec. 3.2 "Label Samplers"): b-1 random images + 1 positive."""

    def check_options(self) -> None:
        super().check_options()
        if self.batch_size < 2:
            raise UserInputError(f"spc_random needs batch_size >= 2 to hold a positive pair, got {self.batch_size}")
        singletons = self.class_sizes < 2
        if singletons.any():
            raise UserInputError(
                "spc_random needs at least 2 images in every class to guarantee a positive pair: "
                f"{format_classes(self.class_ids[singletons], self.class_sizes[singletons])}"
            )

    def num_global_batches(self) -> int:
        return self.num_samples // (self.batch_size - 1)

    def epoch_batches(self, generator: torch.Generator) -> Tensor:
        num_batches, width = self.num_global_batches(), self.batch_size - 1
        num_classes = self.num_classes
        order = torch.randperm(self.num_samples, generator=generator)
        random_part = order[: num_batches * width].reshape(num_batches, width)
        batch_ids = torch.arange(num_batches)
        batch_of = torch.full((self.num_samples,), -1, dtype=torch.int64)
        batch_of[random_part] = batch_ids.unsqueeze(1).expand(-1, width)

        slot_classes = self.class_index[random_part]
        _, slot_group, group_counts = torch.unique(
            batch_ids.unsqueeze(1) * num_classes + slot_classes, return_inverse=True, return_counts=True
        )
        count_in_batch = group_counts[slot_group]
        has_spare = self.class_sizes[slot_classes] > count_in_batch

        # A uniformly random slot among those whose class has an image outside the batch.
        scores = torch.rand(random_part.shape, generator=generator).masked_fill(~has_spare, -1.0)
        anchor_slot = scores.argmax(dim=1, keepdim=True)
        anchor_class = slot_classes.gather(1, anchor_slot).squeeze(1)
        anchor_count = count_in_batch.gather(1, anchor_slot).squeeze(1)

        # Each class's images in a fresh random order; the first one outside the batch is a uniform
        # draw among the outside images. At most anchor_count members precede it.
        by_class = self.shuffled_by_class(generator)
        depth = int(anchor_count.max()) + 1
        offsets = torch.arange(depth).unsqueeze(0)
        valid = offsets < self.class_sizes[anchor_class].unsqueeze(1)
        positions = (self.class_starts[anchor_class].unsqueeze(1) + offsets).clamp_max(self.num_samples - 1)
        partner = first_outside_batch(by_class[positions], valid, batch_of, batch_ids)

        # Batches without any spare image already hold a positive pair: add any outside image.
        no_spare = ~has_spare.any(dim=1)
        if no_spare.any():
            fallback_order = torch.randperm(self.num_samples, generator=generator)[: self.batch_size]
            rows = int(no_spare.sum())
            candidates = fallback_order.unsqueeze(0).expand(rows, -1)
            partner[no_spare] = first_outside_batch(
                candidates, torch.ones_like(candidates, dtype=torch.bool), batch_of, batch_ids[no_spare]
            )
        return torch.cat([random_part, partner.unsqueeze(1)], dim=1)


SAMPLERS.register("spc_random")(SpcRandomSampler)
