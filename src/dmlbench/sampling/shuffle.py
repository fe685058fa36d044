"""Plain shuffling, for classification losses that need no positives in the batch.

An epoch is one random permutation of the training set cut into ``B = N // batch_size`` batches:
every image appears at most once per epoch, and the ``N mod batch_size`` images at the end of the
permutation (a different random subset each epoch) sit out, so that every batch has the full size.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.sampling.base import SAMPLERS, LabelSampler


class RandomBatchSampler(LabelSampler):
    """Uniformly shuffled batches without replacement (the "random" baseline of Musgrave et al. 2020 sec. 3.1)."""

    def num_global_batches(self) -> int:
        return self.num_samples // self.batch_size

    def epoch_batches(self, generator: torch.Generator) -> Tensor:
        num_batches = self.num_global_batches()
        order = torch.randperm(self.num_samples, generator=generator)
        return order[: num_batches * self.batch_size].reshape(num_batches, self.batch_size)


SAMPLERS.register("random")(RandomBatchSampler)
