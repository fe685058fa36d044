"""Augmentation presets: per-item seeding from (seed, epoch, root index), shapes, and the exact crops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torchvision.transforms.v2 import functional as F

import replicas
from cli_runner import run_cli
from dmlbench import data
from dmlbench.data import transforms
from dmlbench.data.base import ImageDataset

PRESETS = [name for name in transforms.AUGMENTATIONS if name != "none"]


@pytest.fixture(scope="module")
def folder_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return replicas.folder(tmp_path_factory.mktemp("augment"), classes=2, per_class=4)


@pytest.mark.parametrize("preset", PRESETS)
def test_views_depend_only_on_seed_epoch_and_root_index(preset: str, folder_root: Path) -> None:
    dataset = data.build("folder", root=str(folder_root), image_size=16, augmentation=preset, seed=3)
    side = 18 if preset == "big" else 16  # big keeps the whole 18 x 18 base image (256/224 of 16)
    state = torch.get_rng_state()
    whole = dataset.batch([5, 2, 7], epoch=4)[0]
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is never drawn from
    assert whole.shape == (3, 3, side, side)
    # A subset (a DDP shard, the training view) sees the same images for the same root items.
    shard = dataset.subset([7, 5]).batch([1, 0], epoch=4)[0]
    assert torch.equal(shard[0], whole[0]) and torch.equal(shard[1], whole[2])
    # A fresh dataset (a resumed run) too; another epoch or seed gives other views.
    again = data.build("folder", root=str(folder_root), image_size=16, augmentation=preset, seed=3)
    assert torch.equal(again.batch([5, 2, 7], epoch=4)[0], whole)
    assert not torch.equal(dataset.batch([5, 2, 7], epoch=5)[0], whole)
    other_seed = data.build("folder", root=str(folder_root), image_size=16, augmentation=preset, seed=4)
    assert not torch.equal(other_seed.batch([5, 2, 7], epoch=4)[0], whole)
    # Without an epoch (evaluation) the view is the centre crop, whatever the preset.
    plain = data.build("folder", root=str(folder_root), image_size=16, augmentation="none")
    if preset != "big":
        assert torch.equal(dataset.batch([5])[0], plain.batch([5])[0])


def test_reduced_is_a_crop_of_the_base_image_maybe_flipped() -> None:
    base = torch.randint(0, 256, (3, 20, 20), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    for index in range(20):
        view = transforms.augment(base, "reduced", 16, transforms.item_generator(0, 0, index))
        windows = [base[:, top:top + 16, left:left + 16] for top in range(5) for left in range(5)]
        assert any(torch.equal(view, window) or torch.equal(view, F.horizontal_flip(window)) for window in windows)


def test_flip_happens_about_half_the_time() -> None:
    base = torch.arange(3 * 16 * 16, dtype=torch.int64).remainder(256).to(torch.uint8).view(3, 16, 16)
    flips = 0
    for index in range(400):
        view = transforms.augment(base, "reduced", 16, transforms.item_generator(1, 2, index))
        flips += int(not torch.equal(view, base))
    assert 160 < flips < 240


def test_random_resized_crop_box_respects_scale_and_ratio() -> None:
    for index in range(200):
        generator = transforms.item_generator(0, 1, index)
        top, left, height, width = transforms._random_resized_crop_box(64, 64, (0.08, 1.0), generator)
        assert 0 <= top and top + height <= 64 and 0 <= left and left + width <= 64
        assert 0.08 * 64 * 64 * 0.8 <= height * width <= 64 * 64
        assert 3 / 4 * 0.8 <= width / height <= 4 / 3 * 1.25


def test_in_memory_dataset_augments_training_batches_only() -> None:
    images = torch.randint(0, 256, (6, 1, 12, 12), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    dataset = ImageDataset(images, torch.arange(6) // 2, ["a", "b", "c"], name="tiny").with_augmentation("base", 0)
    assert torch.equal(dataset.batch([1])[0], images[1:2].float() / 255)  # evaluation: as stored
    trained = dataset.batch([1, 4], epoch=0)[0]
    assert trained.shape == (2, 1, 12, 12) and not torch.equal(trained[0], images[1].float() / 255)
    assert torch.equal(dataset.subset([4, 1]).batch([1, 0], epoch=0)[0], trained)


def test_unknown_preset_is_a_config_error() -> None:
    from dmlbench import config as config_module
    from dmlbench.errors import UserInputError

    with pytest.raises(UserInputError, match="config key 'data.augmentation'"):
        config_module.from_dict({}, ["data.augmentation=huge"])
    with pytest.raises(UserInputError, match="data.augmentation must be one of"):
        transforms.check_augmentation("huge")


def test_training_skips_unreadable_images_and_records_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = replicas.folder(tmp_path / "data", classes=8, per_class=3)
    broken = root / "class_1" / "1.png"
    broken.write_bytes(broken.read_bytes()[:40])
    config = Path(__file__).resolve().parents[1] / "configs" / "glyphs.yaml"
    with pytest.warns(UserWarning, match="skipping 1 unreadable training and validation images"):
        code, _, err = run_cli([
            "train", str(config), "--output", str(tmp_path / "run"), "-q", "data.name=folder", f"data.root={root}",
            "data.image_size=16", "data.validation_fraction=0.5", "data.augmentation=reality_check",
            "model.options={in_channels: 3, width: 4}", "model.embedding_dim=8", "training.epochs=1",
            "training.batch_size=4", "sampler.params={samples_per_class: 2}", "training.max_steps_per_epoch=2",
            "evaluation.metrics=[precision_at_1, map_at_r]",
        ], capsys)
    assert code == 0, err
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["unreadable_images"] == 1
    assert sum(record["split_sizes"].values()) == 23
