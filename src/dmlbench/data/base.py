"""The in-memory image dataset every data source produces, and the dataset registry: each name's
constructor (``DATASETS``) and what the commands need to know of it (``DatasetSource``: how it is read,
whether ``data.root`` reaches it, how ``data fetch`` downloads it, its terms), registered together by
``register_dataset``."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from dmlbench.errors import UserInputError
from dmlbench.registry import Registry

DATASETS: Registry[ImageDataset] = Registry("dataset")


@dataclass(frozen=True)
class DatasetSource:
    """What a dataset's name stands for besides its constructor.

    ``kind``: ``memory`` (made in memory, no root: glyphs, a plugin's dataset), ``rooted`` (decoded into
    memory from files under ``data.root``, which reaches the constructor as its ``root`` option: emoji) or
    ``files`` (read image by image from ``data.root``; the image size, augmentation, seed and cache folder
    are ``data``'s own settings and reach the reader from there: CUB, Cars, SOP, In-shop, folder, CSV).
    ``fetch``: how ``data fetch`` downloads it (``archives``: the pinned files of ``data.sources``;
    ``npm``: the emoji packages; ``None``: it is not fetched). ``terms``: its terms of use, as printed."""

    kind: Literal["memory", "rooted", "files"] = "memory"
    fetch: Literal["archives", "npm"] | None = None
    terms: str = ""

    @property
    def takes_root(self) -> bool:
        return self.kind != "memory"


MEMORY = DatasetSource()
_SOURCES: dict[str, DatasetSource] = {}


def register_dataset(name: str, source: DatasetSource = MEMORY, *aliases: str) -> Callable[[Callable[..., ImageDataset]], Callable[..., ImageDataset]]:
    """Register a dataset's constructor under ``name`` (and ``aliases``, in ``DATASETS``) with its ``source``:
    one decorator, so that a new dataset is its own module."""
    def decorator(constructor: Callable[..., ImageDataset]) -> Callable[..., ImageDataset]:
        DATASETS.register(name, *aliases)(constructor)
        _SOURCES.update(dict.fromkeys((name, *aliases), source))
        return constructor

    return decorator


def dataset_source(name: str) -> DatasetSource:
    """``name``'s ``DatasetSource``; one registered with ``DATASETS.register`` alone (a plugin's) is ``memory``."""
    return _SOURCES.get(name, MEMORY)


def rooted_datasets() -> list[str]:
    """The registered datasets ``data.root`` (``--root``) reaches, for the message that lists them."""
    return [name for name in DATASETS.names() if dataset_source(name).takes_root]

IndexLike = Sequence[int] | np.ndarray | Tensor


def build(name: str, /, **options: Any) -> ImageDataset:
    """Build dataset ``name``; an option it does not take is a ``UserInputError`` naming it."""
    return DATASETS.build(name, **options)


def content_hash(images: Tensor, labels: Tensor, domains: np.ndarray | None = None) -> str:
    """sha256 over the shapes, then the raw bytes of ``images`` (uint8) and ``labels`` (little-endian int64),
    then, for a dataset whose images carry a domain, the domains (one name per line).

    The shapes go first so that two datasets with equal bytes but different image sizes differ. A
    dataset without domains hashes exactly as before domains existed.
    """
    digest = hashlib.sha256()
    digest.update(f"{tuple(images.shape)}|{tuple(labels.shape)}|".encode())
    digest.update(images.contiguous().numpy().tobytes())
    digest.update(labels.numpy().astype("<i8", copy=False).tobytes())
    if domains is not None:
        digest.update(("|domains|" + "\n".join(str(domain) for domain in domains)).encode())
    return digest.hexdigest()


def check_domains(domains: Sequence[str] | np.ndarray | None, count: int, name: str) -> np.ndarray | None:
    """``domains`` as a 1-D array of ``count`` non-empty strings (``None`` stays ``None``)."""
    if domains is None:
        return None
    array = np.asarray(domains)
    if array.shape != (count,) or (count and array.dtype.kind != "U"):
        raise UserInputError(f"domains of dataset {name!r} must be {count} strings, one per image, got shape {array.shape}")
    if count and not all(array):
        raise UserInputError(f"domains of dataset {name!r} must not be empty strings")
    return array


def as_index_tensor(indices: IndexLike, size: int, what: str = "indices") -> Tensor:
    """``indices`` as a 1-D int64 tensor, each in ``[0, size)``."""
    try:
        index = indices if isinstance(indices, Tensor) else torch.as_tensor(np.asarray(indices))
    except (TypeError, ValueError):
        raise UserInputError(f"{what} must be a 1-D array of integers, got {type(indices).__name__}") from None
    integer = not (index.dtype == torch.bool or index.dtype.is_floating_point or index.dtype.is_complex)
    if index.ndim != 1 or (index.numel() and not integer):
        raise UserInputError(f"{what} must be a 1-D array of integers, got dtype {index.dtype} and shape {tuple(index.shape)}")
    index = index.to(torch.int64)
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= size):
        raise UserInputError(f"{what} must lie in [0, {size}), got range [{int(index.min())}, {int(index.max())}]")
    return index


class ImageDataset(Dataset[tuple[Tensor, int, int]]):
    """Images held in memory as uint8 ``[N, C, H, W]`` with int64 class ids ``[N]``.

    ``dataset[i]`` is ``(image, label, i)``: the image as float in ``[0, 1]`` (then normalised with
    ``mean``/``std`` per channel when given), the original class id, and ``i`` itself so that samplers
    with a memory bank can update by index. ``metadata`` records where the data came from;
    ``source_indices`` is ``None`` for a root dataset and, for a ``subset``, the root positions of its items.
    ``domains`` (optional, one string per image, e.g. the vendor that drew it) says where each image
    comes from; cross-domain evaluation answers each query from the other domains only.
    """

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        class_names: Sequence[str],
        *,
        name: str,
        content_hash: str | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        metadata: dict[str, Any] | None = None,
        source_indices: Tensor | None = None,
        domains: Sequence[str] | np.ndarray | None = None,
    ) -> None:
        if not isinstance(images, Tensor) or images.dtype != torch.uint8 or images.ndim != 4:
            raise UserInputError(f"images of dataset {name!r} must be a uint8 tensor [N, C, H, W]")
        if not isinstance(labels, Tensor) or labels.dtype != torch.int64 or labels.shape != images.shape[:1]:
            raise UserInputError(
                f"labels of dataset {name!r} must be an int64 tensor [{images.shape[0]}], got "
                f"{getattr(labels, 'dtype', type(labels).__name__)} {tuple(getattr(labels, 'shape', ()))}"
            )
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= len(class_names)):
            raise UserInputError(
                f"labels of dataset {name!r} must index its {len(class_names)} class_names, got range "
                f"[{int(labels.min())}, {int(labels.max())}]"
            )
        self.images = images
        self.labels = labels
        self.class_names = list(class_names)
        self.name = name
        self.metadata = dict(metadata or {})
        self.source_indices = source_indices
        self.domains = check_domains(domains, int(labels.shape[0]), name)
        self._content_hash = content_hash
        self.augmentation, self.augmentation_seed = "none", 0
        self.mean, self.std = _check_normalization(mean, std, images.shape[1])
        self._mean_tensor = None if self.mean is None else torch.tensor(self.mean).view(-1, 1, 1)
        self._std_tensor = None if self.std is None else torch.tensor(self.std).view(-1, 1, 1)

    @property
    def content_hash(self) -> str:
        """sha256 of this dataset's images and labels (see ``content_hash``), computed once."""
        if self._content_hash is None:
            self._content_hash = content_hash(self.images, self.labels, self.domains)
        return self._content_hash

    def images_per_domain(self) -> dict[str, int] | None:
        """How many images each domain holds (``None`` for a dataset without domains)."""
        if self.domains is None:
            return None
        names, counts = np.unique(self.domains, return_counts=True)
        return {str(name): int(count) for name, count in zip(names, counts)}

    def licences(self) -> dict[str, str] | None:
        """The licences the dataset's reader states for its parts (emoji: per vendor), ``None`` when it states none."""
        source = self.metadata.get("source_report")
        found = source.get("licences") if isinstance(source, dict) else None
        return dict(found) if isinstance(found, dict) and found else None

    @property
    def num_channels(self) -> int:
        return int(self.images.shape[1])

    @property
    def image_size(self) -> tuple[int, int]:
        return int(self.images.shape[2]), int(self.images.shape[3])

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def __getitem__(self, index: int) -> tuple[Tensor, int, int]:
        index = int(index)
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} is out of range for dataset {self.name!r} of {len(self)} items")
        index %= len(self)
        return self._to_float(self.images[index]), int(self.labels[index]), index

    def batch(self, indices: IndexLike, *, epoch: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Several items at once, stacked: ``(images [B, C, H, W], labels [B], indices [B])``.

        With ``epoch`` and an augmentation (``with_augmentation``), each image is a training view:
        the preset applied to the image enlarged to ``transforms.base_size`` and seeded per item
        from ``(seed, epoch, root index)``; without, the images as stored.
        """
        index = as_index_tensor(indices, len(self))
        images = self.images[index]
        if epoch is not None and self.augmentation != "none" and len(index):
            images = self._augmented(images, index, epoch)
        return self._to_float(images), self.labels[index], index

    def with_augmentation(self, augmentation: str, seed: int) -> ImageDataset:
        """The same data (shared) whose training batches (``batch(..., epoch=e)``) use ``augmentation``."""
        from dmlbench.data import transforms

        view = ImageDataset(
            self.images, self.labels, self.class_names, name=self.name, content_hash=self._content_hash,
            mean=self.mean, std=self.std, metadata=self.metadata, source_indices=self.source_indices,
            domains=self.domains,
        )
        view.augmentation, view.augmentation_seed = transforms.check_augmentation(augmentation), int(seed)
        return view

    def _augmented(self, images: Tensor, index: Tensor, epoch: int) -> Tensor:
        from torchvision.transforms.v2 import functional as F

        from dmlbench.data import transforms

        # Training views keep the stored size (``big`` then equals ``base``): evaluation uses the stored images.
        size = images.shape[-1]
        base = transforms.base_size(size)
        enlarged = F.resize(images, [base, base], antialias=True)
        roots = index if self.source_indices is None else self.source_indices[index]
        views = [
            transforms.augment(image, self.augmentation, size,
                               transforms.item_generator(self.augmentation_seed, epoch, int(root)))
            for image, root in zip(enlarged, roots.tolist())
        ]
        return torch.stack(views)

    def subset(self, indices: IndexLike) -> ImageDataset:
        """The items at ``indices`` (in that order) as a dataset with the same interface and class ids.

        Its items are indexed ``0 .. len(indices)-1``; ``source_indices`` maps them back to the root dataset.
        """
        index = as_index_tensor(indices, len(self))
        source = index if self.source_indices is None else self.source_indices[index]
        subset = ImageDataset(
            self.images[index], self.labels[index], self.class_names, name=self.name,
            mean=self.mean, std=self.std, metadata=self.metadata, source_indices=source,
            domains=None if self.domains is None else self.domains[index.numpy()],
        )
        subset.augmentation, subset.augmentation_seed = self.augmentation, self.augmentation_seed
        return subset

    @property
    def held_device(self) -> torch.device:
        """The device holding the uint8 images (a GPU after ``on_device``; the host otherwise)."""
        return self.images.device

    def held_bytes(self) -> int:
        """The bytes ``on_device`` holds: the uint8 images."""
        return self.images.numel()

    def on_device(self, device: torch.device) -> ImageDataset:
        """The same items with the uint8 images held on ``device`` (a GPU): batches are gathered and
        turned into floats there, with no copy from the host per step; the values are the same."""
        view = ImageDataset(
            self.images.to(device), self.labels, self.class_names, name=self.name, content_hash=self.content_hash,
            mean=self.mean, std=self.std, metadata=self.metadata, source_indices=self.source_indices,
            domains=self.domains,
        )
        view.augmentation, view.augmentation_seed = self.augmentation, self.augmentation_seed
        return view

    def with_normalization(self, mean: Sequence[float] | None, std: Sequence[float] | None) -> ImageDataset:
        """The same data (shared, not copied) returned as ``(image - mean) / std`` per channel."""
        view = ImageDataset(
            self.images, self.labels, self.class_names, name=self.name, content_hash=self._content_hash,
            mean=mean, std=std, metadata=self.metadata, source_indices=self.source_indices,
            domains=self.domains,
        )
        view.augmentation, view.augmentation_seed = self.augmentation, self.augmentation_seed
        return view

    def pixel_statistics(self) -> tuple[list[float], list[float]]:
        """Per-channel mean and standard deviation of the pixels in ``[0, 1]`` (for ``with_normalization``).

        Compute them on the training split only, so that no statistic of held-out data leaks in.
        """
        if len(self) == 0:
            raise UserInputError(f"dataset {self.name!r} is empty; it has no pixel statistics")
        counts = torch.zeros(self.num_channels, dtype=torch.float64)
        sums = torch.zeros_like(counts)
        squares = torch.zeros_like(counts)
        # Chunks keep the float copy small; float64 sums keep the variance exact enough.
        for chunk in self.images.split(4096):
            values = chunk.to(torch.float64) / 255.0
            counts += values[:, 0].numel()
            sums += values.sum(dim=(0, 2, 3))
            squares += (values * values).sum(dim=(0, 2, 3))
        mean = sums / counts
        std = (squares / counts - mean * mean).clamp_min(0.0).sqrt()
        return mean.tolist(), std.tolist()

    def _to_float(self, images: Tensor) -> Tensor:
        values = images.to(torch.float32) / 255.0
        if self._mean_tensor is not None:
            values = (values - self._mean_tensor.to(values.device)) / self._std_tensor.to(values.device)
        return values

    def __repr__(self) -> str:
        channels, (height, width) = self.num_channels, self.image_size
        return (
            f"ImageDataset(name={self.name!r}, items={len(self)}, classes={len(self.class_names)}, "
            f"shape=[{channels}, {height}, {width}])"
        )


def _check_normalization(
    mean: Sequence[float] | None, std: Sequence[float] | None, channels: int
) -> tuple[list[float] | None, list[float] | None]:
    if mean is None and std is None:
        return None, None
    if mean is None or std is None:
        raise UserInputError("mean and std must be given together")
    mean_values, std_values = [float(value) for value in mean], [float(value) for value in std]
    if len(mean_values) != channels or len(std_values) != channels:
        raise UserInputError(f"mean and std need one value per channel ({channels}), got {len(mean_values)} and {len(std_values)}")
    if not all(math.isfinite(value) for value in mean_values):
        raise UserInputError(f"mean must be finite, got {mean_values}")
    if not all(math.isfinite(value) and value > 0 for value in std_values):
        raise UserInputError(f"std must be finite and > 0, got {std_values}")
    return mean_values, std_values
