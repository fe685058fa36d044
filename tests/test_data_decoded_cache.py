"""The decoded-image cache: identical pixels to decoding, reused, never stale."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import replicas
import torch

from dmlbench import data
from dmlbench.errors import UserInputError


def test_cached_batches_equal_decoded_batches(tmp_path: Path) -> None:
    root = replicas.cub200(tmp_path / "data")
    plain = data.build("cub200", root=str(root), image_size=16, augmentation="base", seed=1)
    cached = data.build("cub200", root=str(root), image_size=16, augmentation="base", seed=1,
                        cache_dir=str(tmp_path / "cache"))
    index = [0, 5, 11, 3]
    assert torch.equal(cached.batch(index)[0], plain.batch(index)[0])
    assert torch.equal(cached.batch(index, epoch=2)[0], plain.batch(index, epoch=2)[0])
    assert torch.equal(cached.subset([11, 3]).batch([0, 1])[0], plain.batch([11, 3])[0])
    # One array per part: the items touched are development and test items.
    assert len(list((tmp_path / "cache").glob("decoded-*.npy"))) == 2


def test_cache_is_reused_and_never_stale(tmp_path: Path) -> None:
    root = replicas.folder(tmp_path / "data", classes=2, per_class=2)
    cache = tmp_path / "cache"
    first = data.build("folder", root=str(root), image_size=16, cache_dir=str(cache))
    reference = first.batch([0, 1, 2, 3])[0]
    first.batch([0])
    development = next(cache.glob("unreadable-*-development.json"))
    arrays = sorted(cache.glob("decoded-*.npy"))
    assert len(arrays) == 2  # class_0 is the development part, class_1 the test split
    array = arrays[0]
    stamp = array.stat().st_mtime_ns
    # Same data and size: the same file is read, not rewritten.
    again = data.build("folder", root=str(root), image_size=16, cache_dir=str(cache))
    assert torch.equal(again.batch([0, 1, 2, 3])[0], reference) and array.stat().st_mtime_ns == stamp
    assert development.is_file()
    # Another size: another cache file (development items only: only those were asked for).
    data.build("folder", root=str(root), image_size=24, cache_dir=str(cache)).batch([0])
    assert len(list(cache.glob("decoded-*.npy"))) == 3
    # A changed file (other size in bytes): the dataset's key changes, the new pixels are read.
    replicas.write_image(root / "class_0" / "0.png", 12345, size=(50, 20))
    changed = data.build("folder", root=str(root), image_size=16, cache_dir=str(cache))
    uncached = data.build("folder", root=str(root), image_size=16)
    assert torch.equal(changed.batch([0])[0], uncached.batch([0])[0])
    assert not torch.equal(changed.batch([0])[0], reference[:1])
    assert len(list(cache.glob("decoded-*.npy"))) == 4


def test_filling_the_cache_finds_unreadable_images(tmp_path: Path) -> None:
    root = replicas.folder(tmp_path / "data", classes=2, per_class=2)
    (root / "class_1" / "1.png").write_bytes(b"not an image")
    dataset = data.build("folder", root=str(root), image_size=16, cache_dir=str(tmp_path / "cache"))
    assert dataset.find_unreadable() == [3]
    assert data.build("folder", root=str(root), image_size=16, cache_dir=str(tmp_path / "cache")).find_unreadable() == [3]
    assert list((tmp_path / "cache").glob("unreadable-*.json"))


def test_a_training_view_never_decodes_a_test_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Musgrave et al. 2020 §3.3: the search stage opens no test class; neither scans nor caches may."""
    from dmlbench.data.files import _Shared

    root = replicas.folder(tmp_path / "data", classes=4, per_class=3)  # classes 0-1 develop, 2-3 test
    broken = sorted((root / "class_3").iterdir())[1]
    broken.write_bytes(b"not an image")
    decoded: list[int] = []
    original = _Shared.decode
    monkeypatch.setattr(_Shared, "decode", lambda self, position: decoded.append(position) or original(self, position))
    for cache_dir in (None, str(tmp_path / "cache")):
        decoded.clear()
        dataset = data.build("folder", root=str(root), image_size=16, cache_dir=cache_dir)
        development = np.flatnonzero(np.asarray(dataset.labels) < 2)
        view = dataset.subset(development)
        assert view.find_unreadable() == []
        view.batch(range(len(view)), epoch=1)
        assert sorted(set(decoded)) == development.tolist()
        assert dataset.find_unreadable() == [dataset.paths.index(broken)]  # the whole dataset: the test split decoded
        assert sorted(set(decoded)) == list(range(12))
    assert [path.name.rsplit("-", 1)[1] for path in sorted((tmp_path / "cache").glob("unreadable-*.json"))] == [
        "development.json", "test.json"]


