"""The decoded-image cache: identical pixels to decoding, reused, never stale."""

from __future__ import annotations

from pathlib import Path

import torch

import replicas
from dmlbench import data


def test_cached_batches_equal_decoded_batches(tmp_path: Path) -> None:
    root = replicas.cub200(tmp_path / "data")
    plain = data.build("cub200", root=str(root), image_size=16, augmentation="base", seed=1)
    cached = data.build("cub200", root=str(root), image_size=16, augmentation="base", seed=1,
                        cache_dir=str(tmp_path / "cache"))
    index = [0, 5, 11, 3]
    assert torch.equal(cached.batch(index)[0], plain.batch(index)[0])
    assert torch.equal(cached.batch(index, epoch=2)[0], plain.batch(index, epoch=2)[0])
    assert torch.equal(cached.subset([11, 3]).batch([0, 1])[0], plain.batch([11, 3])[0])
    assert len(list((tmp_path / "cache").glob("decoded-*.npy"))) == 1


def test_cache_is_reused_and_never_stale(tmp_path: Path) -> None:
    root = replicas.folder(tmp_path / "data", classes=2, per_class=2)
    cache = tmp_path / "cache"
    first = data.build("folder", root=str(root), image_size=16, cache_dir=str(cache))
    reference = first.batch([0, 1, 2, 3])[0]
    (array,) = cache.glob("decoded-*.npy")
    stamp = array.stat().st_mtime_ns
    # Same data and size: the same file is read, not rewritten.
    again = data.build("folder", root=str(root), image_size=16, cache_dir=str(cache))
    assert torch.equal(again.batch([0, 1, 2, 3])[0], reference) and array.stat().st_mtime_ns == stamp
    # Another size: another cache file.
    data.build("folder", root=str(root), image_size=24, cache_dir=str(cache)).batch([0])
    assert len(list(cache.glob("decoded-*.npy"))) == 2
    # A changed file (other size in bytes): the dataset's key changes, the new pixels are read.
    replicas.write_image(root / "class_0" / "0.png", 12345, size=(50, 20))
    changed = data.build("folder", root=str(root), image_size=16, cache_dir=str(cache))
    uncached = data.build("folder", root=str(root), image_size=16)
    assert torch.equal(changed.batch([0])[0], uncached.batch([0])[0])
    assert not torch.equal(changed.batch([0])[0], reference[:1])
    assert len(list(cache.glob("decoded-*.npy"))) == 3


def test_filling_the_cache_finds_unreadable_images(tmp_path: Path) -> None:
    root = replicas.folder(tmp_path / "data", classes=2, per_class=2)
    (root / "class_1" / "1.png").write_bytes(b"not an image")
    dataset = data.build("folder", root=str(root), image_size=16, cache_dir=str(tmp_path / "cache"))
    assert dataset.find_unreadable() == [3]
    assert data.build("folder", root=str(root), image_size=16, cache_dir=str(tmp_path / "cache")).find_unreadable() == [3]
    assert list((tmp_path / "cache").glob("unreadable-*.json"))
