"""Class-disjoint k-fold cross-validation layouts on the development classes (Musgrave et al. 2020 §3.3).

The standard split (``dmlbench.data.splits.train_test_split``) gives the first half of the sorted
class ids to development and the second half to test. Only the development classes are
cross-validated: they are cut into ``k`` partitions and fold ``i`` validates on partition ``i`` and
trains on the other ``k - 1`` (seed 001 §3.3: "the first 0-12.5% of classes make up the first
partition, the next 12.5-25% of classes make up the second partition, and so on"; with ``k = 4`` each
partition is 12.5% of all classes). ``contiguous`` partitions follow the paper; ``interleaved``
(class ``j`` of the sorted development classes goes to partition ``j mod k``) is an option for
datasets whose class ids are ordered by something that matters (e.g. super-category).

A repeated search may cut the development classes afresh (``protocol.resplit_per_search``): ``resplit``
partitions a seeded permutation of them the same way, so each search's folds are another draw of the same
design, with the same test classes.

A layout is expressed in *class ids*, never image indices, so that it is independent of how a dataset
orders its images; ``FoldLayout.hash`` (sha256 of its canonical JSON) identifies it in every record.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from dmlbench.data.splits import LabelsLike, _as_labels, train_test_split
from dmlbench.errors import UserInputError

FoldMode = Literal["contiguous", "interleaved"]
FOLD_MODES: tuple[str, ...] = ("contiguous", "interleaved")
DEFAULT_K = 4


@dataclass(frozen=True)
class ClassFold:
    """One fold: train on ``train_classes``, validate on ``val_classes`` (disjoint, sorted class ids)."""

    index: int
    train_classes: tuple[int, ...]
    val_classes: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "train_classes": list(self.train_classes), "val_classes": list(self.val_classes)}


@dataclass(frozen=True)
class FoldLayout:
    """The k folds of the development classes, with the test classes that no fold may touch."""

    k: int
    mode: str
    development_classes: tuple[int, ...]
    test_classes: tuple[int, ...]
    folds: tuple[ClassFold, ...]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready description; its canonical serialisation defines ``hash``."""
        return {
            "k": self.k,
            "mode": self.mode,
            "development_classes": list(self.development_classes),
            "test_classes": list(self.test_classes),
            "folds": [fold.as_dict() for fold in self.folds],
        }

    @property
    def hash(self) -> str:
        """sha256 of the canonical JSON (sorted keys, no whitespace) of ``as_dict()``."""
        return layout_hash(self)


def layout_hash(layout: FoldLayout) -> str:
    """sha256 hex digest of ``layout``'s canonical JSON: equal layouts have equal hashes across processes."""
    canonical = json.dumps(layout.as_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def development_and_test_classes(labels: LabelsLike) -> tuple[np.ndarray, np.ndarray]:
    """Sorted class ids of the standard split: first half (development) and second half (test), seed 001 §3.3."""
    pool, test = train_test_split(labels)  # a dataset's declared split, or the first-half rule
    label_array = _as_labels(getattr(labels, "labels", labels))
    return np.unique(label_array[pool]), np.unique(label_array[test])


def fold_layout(labels: LabelsLike, k: int = DEFAULT_K, mode: FoldMode | str = "contiguous") -> FoldLayout:
    """The class-disjoint ``k``-fold layout of the development classes of ``labels`` (seed 001 §3.3).

    Every development class is a validation class of exactly one fold; partitions differ in size
    by at most one class (``numpy.array_split``). Raises ``UserInputError`` when ``k`` is not an
    integer >= 2, ``mode`` is unknown, or there are fewer development classes than folds.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
        raise UserInputError(f"k (number of folds) must be an integer >= 2, got {k!r}")
    k = int(k)
    if mode not in FOLD_MODES:
        raise UserInputError(f"fold mode must be one of {', '.join(FOLD_MODES)}, got {mode!r}")
    development, test = development_and_test_classes(labels)
    if len(development) < k:
        raise UserInputError(
            f"{k} folds need at least {k} development classes, the dataset has {len(development)}"
        )
    return FoldLayout(
        k=k,
        mode=str(mode),
        development_classes=tuple(int(c) for c in development),
        test_classes=tuple(int(c) for c in test),
        folds=_cut(development, development, k, str(mode)),
    )


def _cut(order: np.ndarray, development: np.ndarray, k: int, mode: str) -> tuple[ClassFold, ...]:
    """The ``k`` folds of the classes in ``order``: ``contiguous`` partitions or ``interleaved`` (every ``k``-th)."""
    partitions = np.array_split(order, k) if mode == "contiguous" else [order[i::k] for i in range(k)]
    return tuple(ClassFold(index, tuple(int(c) for c in np.setdiff1d(development, partition)),
                           tuple(int(c) for c in np.sort(partition))) for index, partition in enumerate(partitions))


def resplit(layout: FoldLayout, seed: int) -> FoldLayout:
    """``layout``'s development classes cut into its ``k`` folds afresh: a permutation drawn with
    ``numpy.random.default_rng(seed)``, partitioned as ``layout.mode`` partitions the sorted classes (Bouthillier
    et al., MLSys 2021: a benchmark's variance includes the data split). The test classes stay as they are."""
    development = np.asarray(layout.development_classes)
    shuffled = np.random.default_rng(seed).permutation(development)
    return replace(layout, folds=_cut(shuffled, development, layout.k, layout.mode))
