"""What every batch sampler shares: the registry, input checks, per-epoch seeding and sharding.

A sampler is a ``torch.utils.data.Sampler[list[int]]`` used as
``DataLoader(dataset, batch_sampler=sampler)``. The batches of epoch ``e`` are a pure function of
``(seed, e, rank, world_size)`` (and, for embedded samplers, of the memory bank's contents):
every rank builds the same *global* sequence of batches from a generator seeded with
``(seed, epoch)`` and keeps its contiguous slice of every global batch (rank ``r`` of ``W`` takes
positions ``r*b/W .. (r+1)*b/W - 1``), so the ranks' slices, concatenated in rank order, are exactly
the batch a single process trains on: the global batch stays the configured one whatever the number
of processes, and with ``world_size=1`` nothing changes. ``batch_size`` must therefore be divisible
by ``world_size``. The DataLoader asks for the batches in its main process, so the number of
data-loader workers never changes them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Sampler

from dmlbench.errors import UserInputError
from dmlbench.registry import Registry
from dmlbench.validation import check_positive_int, check_seed

SAMPLERS: Registry[BatchSampler] = Registry("sampler")

LabelsLike = Tensor | np.ndarray | Sequence[int]


def as_labels(labels: LabelsLike) -> Tensor:
    """The training labels as a 1-D int64 tensor (a copy); anything else is a ``UserInputError``."""
    if isinstance(labels, Tensor):
        tensor = labels.detach().cpu()
    else:
        array = np.asarray(labels)
        if array.dtype == object:
            raise UserInputError("labels must be a 1-D array of integers, got objects")
        tensor = torch.from_numpy(array.copy()) if array.size else torch.empty(0, dtype=torch.int64)
    if tensor.dtype == torch.bool or tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        raise UserInputError(f"labels must be a 1-D array of integers, got dtype {tensor.dtype}")
    if tensor.dim() != 1 or tensor.numel() == 0:
        raise UserInputError(f"labels must be a non-empty 1-D array, got shape {tuple(tensor.shape)}")
    return tensor.to(torch.int64).clone()


def resolve_process_group(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``; missing values come from ``torch.distributed`` when it is initialised."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if world_size is None:
        world_size = torch.distributed.get_world_size() if distributed else 1
    if rank is None:
        rank = torch.distributed.get_rank() if distributed else 0
    check_positive_int("world_size", world_size)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise UserInputError(f"rank must be an integer in [0, world_size={world_size}), got {rank!r}")
    return rank, world_size


def derived_generator(*entropy: int) -> torch.Generator:
    """A ``torch.Generator`` seeded from a tuple of non-negative ints via numpy's ``SeedSequence``,
    so that nearby tuples such as ``(seed, epoch)`` and ``(seed, epoch + 1)`` give unrelated streams."""
    state = np.random.SeedSequence(list(entropy)).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def format_classes(class_ids: Tensor, counts: Tensor, limit: int = 5) -> str:
    """``'class 3 has 1 image, class 9 has 2 images'`` for error messages, at most ``limit`` entries."""
    parts = [
        f"class {int(c)} has {int(n)} image{'s' if int(n) != 1 else ''}"
        for c, n in zip(class_ids[:limit], counts[:limit])
    ]
    if class_ids.numel() > limit:
        parts.append(f"and {class_ids.numel() - limit} more")
    return ", ".join(parts)


def classes_too_small(samples_per_class: int, class_ids: Tensor, class_sizes: Tensor, batch_sizes: tuple[int, ...]) -> UserInputError:
    """The refusal of a ``samples_per_class`` some classes cannot fill, naming the value that fits: the
    largest one no bigger than the smallest class that divides every batch size (a user with her own
    images, classes of 2 or 3, otherwise learns what is wrong but not what to set)."""
    too_small = class_sizes < samples_per_class
    smallest = int(class_sizes.min())
    fits = max(n for n in range(1, smallest + 1) if all(size % n == 0 for size in batch_sizes))
    if fits < 2:
        # One image per class in a batch gives no positive pair: no pair or tuple loss learns from it.
        return UserInputError(
            f"samples_per_class={samples_per_class} is larger than some classes: "
            f"{format_classes(class_ids[too_small], class_sizes[too_small])}; a batch needs at least 2 images of a "
            f"class to form a positive pair, so leave the classes with fewer out (or give them more images)")
    return UserInputError(
        f"samples_per_class={samples_per_class} is larger than some classes: "
        f"{format_classes(class_ids[too_small], class_sizes[too_small])}; set sampler.params.samples_per_class={fits} "
        f"(the smallest class has {smallest} image{'s' if smallest != 1 else ''}), or leave the small classes out")


@dataclass(kw_only=True, eq=False, repr=False)
class BatchSampler(Sampler[list[int]]):
    """Base of all batch samplers: labels, batch size, seed, epoch and the rank's slice of each batch.

    The options are keyword-only dataclass fields: a subclass declares only the options it adds
    (as fields of a ``@dataclass(kw_only=True, eq=False, repr=False)``) and checks them in
    ``check_options``, and its constructor still names every option, so the registry can refuse
    unknown ones. On construction ``labels`` becomes an int64 tensor and ``rank``/``world_size``
    are resolved.
    """

    labels: LabelsLike
    batch_size: int
    seed: int = 0
    rank: int | None = None
    world_size: int | None = None

    needs_embeddings: ClassVar[bool] = False

    def __post_init__(self) -> None:
        self.labels = as_labels(self.labels)
        self.batch_size = check_positive_int("batch_size", self.batch_size)
        self.seed = check_seed(self.seed)
        self.rank, self.world_size = resolve_process_group(self.rank, self.world_size)
        self.epoch = 0
        self.class_ids, self.class_index, self.class_sizes = torch.unique(
            self.labels, sorted=True, return_inverse=True, return_counts=True
        )
        self.class_starts = torch.cumsum(self.class_sizes, 0) - self.class_sizes
        if self.batch_size > self.labels.numel():
            raise UserInputError(
                f"batch_size={self.batch_size} is larger than the training set ({self.labels.numel()} images)"
            )
        self.check_options()
        self.check_enough_batches()

    def check_options(self) -> None:
        """Check the subclass's own options and derive what ``num_global_batches`` needs; an override
        calls ``super().check_options()`` first."""

    @property
    def num_samples(self) -> int:
        return int(self.labels.numel())

    @property
    def num_classes(self) -> int:
        return int(self.class_ids.numel())

    def shuffled_by_class(self, generator: torch.Generator) -> Tensor:
        """All dataset indices grouped by class (class ``k`` at ``class_starts[k]``, in ascending
        label order), in a fresh random order within each class."""
        shuffled = torch.randperm(self.num_samples, generator=generator)
        return shuffled[torch.argsort(self.class_index[shuffled], stable=True)]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose batches the next ``iter(self)`` yields."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise UserInputError(f"epoch must be an integer >= 0, got {epoch!r}")
        self.epoch = epoch

    def epoch_generator(self) -> torch.Generator:
        """The generator of the current epoch's global batch sequence (the same on every rank)."""
        return derived_generator(self.seed, self.epoch)

    def num_global_batches(self) -> int:
        """Batches per epoch summed over all ranks (before sharding)."""
        raise NotImplementedError

    def __len__(self) -> int:
        return self.num_global_batches()

    def check_enough_batches(self) -> None:
        """The global batch splits evenly over the ranks, and an epoch has at least one batch."""
        if self.batch_size % self.world_size:
            raise UserInputError(
                f"batch_size={self.batch_size} cannot be split evenly over world_size={self.world_size} "
                f"processes: use a batch size divisible by {self.world_size} or fewer processes"
            )
        total = self.num_global_batches()
        if total < 1:
            raise UserInputError(
                f"{type(self).__name__} makes no batch per epoch from {self.num_samples} images "
                f"with batch_size={self.batch_size}"
            )

    def shard(self, batch: Tensor) -> Tensor:
        """This rank's contiguous slice of a global batch."""
        per_rank = self.batch_size // self.world_size
        return batch[self.rank * per_rank : (self.rank + 1) * per_rank]


class LabelSampler(BatchSampler):
    """A sampler that decides a whole epoch from the labels alone; subclasses build the epoch."""

    def epoch_batches(self, generator: torch.Generator) -> Tensor:
        """All global batches of one epoch as an int64 tensor ``[num_global_batches, batch_size]``."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.epoch_batches(self.epoch_generator()):
            yield self.shard(batch).tolist()


def build(name: str, /, **kwargs: Any) -> BatchSampler:
    """Build sampler ``name`` with ``labels=``, ``batch_size=``, ``seed=`` and its own options."""
    return SAMPLERS.build(name, **kwargs)
