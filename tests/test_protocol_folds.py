"""Class-disjoint k-fold layouts (Musgrave et al. 2020 §3.3)."""

import numpy as np
import pytest

from dmlbench.data.splits import train_test_split
from dmlbench.errors import UserInputError
from dmlbench.protocol.design.folds import FoldLayout, fold_layout, layout_hash, resplit


def labels_of(num_classes: int, per_class: int = 3, offset: int = 10) -> np.ndarray:
    """Shuffled labels whose class ids are not 0..C-1 (the layout must not assume that)."""
    labels = np.repeat(np.arange(num_classes) * 2 + offset, per_class)
    return np.random.default_rng(0).permutation(labels)


def test_development_classes_are_the_standard_splits_first_half() -> None:
    labels = labels_of(17)
    layout = fold_layout(labels)
    pool, test = train_test_split(labels)
    assert layout.development_classes == tuple(np.unique(labels[pool]).tolist())
    assert layout.test_classes == tuple(np.unique(labels[test]).tolist())
    assert not set(layout.development_classes) & set(layout.test_classes)


@pytest.mark.parametrize("mode", ["contiguous", "interleaved"])
@pytest.mark.parametrize("num_classes,k", [(16, 4), (23, 4), (10, 5), (8, 2)])
def test_folds_are_class_disjoint_and_validate_every_class_once(mode: str, num_classes: int, k: int) -> None:
    layout = fold_layout(labels_of(num_classes), k=k, mode=mode)
    assert layout.k == k and len(layout.folds) == k
    development = set(layout.development_classes)
    validated: list[int] = []
    for index, fold in enumerate(layout.folds):
        assert fold.index == index
        assert not set(fold.train_classes) & set(fold.val_classes)
        assert set(fold.train_classes) | set(fold.val_classes) == development
        assert not (set(fold.train_classes) | set(fold.val_classes)) & set(layout.test_classes)
        assert list(fold.val_classes) == sorted(fold.val_classes)
        validated.extend(fold.val_classes)
    assert sorted(validated) == sorted(development)
    sizes = [len(fold.val_classes) for fold in layout.folds]
    assert max(sizes) - min(sizes) <= 1


def test_contiguous_partitions_follow_the_sorted_class_ids() -> None:
    layout = fold_layout(labels_of(16), k=4)  # 8 development classes: 10, 12, ..., 24
    assert layout.development_classes == (10, 12, 14, 16, 18, 20, 22, 24)
    assert [fold.val_classes for fold in layout.folds] == [(10, 12), (14, 16), (18, 20), (22, 24)]
    assert layout.folds[1].train_classes == (10, 12, 18, 20, 22, 24)


def test_interleaved_partitions_take_every_kth_class() -> None:
    layout = fold_layout(labels_of(16), k=4, mode="interleaved")
    assert [fold.val_classes for fold in layout.folds] == [(10, 18), (12, 20), (14, 22), (16, 24)]


def test_hash_is_stable_and_changes_with_the_layout() -> None:
    labels = labels_of(20)
    first = fold_layout(labels)
    assert isinstance(first, FoldLayout)
    assert first.hash == fold_layout(labels.copy()).hash == layout_hash(first)
    assert len(first.hash) == 64 and int(first.hash, 16) >= 0
    assert fold_layout(labels, k=5).hash != first.hash
    assert fold_layout(labels, mode="interleaved").hash != first.hash
    assert fold_layout(labels_of(22)).hash != first.hash


def test_hash_is_the_sha256_of_the_canonical_json() -> None:
    import hashlib
    import json

    layout = fold_layout(labels_of(8), k=2)
    expected = hashlib.sha256(json.dumps(layout.as_dict(), sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert layout.hash == expected


@pytest.mark.parametrize("k", [9, 100])
def test_too_many_folds_is_a_user_error(k: int) -> None:
    with pytest.raises(UserInputError, match="development classes"):
        fold_layout(labels_of(16), k=k)  # 8 development classes


@pytest.mark.parametrize("k", [1, 0, -2, 2.5, True, "4"])
def test_bad_k_is_a_user_error(k: object) -> None:
    with pytest.raises(UserInputError, match="k"):
        fold_layout(labels_of(16), k=k)  # type: ignore[arg-type]


def test_unknown_mode_is_a_user_error() -> None:
    with pytest.raises(UserInputError, match="fold mode"):
        fold_layout(labels_of(16), mode="random")


def test_a_resplit_cuts_the_same_development_classes_afresh_and_keeps_the_test_classes():
    """``folds.resplit`` (``protocol.resplit_per_search``): another partition of the development classes, drawn from
    its seed alone, every class validated in exactly one fold, folds as even as the first layout's."""

    labels = np.repeat(np.arange(40), 3)
    first = fold_layout(labels, k=4)
    again = resplit(first, 5)
    assert again == resplit(first, 5) and again != resplit(first, 6) and again.folds != first.folds
    assert again.test_classes == first.test_classes and again.development_classes == first.development_classes
    validated = sorted(c for fold in again.folds for c in fold.val_classes)
    assert validated == sorted(first.development_classes)
    assert sorted(len(fold.val_classes) for fold in again.folds) == sorted(len(fold.val_classes) for fold in first.folds)
    for fold in again.folds:
        assert set(fold.train_classes) == set(first.development_classes) - set(fold.val_classes)
    interleaved = resplit(fold_layout(labels, k=4, mode="interleaved"), 5)
    assert sorted(c for fold in interleaved.folds for c in fold.val_classes) == sorted(first.development_classes)
