"""ImageDataset, content hashing and the dataset registry."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from dmlbench import data
from dmlbench.data.base import ImageDataset, content_hash
from dmlbench.errors import UserInputError


def make_dataset(count: int = 10, channels: int = 2, size: int = 4, classes: int = 3, seed: int = 0) -> ImageDataset:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (count, channels, size, size), generator=generator, dtype=torch.uint8)
    labels = torch.arange(count, dtype=torch.int64) % classes
    return ImageDataset(images, labels, [f"class {i}" for i in range(classes)], name="toy")


def test_item_is_scaled_image_label_and_index() -> None:
    dataset = make_dataset()
    for index in (0, 7, -1):
        image, label, returned_index = dataset[index]
        position = index % len(dataset)
        assert image.dtype == torch.float32
        assert torch.equal(image, dataset.images[position].float() / 255.0)
        assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0
        assert label == int(dataset.labels[position]) and isinstance(label, int)
        assert returned_index == position
    with pytest.raises(IndexError):
        dataset[len(dataset)]


def test_normalization_is_per_channel_and_shares_storage() -> None:
    dataset = make_dataset()
    normalized = dataset.with_normalization([0.5, 0.25], [0.2, 0.4])
    assert normalized.images is dataset.images
    image, _, _ = normalized[3]
    raw = dataset.images[3].double() / 255.0
    for channel, (mean, std) in enumerate(([0.5, 0.2], [0.25, 0.4])):
        for row in range(raw.shape[1]):
            for column in range(raw.shape[2]):
                expected = (raw[channel, row, column] - mean) / std
                assert image[channel, row, column].item() == pytest.approx(expected.item(), abs=1e-6)
    assert normalized.content_hash == dataset.content_hash


def test_pixel_statistics_match_a_float64_reference() -> None:
    dataset = make_dataset(count=17)
    mean, std = dataset.pixel_statistics()
    values = dataset.images.numpy().astype(np.float64) / 255.0
    for channel in range(dataset.num_channels):
        pixels = values[:, channel].ravel()
        assert mean[channel] == pytest.approx(pixels.mean(), abs=1e-12)
        assert std[channel] == pytest.approx(pixels.std(), abs=1e-9)


def test_batch_equals_stacked_items() -> None:
    dataset = make_dataset().with_normalization([0.1, 0.2], [0.3, 0.4])
    indices = [4, 0, 9, 4]
    images, labels, returned = dataset.batch(np.array(indices))
    for row, index in enumerate(indices):
        image, label, item_index = dataset[index]
        assert torch.equal(images[row], image)
        assert int(labels[row]) == label and int(returned[row]) == item_index


def test_subset_keeps_interface_class_ids_and_maps_back_to_the_root() -> None:
    dataset = make_dataset(count=12).with_normalization([0.5, 0.5], [0.5, 0.5])
    first = dataset.subset(np.array([10, 2, 5, 7]))
    second = first.subset(torch.tensor([3, 0]))
    assert len(first) == 4 and len(second) == 2
    assert second.class_names == dataset.class_names
    assert second.source_indices.tolist() == [7, 10]
    for local, root in enumerate(second.source_indices.tolist()):
        image, label, index = second[local]
        root_image, root_label, _ = dataset[root]
        assert torch.equal(image, root_image) and label == root_label and index == local
    assert second.content_hash == content_hash(dataset.images[[7, 10]], dataset.labels[[7, 10]])
    assert first.mean == dataset.mean


def test_dataloader_collates_items() -> None:
    dataset = make_dataset(count=9)
    images, labels, indices = next(iter(DataLoader(dataset, batch_size=4)))
    assert images.shape == (4, 2, 4, 4) and labels.dtype == torch.int64
    assert indices.tolist() == [0, 1, 2, 3]


def test_content_hash_sees_every_pixel_label_and_the_shape() -> None:
    dataset = make_dataset()
    reference = content_hash(dataset.images, dataset.labels)
    assert reference == dataset.content_hash and len(reference) == 64
    changed = dataset.images.clone()
    changed[9, 1, 3, 3] ^= 1
    assert content_hash(changed, dataset.labels) != reference
    relabelled = dataset.labels.clone()
    relabelled[0] = 2
    assert content_hash(dataset.images, relabelled) != reference
    # The same bytes in another shape are another dataset.
    reshaped = dataset.images.reshape(10, 2, 2, 8)
    assert content_hash(reshaped, dataset.labels) != reference


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda images, labels: (images.float(), labels), "uint8"),
        (lambda images, labels: (images[0], labels), "uint8"),
        (lambda images, labels: (images, labels[:-1]), "labels"),
        (lambda images, labels: (images, labels.int()), "int64"),
        (lambda images, labels: (images, labels + 5), "class_names"),
        (lambda images, labels: (images, labels - 1), "class_names"),
    ],
)
def test_bad_arrays_are_user_errors(change, message: str) -> None:
    dataset = make_dataset()
    images, labels = change(dataset.images, dataset.labels)
    with pytest.raises(UserInputError, match=message):
        ImageDataset(images, labels, dataset.class_names, name="toy")


@pytest.mark.parametrize(
    ("mean", "std", "message"),
    [([0.5, 0.5], None, "together"), ([0.5], [0.5], "per channel"), ([0.5, 0.5], [0.5, 0.0], "std"),
     ([float("nan"), 0.5], [0.5, 0.5], "mean")],
)
def test_bad_normalization_is_a_user_error(mean, std, message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        make_dataset().with_normalization(mean, std)


@pytest.mark.parametrize(
    "indices", [[0, 10], [-1], np.array([True, False] * 5), np.zeros((2, 2), dtype=int), [0.5], ["a"], [[0], [1, 2]]]
)
def test_bad_subset_indices_are_user_errors(indices) -> None:
    with pytest.raises(UserInputError, match="indices"):
        make_dataset().subset(indices)


def test_registry_rejects_unknown_names_and_options() -> None:
    assert "glyphs" in data.DATASETS
    with pytest.raises(UserInputError, match="glyps"):
        data.build("glyps")
    with pytest.raises(UserInputError, match="image_sise"):
        data.build("glyphs", image_sise=32)
