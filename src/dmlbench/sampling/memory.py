"""Embedded samplers: batches distilled from a big batch ``B*`` of a memory bank of embeddings.

Roth et al. 2020, sec. 3.2 "Embedded Samplers": a memory bank ``M`` holds an embedding of every
training image, initialised with eval-mode embeddings and overwritten with each training batch's
embeddings; every mini-batch ``B`` (size ``b``) is chosen from a random big batch ``B*``
(``b* = 1024``) so that ``B`` matches the statistics of ``B*`` under the current embedding.

Choices the paper leaves open, as implemented here:

* Both ``B*`` and ``B`` keep the SPC-n structure (``samples_per_class = n``, default 2 as the
  paper's SPC-2 recommendation), as the authors' released code does: at the start of an epoch each
  class's images are shuffled and cut into groups of ``n``; ``B*`` is ``b*/n`` groups drawn
  uniformly without replacement, and ``B`` is ``b/n`` whole groups of ``B*``. So every batch has
  positives when ``n >= 2`` and never repeats an image; with ``n = 1`` the selection works on single
  images. Classes may repeat across groups (``B*`` usually holds more groups than there are classes).
* An epoch has ``N // b`` batches (as many as one pass of plain shuffling).
  Images are not visited with a fixed frequency: which ones are picked depends on the embeddings.
* Distributed: every rank holds the same memory bank (the trainer writes the gathered embeddings of
  the whole global batch into it), so every rank distils the same global batch and takes its slice
  of it (``BatchSampler.shard``); the result is the single-process batch sequence.
* The trainer must call ``update_memory`` after every step before asking for the next batch, so the
  DataLoader must use ``num_workers=0`` (workers prefetch batches ahead of the updates); asking for
  a batch before the previous one was reported back raises ``UserInputError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from dmlbench.errors import UserInputError
from dmlbench.sampling.base import BatchSampler, classes_too_small
from dmlbench.validation import check_positive_int


def group_points(groups: Tensor, samples_per_class: int) -> Tensor:
    """Point positions of groups: group ``g`` of a big batch holds points ``g*n .. g*n + n - 1``."""
    offsets = torch.arange(samples_per_class, device=groups.device)
    return (groups.unsqueeze(-1) * samples_per_class + offsets).flatten(-2)


def random_candidates(
    num_groups: int, groups_per_batch: int, num_candidates: int, generator: torch.Generator
) -> Tensor:
    """``[num_candidates, groups_per_batch]`` uniform random subsets (without replacement) of the groups."""
    keys = torch.rand(num_candidates, num_groups, generator=generator)
    return keys.argsort(dim=1)[:, :groups_per_batch]


@dataclass(kw_only=True, eq=False, repr=False)
class EmbeddedSampler(BatchSampler):
    """Base of memory-bank samplers; subclasses pick ``b/n`` groups of the big batch (``select_groups``)."""

    samples_per_class: int = 2
    big_batch_size: int = 1024
    memory: Tensor | None = field(default=None, init=False)
    _awaiting_update: bool = field(default=False, init=False)

    needs_embeddings: ClassVar[bool] = True

    def check_options(self) -> None:
        super().check_options()
        self.samples_per_class = n = check_positive_int("samples_per_class", self.samples_per_class)
        self.big_batch_size = check_positive_int("big_batch_size", self.big_batch_size)
        for name, value in (("batch_size", self.batch_size), ("big_batch_size", self.big_batch_size)):
            if value % n:
                raise UserInputError(f"{name}={value} is not divisible by samples_per_class={n}")
        if self.big_batch_size <= self.batch_size:
            raise UserInputError(
                f"big_batch_size={self.big_batch_size} must be larger than batch_size={self.batch_size}"
            )
        if (self.class_sizes < n).any():
            raise classes_too_small(n, self.class_ids, self.class_sizes, (self.batch_size, self.big_batch_size))
        self.groups_per_batch = self.batch_size // n
        self.groups_per_big_batch = self.big_batch_size // n
        self.num_groups = int((self.class_sizes // n).sum())
        if self.num_groups < self.groups_per_big_batch:
            raise UserInputError(
                f"the memory bank needs {self.groups_per_big_batch} disjoint groups of samples_per_class={n} "
                f"images (big_batch_size={self.big_batch_size}), but the training set "
                f"({self.num_samples} images) gives only {self.num_groups}; lower big_batch_size"
            )

    def num_global_batches(self) -> int:
        return self.num_samples // self.batch_size

    def initialize_memory(self, embeddings: Tensor) -> None:
        """Fill the memory bank with eval-mode embeddings of the whole training set, in dataset order."""
        if not isinstance(embeddings, Tensor) or embeddings.dim() != 2 or embeddings.shape[0] != self.num_samples:
            shape = tuple(embeddings.shape) if isinstance(embeddings, Tensor) else type(embeddings).__name__
            raise UserInputError(
                f"initialize_memory needs embeddings of shape [{self.num_samples}, D] (one row per "
                f"training image), got {shape}"
            )
        if not embeddings.dtype.is_floating_point or not torch.isfinite(embeddings).all():
            raise UserInputError("initialize_memory needs finite floating-point embeddings")
        # Half precision would make the bank's distances too coarse to rank candidates.
        dtype = torch.float64 if embeddings.dtype == torch.float64 else torch.float32
        self.memory = embeddings.detach().to(dtype=dtype).clone()

    def update_memory(self, indices: Tensor | list[int], embeddings: Tensor) -> None:
        """Overwrite the bank's rows ``indices`` with the (detached) embeddings of the last batch."""
        memory = self._require_memory()
        index = torch.as_tensor(indices, dtype=torch.int64).reshape(-1)
        if embeddings.dim() != 2 or embeddings.shape != (index.numel(), memory.shape[1]):
            raise UserInputError(
                f"update_memory needs embeddings of shape [{index.numel()}, {memory.shape[1]}] for "
                f"{index.numel()} indices, got {tuple(embeddings.shape)}"
            )
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= self.num_samples):
            raise UserInputError(f"update_memory indices must lie in [0, {self.num_samples})")
        memory[index.to(memory.device)] = embeddings.detach().to(device=memory.device, dtype=memory.dtype)
        self._awaiting_update = False

    def _require_memory(self) -> Tensor:
        if self.memory is None:
            raise UserInputError(
                f"{type(self).__name__} needs initialize_memory(embeddings) before it can make batches"
            )
        return self.memory

    def epoch_groups(self, generator: torch.Generator) -> Tensor:
        """``[num_groups, n]`` dataset indices: each class's images shuffled and cut into groups of ``n``."""
        n = self.samples_per_class
        by_class = self.shuffled_by_class(generator)
        classes = self.class_index[by_class]
        rank_in_class = torch.arange(self.num_samples) - self.class_starts[classes]
        # Drop each class's last n_c mod n images so that groups never mix classes.
        complete = rank_in_class < (self.class_sizes // n * n)[classes]
        return by_class[complete].reshape(-1, n)

    def select_groups(self, points: Tensor, generator: torch.Generator) -> Tensor:
        """Positions (into the big batch's ``b*/n`` groups) of the ``b/n`` groups that form the batch.

        ``points`` are the big batch's embeddings ``[b*, D]``, group ``g`` in rows ``g*n .. g*n+n-1``.
        """
        raise NotImplementedError

    def select(self, big_batch: Tensor, generator: torch.Generator) -> Tensor:
        """Dataset indices of the batch distilled from ``big_batch`` (``[b*/n, n]`` dataset indices)."""
        memory = self._require_memory()
        points = memory[big_batch.reshape(-1).to(memory.device)]
        chosen = self.select_groups(points, generator).cpu()
        return big_batch[chosen].reshape(-1)

    def __iter__(self) -> Iterator[list[int]]:
        self._require_memory()
        generator = self.epoch_generator()
        groups = self.epoch_groups(generator)
        self._awaiting_update = False
        for step in range(len(self)):
            if self._awaiting_update:
                raise UserInputError(
                    f"{type(self).__name__} was asked for batch {step + 1} before update_memory() got the "
                    f"embeddings of batch {step}: use DataLoader(num_workers=0) with embedded samplers "
                    "(workers prefetch batches) and call update_memory after every step"
                )
            big_batch = groups[torch.randperm(self.num_groups, generator=generator)[: self.groups_per_big_batch]]
            batch = self.select(big_batch, generator)
            self._awaiting_update = True
            yield self.shard(batch).tolist()


@dataclass(kw_only=True, eq=False, repr=False)
class CandidateMatchingSampler(EmbeddedSampler):
    """Picks, among ``num_candidates`` random batches of the big batch, the one whose statistic is
    closest to the big batch's (DDM and FRD, Roth et al. 2020 sec. 3.2)."""

    num_candidates: int = 10

    def check_options(self) -> None:
        super().check_options()
        self.num_candidates = check_positive_int("num_candidates", self.num_candidates)

    def mismatch(self, points: Tensor, candidates: Tensor) -> Tensor:
        """``[m]`` distances between the big batch and each candidate (``[m, b]`` point positions)."""
        raise NotImplementedError

    def select_groups(self, points: Tensor, generator: torch.Generator) -> Tensor:
        candidates = random_candidates(
            self.groups_per_big_batch, self.groups_per_batch, self.num_candidates, generator
        ).to(points.device)
        scores = self.mismatch(points, group_points(candidates, self.samples_per_class))
        # argmin returns the first minimum: ties go to the earlier candidate.
        return candidates[int(scores.argmin())]
