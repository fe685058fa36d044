"""Class-disjoint splits as index arrays: the open-set protocol of Musgrave et al. 2020 §3.3.

Every split here divides *classes*, never images of one class, so that validation and test measure
retrieval of classes the model has never seen. All functions are deterministic: the class order is
the sorted class ids, and randomness comes only from a ``numpy.random.Generator`` seeded with ``seed``.
Returned index arrays are int64 and keep the order of the indices they were taken from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from torch import Tensor

from dmlbench.errors import UserInputError

LabelsLike = Sequence[int] | np.ndarray | Tensor


class Fold(NamedTuple):
    """One cross-validation fold: train on ``train``, validate on the held-out classes in ``validation``."""

    train: np.ndarray
    validation: np.ndarray


def train_test_split(labels: LabelsLike | Any) -> tuple[np.ndarray, np.ndarray]:
    """The train/validation pool and the test split: ``(pool, test)`` index arrays.

    Given a dataset that declares its split (a ``test`` mask, e.g. SOP's 11,318 / 11,316 classes),
    that split; otherwise first half of the sorted class ids -> pool, second half -> test (Musgrave
    et al. 2020 §3.3), the pool getting the extra class of an odd count. Every caller (runs, folds,
    ``data check``) goes through this one function.
    """
    declared = getattr(labels, "test", None)
    if hasattr(labels, "labels"):
        labels = labels.labels
    if declared is not None:
        test_mask = np.asarray(declared, dtype=bool)
        return np.flatnonzero(~test_mask).astype(np.int64), np.flatnonzero(test_mask).astype(np.int64)
    label_array = _as_labels(labels)
    classes = np.unique(label_array)
    _check_enough_classes(len(classes), 2, "train_test_split needs")
    pool_classes = classes[: math.ceil(len(classes) / 2)]
    in_pool = np.isin(label_array, pool_classes)
    return np.flatnonzero(in_pool).astype(np.int64), np.flatnonzero(~in_pool).astype(np.int64)


@dataclass(frozen=True)
class Splits:
    """Index arrays of the standard class-disjoint splits; ``test`` is read only by a final evaluation."""

    train: np.ndarray
    validation: np.ndarray
    test: np.ndarray

    def as_dict(self) -> dict[str, np.ndarray]:
        return {"train": self.train, "validation": self.validation, "test": self.test}


def standard_splits(labels: LabelsLike | Any, validation_fraction: float, seed: int) -> Splits:
    """``train_test_split``, then ``carve_validation`` of the pool: the splits every run and ``data check`` use."""
    pool, test = train_test_split(labels)
    if hasattr(labels, "labels"):
        labels = labels.labels
    train, validation = carve_validation(labels, pool, validation_fraction, seed)
    return Splits(train=train, validation=validation, test=test)


def carve_validation(
    labels: LabelsLike, train_indices: Sequence[int] | np.ndarray | Tensor, fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Hold out ``round(fraction * classes)`` randomly chosen classes of the pool: ``(train, validation)``.

    At least one class goes to each side.
    """
    label_array = _as_labels(labels)
    pool = _as_indices(train_indices, len(label_array), "train_indices")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < fraction < 1.0:
        raise UserInputError(f"validation fraction must lie strictly between 0 and 1, got {fraction!r}")
    classes = np.unique(label_array[pool])
    _check_enough_classes(len(classes), 2, "carve_validation needs")
    held_out_count = min(max(round(fraction * len(classes)), 1), len(classes) - 1)
    held_out = _generator(seed).permutation(classes)[:held_out_count]
    in_validation = np.isin(label_array[pool], held_out)
    return pool[~in_validation], pool[in_validation]


def class_disjoint_folds(
    labels: LabelsLike, indices: Sequence[int] | np.ndarray | Tensor, k: int, seed: int | None = None
) -> list[Fold]:
    """``k`` class-disjoint folds of ``indices`` (Musgrave et al. 2020 §3.3): fold ``i`` validates on class partition ``i``.

    The classes are cut into ``k`` contiguous partitions of (nearly) equal class count. With
    ``seed=None`` the partitions follow the sorted class ids, exactly as in the paper (first 1/k of the
    classes is the first partition, ...); with a seed the classes are shuffled first.
    """
    label_array = _as_labels(labels)
    pool = _as_indices(indices, len(label_array), "indices")
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise UserInputError(f"k (number of folds) must be an integer >= 2, got {k!r}")
    classes = np.unique(label_array[pool])
    _check_enough_classes(len(classes), k, f"{k} folds need")
    ordered = classes if seed is None else _generator(seed).permutation(classes)
    pool_labels = label_array[pool]
    folds = []
    for partition in np.array_split(ordered, k):
        in_validation = np.isin(pool_labels, partition)
        folds.append(Fold(train=pool[~in_validation], validation=pool[in_validation]))
    return folds


def _as_labels(labels: LabelsLike) -> np.ndarray:
    array = labels.detach().cpu().numpy() if isinstance(labels, Tensor) else np.asarray(labels)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise UserInputError(f"labels must be a 1-D array of integer class ids, got dtype {array.dtype} and shape {array.shape}")
    return array.astype(np.int64, copy=False)


def _as_indices(indices: Sequence[int] | np.ndarray | Tensor, size: int, name: str) -> np.ndarray:
    array = indices.detach().cpu().numpy() if isinstance(indices, Tensor) else np.asarray(indices)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise UserInputError(f"{name} must be a 1-D array of integer indices, got dtype {array.dtype} and shape {array.shape}")
    array = array.astype(np.int64, copy=False)
    if array.size and (array.min() < 0 or array.max() >= size):
        raise UserInputError(f"{name} must lie in [0, {size}), got range [{array.min()}, {array.max()}]")
    if np.unique(array).size != array.size:
        raise UserInputError(f"{name} must not repeat an index")
    return array


def _check_enough_classes(count: int, needed: int, what: str) -> None:
    if count < needed:
        raise UserInputError(f"{what} at least {needed} classes, got {count}")


def _generator(seed: int) -> np.random.Generator:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise UserInputError(f"seed must be a non-negative integer, got {seed!r}")
    return np.random.default_rng(int(seed))