def test_training_decodes_no_test_image_and_evaluation_skips_an_unreadable_one(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from dmlbench import config as config_module
    from dmlbench.data.files import _Shared
    from dmlbench.training.setup import make_splits, set_up_training

    root = replicas.folder(tmp_path / "data", classes=8, per_class=3)
    broken = sorted((root / "class_6").iterdir())[0]
    broken.write_bytes(b"broken")  # a test class (the second half)
    config = config_module.from_dict({}, [
        "data.name=folder", f"data.root={root}", "data.image_size=16", "data.validation_fraction=0.5",
        "model.options={in_channels: 3, width: 4}", "model.embedding_dim=8", "training.batch_size=4",
        "sampler.params={samples_per_class: 2}"])
    decoded: set[int] = set()
    original = _Shared.decode
    monkeypatch.setattr(_Shared, "decode", lambda self, position: decoded.add(position) or original(self, position))
    setup = set_up_training(config, torch.device("cpu"))
    test = set(setup.full_splits.test.tolist())
    assert len(test) == 12 and not decoded & test  # the test split as declared, never opened
    assert setup.dataset.metadata.get("unreadable_items", []) == []
    dataset = data.build("folder", root=str(root), image_size=16)
    with pytest.warns(UserWarning, match="skipping 1 unreadable test images"):
        splits = make_splits(config, dataset)
    assert len(splits.test) == 11 and dataset.metadata["unreadable_items"] == [dataset.paths.index(broken)]


@pytest.mark.parametrize("cached", [False, True], ids=["decoded-here", "from-the-cache"])
def test_a_file_dataset_held_on_a_device_gives_the_host_batches(tmp_path: Path, cached: bool) -> None:
    """``on_device`` (the GPU path of ``training.setup.held_on``) run on the CPU: the same views,
    augmented or not, from base images decoded once; a training subset holds its part only."""
    root = replicas.cub200(tmp_path / "data")
    cache = str(tmp_path / "cache") if cached else None
    dataset = data.build("cub200", root=str(root), image_size=16, augmentation="reality_check", seed=3, cache_dir=cache)
    development = [0, 5, 3]
    held = dataset.subset(development).on_device(torch.device("cpu"))
    assert held.held_device == torch.device("cpu") and torch.equal(held.source_indices, torch.tensor(development))
    for epoch in (None, 1, 2):
        for expected, found in zip(dataset.subset(development).batch([2, 0, 1], epoch=epoch), held.batch([2, 0, 1], epoch=epoch)):
            assert torch.equal(expected, found)
    assert torch.equal(held.subset([1]).batch([0], epoch=1)[0], dataset.batch([5], epoch=1)[0])
    assert list(held._shared._held) == [(0, "cpu")]  # the development part, never the test split
    assert held.batch([], epoch=1)[0].shape == (0, 3, 16, 16)


def test_a_held_file_dataset_refuses_an_unreadable_image_in_one_line(tmp_path: Path) -> None:
    root = replicas.folder(tmp_path / "data", classes=2, per_class=2)
    (root / "class_0" / "1.png").write_bytes(b"not an image")
    held = data.build("folder", root=str(root), image_size=16).on_device(torch.device("cpu"))
    assert held.batch([0])[0].shape == (1, 3, 16, 16)
    with pytest.raises(UserInputError, match=r"unreadable image .*class_0/1\.png"):
        held.batch([1])
