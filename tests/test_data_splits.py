"""Class-disjoint splits: train/test halves, validation carving, k folds (Musgrave et al. 2020 §3.3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dmlbench.data.splits import carve_validation, class_disjoint_folds, train_test_split
from dmlbench.errors import UserInputError


def shuffled_labels(class_ids: list[int], per_class: list[int], seed: int = 0) -> np.ndarray:
    labels = np.repeat(np.array(class_ids), per_class)
    return np.random.default_rng(seed).permutation(labels)


def reference_train_test(labels: np.ndarray) -> tuple[list[int], list[int]]:
    classes = sorted(set(labels.tolist()))
    pool_classes = set(classes[: (len(classes) + 1) // 2])
    pool = [index for index, label in enumerate(labels.tolist()) if label in pool_classes]
    test = [index for index, label in enumerate(labels.tolist()) if label not in pool_classes]
    return pool, test


@pytest.mark.parametrize("class_ids", [[7, 3, 100, 42, 5], [0, 1], list(range(10)), [9, 2, 4, 8, 6, 11]])
def test_train_test_split_takes_the_first_half_of_the_sorted_classes(class_ids: list[int]) -> None:
    labels = shuffled_labels(class_ids, [3 + (i % 4) for i in range(len(class_ids))])
    pool, test = train_test_split(labels)
    expected_pool, expected_test = reference_train_test(labels)
    assert pool.tolist() == expected_pool and test.tolist() == expected_test
    assert pool.dtype == np.int64 and test.dtype == np.int64
    assert len(np.unique(labels[pool])) == math.ceil(len(class_ids) / 2)
    assert not set(labels[pool]) & set(labels[test])
    # Accepts a torch tensor too, with the same result.
    tensor_pool, tensor_test = train_test_split(torch.from_numpy(labels))
    assert np.array_equal(tensor_pool, pool) and np.array_equal(tensor_test, test)


def test_carve_validation_is_class_disjoint_seeded_and_sized() -> None:
    labels = shuffled_labels(list(range(40)), [5] * 40)
    pool, _ = train_test_split(labels)
    train, validation = carve_validation(labels, pool, 0.25, seed=3)
    assert sorted(train.tolist() + validation.tolist()) == sorted(pool.tolist())
    assert not set(labels[train]) & set(labels[validation])
    assert len(np.unique(labels[validation])) == 5  # round(0.25 * 20)
    # Order of the pool is kept.
    assert train.tolist() == [index for index in pool.tolist() if index in set(train.tolist())]
    again = carve_validation(labels, pool, 0.25, seed=3)
    assert np.array_equal(again[0], train) and np.array_equal(again[1], validation)
    others = {tuple(np.unique(labels[carve_validation(labels, pool, 0.25, seed)[1]])) for seed in range(6)}
    assert len(others) > 1


def test_carve_validation_keeps_a_class_on_each_side() -> None:
    labels = np.array([0, 0, 1, 1, 2, 2])
    train, validation = carve_validation(labels, np.arange(6), 0.01, seed=0)
    assert len(np.unique(labels[validation])) == 1
    train, validation = carve_validation(labels, np.arange(6), 0.99, seed=0)
    assert len(np.unique(labels[train])) == 1


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.integers(0, 12), min_size=2, max_size=60),
    fraction=st.floats(0.01, 0.99),
    seed=st.integers(0, 2**32 - 1),
    k=st.integers(2, 5),
)
def test_split_invariants_hold_for_any_labels(labels: list[int], fraction: float, seed: int, k: int) -> None:
    label_array = np.array(labels)
    classes = np.unique(label_array)
    if len(classes) < 2:
        with pytest.raises(UserInputError, match="at least 2 classes"):
            train_test_split(label_array)
        return
    pool, test = train_test_split(label_array)
    assert sorted(pool.tolist() + test.tolist()) == list(range(len(labels)))
    assert not set(label_array[pool]) & set(label_array[test])
    if len(np.unique(label_array[pool])) >= 2:
        train, validation = carve_validation(label_array, pool, fraction, seed)
        assert sorted(train.tolist() + validation.tolist()) == sorted(pool.tolist())
        assert not set(label_array[train]) & set(label_array[validation])
        assert len(train) and len(validation)
    everything = np.arange(len(labels))
    if len(classes) >= k:
        folds = class_disjoint_folds(label_array, everything, k, seed)
        validation_classes = [set(label_array[fold.validation]) for fold in folds]
        assert set().union(*validation_classes) == set(classes)
        assert sum(map(len, validation_classes)) == len(classes)
        for fold in folds:
            assert sorted(fold.train.tolist() + fold.validation.tolist()) == everything.tolist()
            assert not set(label_array[fold.train]) & set(label_array[fold.validation])
    else:
        with pytest.raises(UserInputError, match=f"{k} folds need"):
            class_disjoint_folds(label_array, everything, k, seed)


def test_unseeded_folds_are_the_papers_contiguous_class_partitions() -> None:
    class_ids = [30, 10, 20, 50, 40, 60, 70, 80, 90]
    labels = shuffled_labels(class_ids, [2] * len(class_ids))
    pool = np.arange(len(labels))
    folds = class_disjoint_folds(labels, pool, 4)
    # 9 sorted classes into 4 contiguous partitions: 3, 2, 2, 2 classes.
    sorted_classes = sorted(class_ids)
    expected = [sorted_classes[0:3], sorted_classes[3:5], sorted_classes[5:7], sorted_classes[7:9]]
    for fold, partition in zip(folds, expected):
        assert sorted(set(labels[fold.validation].tolist())) == partition
        assert fold.validation.tolist() == [i for i in pool.tolist() if labels[i] in partition]
        assert fold.train.tolist() == [i for i in pool.tolist() if labels[i] not in partition]


def test_seeded_folds_are_deterministic_and_depend_on_the_seed() -> None:
    labels = shuffled_labels(list(range(24)), [3] * 24)
    pool = np.arange(len(labels))
    first = class_disjoint_folds(labels, pool, 4, seed=5)
    again = class_disjoint_folds(labels, pool, 4, seed=5)
    assert all(np.array_equal(a.validation, b.validation) for a, b in zip(first, again))
    partitions = {
        tuple(sorted(set(labels[fold.validation].tolist())))
        for seed in range(4) for fold in class_disjoint_folds(labels, pool, 4, seed=seed)
    }
    assert len(partitions) > 4
    sizes = [len(set(labels[fold.validation].tolist())) for fold in first]
    assert sizes == [6, 6, 6, 6]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: train_test_split([3, 3, 3]), "at least 2 classes"),
        (lambda: train_test_split(np.array([0.5, 1.5])), "integer class ids"),
        (lambda: train_test_split(np.zeros((2, 2), dtype=int)), "1-D"),
        (lambda: carve_validation([0, 1, 2], [0, 1, 2], 0.0, 0), "fraction"),
        (lambda: carve_validation([0, 1, 2], [0, 1, 2], 1.0, 0), "fraction"),
        (lambda: carve_validation([0, 1, 2], [0, 1, 2], True, 0), "fraction"),
        (lambda: carve_validation([0, 1, 2], [0, 1, 2], 0.5, -1), "seed"),
        (lambda: carve_validation([0, 1, 2], [0, 1], 0.5, 1.5), "seed"),
        (lambda: carve_validation([0, 0, 1], [0, 1], 0.5, 0), "at least 2 classes"),
        (lambda: carve_validation([0, 1, 2], [0, 3], 0.5, 0), "train_indices"),
        (lambda: carve_validation([0, 1, 2], [0, 0, 1], 0.5, 0), "repeat"),
        (lambda: class_disjoint_folds([0, 1, 2], [0, 1, 2], 1), "k"),
        (lambda: class_disjoint_folds([0, 1, 2], [0, 1, 2], 4), "4 folds need at least 4 classes"),
        (lambda: class_disjoint_folds([0, 1, 2], [0, 1, 2.0], 2), "indices"),
    ],
)
def test_bad_split_input_is_a_user_error(call, message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        call()
