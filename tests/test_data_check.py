"""``dmlbench data check``: summaries, leakage counts and the raw-pixel difficulty reference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dmlbench import data
from dmlbench.data.base import ImageDataset
from dmlbench.data.check import format_summary, raw_pixel_precision_at_1, summarize
from dmlbench.errors import UserInputError


def planted_dataset() -> ImageDataset:
    """Six classes of three images, with known defects planted."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(1, 255, (18, 1, 5, 5), generator=generator, dtype=torch.uint8)
    labels = torch.arange(18) // 3
    images[4] = 0  # a blank image (class 1)
    images[10] = images[16]  # the same picture in class 3 and class 5
    images[2] = images[1]  # a duplicate within class 0: harmless
    return ImageDataset(images, labels, [f"c{i}" for i in range(7)], name="planted")


def test_summary_counts_planted_defects() -> None:
    dataset = planted_dataset()
    splits = {"train": np.arange(0, 9), "validation": np.arange(9, 12), "test": np.arange(12, 18)}
    # validation holds class 3; test holds classes 4 and 5; image 10 (class 3) equals image 16 (class 5).
    summary = summarize(dataset, splits, baseline_queries=0)
    assert summary["classes"] == 7 and summary["classes_without_images"] == 1
    assert summary["images_per_class"] == {"min": 3, "median": 3.0, "max": 3}
    assert summary["splits"]["train"] == {"images": 9, "classes": 3}
    assert summary["splits"]["test"] == {"images": 6, "classes": 2}
    assert summary["broken"] == {"constant_images": 1, "examples": [4]}
    assert summary["conflicting_duplicates"] == 2
    assert summary["leakage"]["shared_classes"] == {"train/validation": 0, "train/test": 0, "validation/test": 0}
    assert summary["leakage"]["duplicate_images"] == {"train/validation": 0, "train/test": 0, "validation/test": 1}
    assert summary["raw_pixel_precision_at_1"] is None
    assert len(summary["problems"]) == 4
    json.dumps(summary)


def test_shared_classes_between_splits_are_reported() -> None:
    dataset = planted_dataset()
    splits = {"train": np.arange(0, 12), "test": np.arange(8, 18)}
    summary = summarize(dataset, splits, baseline_queries=0)
    assert summary["leakage"]["shared_classes"] == {"train/test": 2}  # classes 2 and 3
    assert summary["leakage"]["duplicate_images"] == {"train/test": 5}  # items 8..11 and the copy 16
    assert "2 classes shared by train/test" in summary["problems"]
    assert "PROBLEMS" in format_summary(summary)


def test_default_splits_of_glyphs_are_clean(tmp_path: Path) -> None:
    dataset = data.build("glyphs", image_size=16, augmentations_per_font=1, max_classes=20, cache_dir=tmp_path)
    summary = summarize(dataset, validation_fraction=0.2, seed=0)
    splits = summary["splits"]
    assert splits["train"]["classes"] + splits["validation"]["classes"] + splits["test"]["classes"] == 20
    assert splits["validation"]["classes"] == 2 and splits["test"]["classes"] == 10
    assert sum(split["images"] for split in splits.values()) == len(dataset)
    assert summary["content_hash"] == dataset.content_hash
    assert summary["problems"] == []
    assert 0.0 < summary["raw_pixel_precision_at_1"]["value"] <= 1.0
    text = format_summary(summary)
    assert dataset.content_hash in text and "status         OK" in text
    assert "validation fraction 0.2, seed 0" in text


def reference_precision_at_1(vectors: np.ndarray, labels: np.ndarray, queries: list[int]) -> float:
    hits = 0
    for query in queries:
        best, best_distance = None, None
        for reference in range(len(vectors)):
            if reference == query:
                continue
            distance = sum((float(a) - float(b)) ** 2 for a, b in zip(vectors[query], vectors[reference]))
            if best_distance is None or distance < best_distance:
                best, best_distance = reference, distance
        hits += labels[best] == labels[query]
    return hits / len(queries)


@pytest.mark.parametrize("max_queries", [None, 7])
def test_raw_pixel_precision_matches_a_loop_reference_with_ties(max_queries: int | None) -> None:
    generator = torch.Generator().manual_seed(3)
    images = torch.randint(0, 4, (40, 1, 2, 2), generator=generator, dtype=torch.uint8) * 60  # many exact ties
    labels = torch.randint(0, 4, (40,), generator=generator)
    dataset = ImageDataset(images, labels, list("abcd"), name="ties")
    indices = np.arange(3, 40, 2)
    vectors = (images[indices].reshape(len(indices), -1).double() / 255.0).numpy()
    positions = list(range(len(indices)))
    if max_queries is not None:
        positions = sorted(np.random.default_rng(0).choice(len(indices), size=max_queries, replace=False).tolist())
    expected = reference_precision_at_1(vectors, labels[indices].numpy(), positions)
    assert raw_pixel_precision_at_1(dataset, indices, max_queries=max_queries, seed=0) == pytest.approx(expected)


def test_raw_pixel_precision_needs_two_images() -> None:
    with pytest.raises(UserInputError, match="two images"):
        raw_pixel_precision_at_1(planted_dataset(), [3])
