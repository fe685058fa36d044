"""``FileDataset``: images decoded from files on demand, with the interface of ``ImageDataset``.

A format reader (``data/formats.py``) lists the files, their classes, the split the dataset
declares (train/test) and, where it has them, the query/gallery roles of its test items. Decoding
uses Pillow in a small thread pool (JPEG decoding releases the GIL). An optional on-disk cache holds
the decoded base images (``transforms.base_size``) as one memory-mapped uint8 array per part
(development items, test split), so that training alone never decodes a test image. On a GPU
(``FileDataset.on_device``) the parts a dataset touches are decoded once, or read from that cache,
and held there as uint8, so the training views are cut there with no host copy per step.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from dmlbench.data import transforms
from dmlbench.data.base import IndexLike, as_index_tensor
from dmlbench.data.splits import train_test_split
from dmlbench.errors import UserInputError
from dmlbench.files import atomic_write

DEVELOPMENT, TEST = 0, 1  # the two parts of a dataset, scanned and cached apart
PART_NAMES = ("development", "test")


def eight_bits(image: Any) -> Any:
    """A PIL image with 8 bits per channel, as ``convert("RGB")`` / ``("L")`` then read it: a 16-bit grey image
    (PIL's ``I;16`` modes, and ``I`` holding 16-bit values) keeps its high byte, as PIL reads 16-bit colour
    PNGs; converted as it is, it would clip to white. Any other image is returned as it is."""
    if not (image.mode.startswith("I;16") or image.mode == "I"):
        return image
    from PIL import Image

    values = np.asarray(image, dtype=np.int64)
    return Image.fromarray((np.clip(values, 0, 65535) >> 8).astype(np.uint8), mode="L")


class UnreadableImage(Exception):
    """An image file that is missing, truncated or not an image."""


class FileDataset(Dataset[tuple[Tensor, int, int]]):
    """Images stored as files under ``root`` (``paths`` relative to it) with int64 class ids.

    ``test`` (bool per item) is the train/test split the dataset declares (``None``: none declared,
    the first-half-of-classes rule applies); ``roles`` holds ``'query'``/``'gallery'`` for test
    items evaluated query-against-gallery and ``''`` elsewhere (``None``: all-vs-all). ``batch``
    returns float images in ``[0, 1]`` of side ``transforms.output_size(image_size, augmentation)``:
    the evaluation view, or with ``epoch`` given the ``augmentation`` preset seeded per item from
    ``(seed, epoch, root index)``. ``subset`` shares the file list and the cache.
    """

    # No file format here records where an image comes from (see ``ImageDataset.domains``).
    domains: np.ndarray | None = None
    # The device holding the base images, where the views are cut (``on_device``); None: the host path.
    held_device: torch.device | None = None

    def __init__(
        self,
        root: Path,
        paths: Sequence[str],
        labels: Tensor,
        class_names: Sequence[str],
        *,
        name: str,
        test: np.ndarray | None = None,
        roles: np.ndarray | None = None,
        image_size: int = 224,
        augmentation: str = "none",
        seed: int = 0,
        cache_dir: str | os.PathLike[str] | None = None,
        workers: int = 4,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 8:
            raise UserInputError(f"data.image_size must be an integer >= 8, got {image_size!r}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise UserInputError(f"workers must be an integer >= 1, got {workers!r}")
        self._shared = _Shared(
            name=name, root=Path(root), paths=list(paths), root_labels=labels.numpy(), test=test, roles=roles,
            image_size=image_size,
            augmentation=transforms.check_augmentation(augmentation), seed=int(seed), workers=workers,
            cache_dir=None if cache_dir is None else Path(cache_dir).expanduser(),
        )
        self._positions = np.arange(len(paths), dtype=np.int64)
        self.labels = labels
        self.class_names = list(class_names)
        self.name = name
        self.metadata = dict(metadata or {})
        self.source_indices: Tensor | None = None

    # --- what the dataset declares -------------------------------------------------------------
    @property
    def test(self) -> np.ndarray | None:
        """Per item: ``True`` for the declared test split (``None``: no split declared)."""
        return None if self._shared.test is None else self._shared.test[self._positions]

    @property
    def roles(self) -> np.ndarray | None:
        """Per item: ``'query'``, ``'gallery'`` or ``''`` (``None``: the dataset has no roles)."""
        return None if self._shared.roles is None else self._shared.roles[self._positions]

    @property
    def paths(self) -> list[Path]:
        return [self._shared.root / self._shared.paths[position] for position in self._positions]

    @property
    def content_hash(self) -> str:
        """sha256 over the format name, the image size, and per file its relative path, label,
        declared split, role and size in bytes. File bytes are not read (120k JPEGs would take
        minutes); a file edited in place without changing its size is not detected."""
        return self._shared.content_hash()

    @property
    def num_channels(self) -> int:
        return 3

    @property
    def image_size(self) -> tuple[int, int]:
        side = transforms.output_size(self._shared.image_size, self._shared.augmentation)
        return side, side

    def images_per_domain(self) -> None:
        """``None``: no domains (``ImageDataset.images_per_domain``, which a benchmark records)."""
        return None

    def licences(self) -> None:
        """``None``: the file readers state no licence (``data fetch`` records the terms beside the data)."""
        return None

    def __len__(self) -> int:
        return len(self._positions)

    def __getitem__(self, index: int) -> tuple[Tensor, int, int]:
        index = int(index)
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} is out of range for dataset {self.name!r} of {len(self)} items")
        index %= len(self)
        images, _, _ = self.batch([index])
        return images[0], int(self.labels[index]), index

    def batch(self, indices: IndexLike, *, epoch: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``(images [B, 3, S, S] float in [0, 1], labels [B], indices [B])``; with ``epoch`` the
        training augmentation of that epoch. An unreadable image is a ``UserInputError`` naming it
        (training drops unreadable items before it starts, see ``find_unreadable``)."""
        index = as_index_tensor(indices, len(self))
        shared = self._shared
        positions = self._positions[index.numpy()]
        size = self.image_size[0]
        held = self.held_device
        bases = shared.bases(positions) if held is None else shared.held_bases(positions, held)
        views = []
        for position, base in zip(positions.tolist(), bases):
            if epoch is None or shared.augmentation == "none":
                views.append(transforms.evaluation_view(base, size))
            else:
                generator = transforms.item_generator(shared.seed, epoch, position)
                views.append(transforms.augment(base, shared.augmentation, size, generator))
        images = torch.stack(views).to(torch.float32) / 255.0 if views else torch.empty(0, 3, size, size, device=held)
        return images, self.labels[index], index

    def on_device(self, device: torch.device) -> FileDataset:
        """The same items with the base images of the parts they touch held on ``device`` (a GPU) as
        uint8, decoded once (or read from the decoded-image cache): batches are cut and turned into
        floats there with the same random draws, so the views are those of the host path up to the
        device's own resampling arithmetic."""
        view = self.subset(range(len(self)))
        view.source_indices = self.source_indices
        view.held_device = torch.device(device)
        return view

    def held_bytes(self) -> int:
        """The bytes ``on_device`` holds: every base image of the parts this dataset's items touch."""
        shared = self._shared
        parts = np.unique(shared.parts()[self._positions]).tolist() if len(self) else []
        return sum(len(shared.part_positions(part)) for part in parts) * 3 * shared.base_size ** 2

    def subset(self, indices: IndexLike) -> FileDataset:
        """The items at ``indices`` (in that order); ``source_indices`` maps them to the root dataset."""
        index = as_index_tensor(indices, len(self))
        view = FileDataset.__new__(FileDataset)
        view._shared = self._shared
        view._positions = self._positions[index.numpy()]
        view.labels = self.labels[index]
        view.class_names = self.class_names
        view.name = self.name
        view.metadata = self.metadata
        view.source_indices = torch.from_numpy(view._positions.copy())
        view.held_device = self.held_device
        return view

    def find_unreadable(self) -> list[int]:
        """Items (indices into this dataset) whose file is missing, truncated or not an image.

        Decodes every image of the parts this dataset touches once (the development items, the test
        split, or both: a training view never decodes a test image); the answer is remembered in the
        cache directory (when there is one) under the content hash, and filling the decoded-image
        cache answers it for free.
        """
        bad_positions = self._shared.unreadable_positions(self._positions)
        return np.flatnonzero(np.isin(self._positions, bad_positions)).tolist()

    def __repr__(self) -> str:
        return (f"FileDataset(name={self.name!r}, items={len(self)}, classes={len(self.class_names)}, "
                f"root={str(self._shared.root)!r}, image_size={self.image_size[0]})")


class _Shared:
    """State shared by a root dataset and its subsets: the file list, the settings and the cache."""

    def __init__(self, *, name: str, root: Path, paths: list[str], root_labels: np.ndarray, test: np.ndarray | None,
                 roles: np.ndarray | None, image_size: int, augmentation: str, seed: int, workers: int,
                 cache_dir: Path | None) -> None:
        self.name, self.root, self.paths, self.root_labels = name, root, paths, root_labels
        self.test, self.roles = test, roles
        self.image_size, self.augmentation, self.seed, self.workers = image_size, augmentation, seed, workers
        self.base_size = transforms.base_size(transforms.output_size(image_size, augmentation))
        self.cache_dir = cache_dir
        self._content_hash: str | None = None
        self._sizes: dict[int, int] = {}
        self._parts: np.ndarray | None = None
        self._positions_of: dict[int, np.ndarray] = {}
        self._cache: dict[int, np.ndarray] = {}  # part -> memory-mapped base images
        self._unreadable: dict[int, np.ndarray] = {}  # part -> its unreadable positions
        self._pool: ThreadPoolExecutor | None = None
        self._held: dict[tuple[int, str], Tensor] = {}  # (part, device) -> its base images held there

    def content_hash(self) -> str:
        if self._content_hash is None:
            digest = hashlib.sha256(f"{self.name}|{self.image_size}|{self.augmentation == 'big'}|".encode())
            for position, relative in enumerate(self.paths):
                split = "" if self.test is None else ("test" if self.test[position] else "train")
                role = "" if self.roles is None else self.roles[position]
                line = f"{relative}\t{int(self.root_labels[position])}\t{split}\t{role}\t{self.file_size(position)}\n"
                digest.update(line.encode())
            self._content_hash = digest.hexdigest()
        return self._content_hash

    def file_size(self, position: int) -> int:
        if position not in self._sizes:
            try:
                self._sizes[position] = (self.root / self.paths[position]).stat().st_size
            except OSError:
                self._sizes[position] = -1
        return self._sizes[position]

    def decode(self, position: int) -> Tensor:
        """The base image of one file, uint8 ``[3, B, B]``; ``UnreadableImage`` if it cannot be decoded."""
        from PIL import Image, UnidentifiedImageError

        path = self.root / self.paths[position]
        try:
            with Image.open(path) as opened:
                # JPEG only: let libjpeg decode at a reduced scale that still covers the base size.
                opened.draft("RGB", (self.base_size, self.base_size))
                image = eight_bits(opened).convert("RGB")
                width, height = image.size
                scale = self.base_size / min(width, height)
                resized = image.resize(
                    (max(self.base_size, round(width * scale)), max(self.base_size, round(height * scale))),
                    Image.Resampling.BILINEAR,
                )
        except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as error:
            raise UnreadableImage(f"{path}: {error}") from None
        tensor = torch.from_numpy(np.asarray(resized).copy()).permute(2, 0, 1)
        return transforms.evaluation_view(tensor, self.base_size)

    def parts(self) -> np.ndarray:
        """Per position: ``DEVELOPMENT`` (train and validation) or ``TEST`` (the standard test split).

        Scans and caches work one part at a time, so that a run that only trains never decodes a
        test image (Musgrave et al. 2020 §3.3: the test classes are opened by the final stage only).
        """
        if self._parts is None:
            parts = np.full(len(self.paths), DEVELOPMENT, dtype=np.int64)
            if self.test is not None:
                parts[np.asarray(self.test, dtype=bool)] = TEST
            elif len(np.unique(self.root_labels)) >= 2:
                parts[train_test_split(self.root_labels)[1]] = TEST
            self._parts = parts
        return self._parts

    def part_positions(self, part: int) -> np.ndarray:
        """The positions of one part, sorted (the rows of its cached and held arrays)."""
        if part not in self._positions_of:
            self._positions_of[part] = np.flatnonzero(self.parts() == part).astype(np.int64)
        return self._positions_of[part]

    def bases(self, positions: np.ndarray) -> list[Tensor]:
        if self.cache_dir is not None:
            self._refuse_unreadable(positions)
            return [torch.from_numpy(np.array(self._open_cache(part)[row])) for part, row in self._part_rows(positions)]
        try:
            return list(self._map(self.decode, positions.tolist()))
        except UnreadableImage as error:
            raise UserInputError(f"unreadable image {error}") from None

    def held_bases(self, positions: np.ndarray, device: torch.device) -> list[Tensor]:
        """``bases`` from the parts held on ``device`` (``held_part``), as views of them there."""
        held = {part: self.held_part(part, device) for part in np.unique(self.parts()[positions]).tolist()}
        self._refuse_unreadable(positions)  # after holding: decoding a part here finds its unreadable files
        return [held[part][row] for part, row in self._part_rows(positions)]

    def _part_rows(self, positions: np.ndarray) -> list[tuple[int, int]]:
        """Per position, its part and its row in that part's cached or held array."""
        parts = self.parts()[positions]
        return [(part, int(np.searchsorted(self.part_positions(part), position)))
                for position, part in zip(positions.tolist(), parts.tolist())]

    def _refuse_unreadable(self, positions: np.ndarray) -> None:
        """A ``UserInputError`` naming the first unreadable file among ``positions``: a cached or held
        array holds zeros there, never to be handed out as an image."""
        bad = positions[np.isin(positions, self.unreadable_positions(positions))]
        if bad.size:
            raise UserInputError(f"unreadable image {self.root / self.paths[int(bad[0])]}")

    def held_part(self, part: int, device: torch.device) -> Tensor:
        """One part's base images on ``device``, uint8 ``[N, 3, B, B]`` in position order: the
        decoded-image cache's array when there is a cache, else decoded here once (its unreadable
        positions remembered as the cache would)."""
        key = (part, str(device))
        if key not in self._held:
            if self.cache_dir is not None:
                host = np.array(self._open_cache(part))
            else:
                positions = self.part_positions(part)
                host = np.zeros((len(positions), 3, self.base_size, self.base_size), dtype=np.uint8)
                self._unreadable[part] = np.asarray(self._decode_into(host, positions), dtype=np.int64)
            self._held[key] = torch.from_numpy(host).to(device)
        return self._held[key]

    def unreadable_positions(self, positions: np.ndarray) -> np.ndarray:
        """The unreadable positions of every part that ``positions`` touch (sorted)."""
        touched = np.unique(self.parts()[positions]).tolist() if len(positions) else []
        found = [self._unreadable_in(part) for part in touched]
        return np.sort(np.concatenate(found)) if found else np.empty(0, dtype=np.int64)

    def _unreadable_in(self, part: int) -> np.ndarray:
        if part in self._unreadable:
            return self._unreadable[part]
        record = None if self.cache_dir is None else self._record_path(part)
        if record is not None and record.is_file():
            try:
                self._unreadable[part] = np.asarray(json.loads(record.read_text())["positions"], dtype=np.int64)
                return self._unreadable[part]
            except (OSError, ValueError, KeyError):
                pass  # a damaged record is recomputed below
        if self.cache_dir is not None:
            self._open_cache(part)  # filling the cache finds the unreadable files
            return self._unreadable[part]

        def readable(position: int) -> bool:
            try:
                self.decode(position)
            except UnreadableImage:
                return False
            return True

        positions = self.part_positions(part)
        flags = np.asarray(list(self._map(readable, positions.tolist())), dtype=bool)
        self._unreadable[part] = positions[~flags] if len(positions) else positions
        return self._unreadable[part]

    def _record_path(self, part: int) -> Path:
        assert self.cache_dir is not None
        return self.cache_dir / f"unreadable-{self.content_hash()[:32]}-{PART_NAMES[part]}.json"

    def _open_cache(self, part: int) -> np.ndarray:
        """The memory-mapped cache of one part's base images (filled on first use), in position order."""
        assert self.cache_dir is not None
        if part in self._cache:
            return self._cache[part]
        # The key holds everything the cached pixels depend on: the file listing, the base size, the part and
        # the decoder's version (v3: 16-bit grey images keep their high byte instead of clipping to white).
        key = hashlib.sha256(f"{self.content_hash()}|{self.base_size}|{PART_NAMES[part]}|v3".encode()).hexdigest()[:32]
        array_path = self.cache_dir / f"decoded-{key}.npy"
        record_path = self._record_path(part)
        if not (array_path.is_file() and record_path.is_file()):
            self._fill_cache(part, array_path, record_path)
        self._cache[part] = np.load(array_path, mmap_mode="r")
        self._unreadable[part] = np.asarray(json.loads(record_path.read_text())["positions"], dtype=np.int64)
        return self._cache[part]

    def _fill_cache(self, part: int, array_path: Path, record_path: Path) -> None:
        try:
            array_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UserInputError(f"cannot create cache directory {array_path.parent}: {error.strerror or error}") from None
        positions = self.part_positions(part)
        shape = (len(positions), 3, self.base_size, self.base_size)
        temporary = array_path.with_name(f".{array_path.name}.{os.getpid()}.tmp")
        array = np.lib.format.open_memmap(temporary, mode="w+", dtype=np.uint8, shape=shape)
        bad = self._decode_into(array, positions)
        array.flush()
        del array
        os.replace(temporary, array_path)
        atomic_write(record_path, lambda stream: stream.write(json.dumps({"positions": bad}).encode()))

    def _decode_into(self, array: np.ndarray, positions: np.ndarray) -> list[int]:
        """Decode the base image of ``positions[row]`` into ``array[row]``; the unreadable positions, sorted."""
        bad: list[int] = []

        def store(row: int) -> None:
            try:
                array[row] = self.decode(int(positions[row])).numpy()
            except UnreadableImage:
                bad.append(int(positions[row]))  # list.append is atomic under the GIL

        for _ in self._map(store, range(len(positions))):
            pass
        return sorted(bad)

    def _map(self, function: Any, items: Any) -> Any:
        if self.workers == 1:
            return map(function, items)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="dmlbench-decode")
        return self._pool.map(function, items)
