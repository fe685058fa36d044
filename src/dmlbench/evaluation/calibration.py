"""A verification threshold chosen on some classes and measured on others, with class-bootstrap intervals.

A threshold chosen on the test pairs themselves (``verification.threshold_at_fmr`` on them) is an
in-sample optimum, optimistic for any class the model has not met. ``calibrate`` chooses it on the
calibration classes alone (a run's validation classes) and applies it, fixed, to the test classes.
Pairs that share a class are dependent, so the intervals come from a bootstrap over classes: a
replicate draws as many classes as there are, with replacement; each drawn copy of a class is a
cluster of its own whose within-class pairs are genuine pairs, every pair between copies of two
different classes is an impostor pair, and pairs between two copies of one class (the same images
twice) are left out (docs/decisions.md). Distances are Euclidean on L2-normalised embeddings, as in
``evaluate``; pair sets beyond ``max_pairs`` are the seeded samples of ``verification.pair_distances``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import Tensor

from dmlbench.errors import UserInputError
from dmlbench.evaluation.api import _as_embeddings, _as_labels
from dmlbench.evaluation.verification import (
    DEFAULT_MAX_PAIRS,
    PairDistances,
    equal_error_rate,
    pair_rows,
    row_distances,
    threshold_at_fmr,
)
from dmlbench.validation import check_positive_int

DEFAULT_REPLICATES = 1000
CONFIDENCE = 0.95
DISTANCE = "euclidean on L2-normalised embeddings"
# Bounds the [replicates, class pairs] weight matrix of one bootstrap chunk.
_CHUNK_ENTRIES = 1 << 23
# The bootstrap's stream, apart from the pair sample drawn with the same seed.
_BOOTSTRAP_STREAM = 1


@dataclass(frozen=True)
class ClassPairs:
    """Pair distances with the classes they join. ``classes`` are the sorted labels; ``positive_class[i]``
    is the class position of positive pair i, ``negative_classes[i]`` the two (ascending) of negative
    pair i; ``*_total`` count all pairs of a kind when only a sample is held."""

    classes: np.ndarray
    positive: np.ndarray
    negative: np.ndarray
    positive_class: np.ndarray
    negative_classes: np.ndarray
    positive_total: int
    negative_total: int

    def distances(self) -> PairDistances:
        return PairDistances(self.positive, self.negative, self.positive_total, self.negative_total)

    def describe(self) -> dict[str, Any]:
        """Counts and the equal error rate (JSON-ready)."""
        pairs = self.distances()
        return {
            "classes": len(self.classes),
            "positive_pairs": len(self.positive),
            "negative_pairs": len(self.negative),
            "positive_pairs_total": self.positive_total,
            "negative_pairs_total": self.negative_total,
            "sampled": pairs.sampled,
            "equal_error_rate": equal_error_rate(pairs),
        }


def class_pairs(
    embeddings: Tensor | np.ndarray, labels: Tensor | np.ndarray, *, max_pairs: int = DEFAULT_MAX_PAIRS, seed: int = 0
) -> ClassPairs:
    """Every positive and negative pair (beyond ``max_pairs`` of a kind: the seeded sample that
    ``verification.pair_distances`` draws) with its distance and classes."""
    rows = _as_embeddings(embeddings)
    label_array = _as_labels(labels, len(rows)).numpy()
    found = pair_rows(label_array, max_pairs=max_pairs, seed=seed)
    classes, position = np.unique(label_array, return_inverse=True)
    negative_classes = np.sort(np.stack([position[found.negative_left], position[found.negative_right]], axis=1), axis=1)
    return ClassPairs(
        classes=classes,
        positive=row_distances(rows, found.positive_left, found.positive_right),
        negative=row_distances(rows, found.negative_left, found.negative_right),
        positive_class=position[found.positive_left],
        negative_classes=negative_classes,
        positive_total=found.positive_total,
        negative_total=found.negative_total,
    )


def check_targets(target_fmrs: Sequence[float]) -> tuple[float, ...]:
    """The targets as floats, each in (0, 1), without repeats; one line naming the first bad one."""
    targets = tuple(float(target) for target in target_fmrs)
    if not targets:
        raise UserInputError("give at least one target false match rate")
    for target in targets:
        if not 0.0 < target < 1.0:
            raise UserInputError(f"target false match rate must lie in (0, 1), got {target:g}")
    if len(set(targets)) != len(targets):
        raise UserInputError(f"target false match rates repeat: {', '.join(f'{t:g}' for t in targets)}")
    return targets


def check_reachable(labels: Tensor | np.ndarray, targets: Sequence[float], what: str) -> None:
    """A target FMR needs room for at least one accepted impostor pair: ``1 / target`` impostor pairs
    among ``labels`` (checked from the labels alone, before any embedding is compared)."""
    label_array = np.asarray(labels.cpu() if isinstance(labels, Tensor) else labels)
    sizes = np.unique(label_array, return_counts=True)[1].astype(np.int64)
    impostors = len(label_array) * (len(label_array) - 1) // 2 - int((sizes * (sizes - 1) // 2).sum())
    needed = int(np.ceil(1.0 / min(targets) - 1e-9))
    if impostors < needed:
        raise UserInputError(
            f"the {what} has {len(sizes)} classes and {impostors:,} impostor pairs; a target FMR of "
            f"{min(targets):g} needs at least {needed:,}: use more classes or a larger target"
        )


def draw_classes(num_classes: int, replicates: int, seed: int) -> np.ndarray:
    """``[replicates, num_classes]`` class positions drawn with replacement; the same seed, the same draws."""
    check_positive_int("replicates", replicates)
    generator = np.random.default_rng([seed, _BOOTSTRAP_STREAM])
    return generator.integers(0, num_classes, size=(replicates, num_classes), dtype=np.int64)


def bootstrap_rates(pairs: ClassPairs, thresholds: Sequence[float], draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FMR and FNMR ``[replicates, thresholds]`` of each class resample in ``draws`` (``draw_classes``).

    A class drawn m times weighs its genuine pairs m times; a pair of classes drawn m and n times
    weighs their impostor pairs m * n times; a replicate without a pair of a kind gets NaN there.
    """
    num_classes = len(pairs.classes)
    limits = np.asarray(thresholds, dtype=np.float64)
    copies = _copies(draws, num_classes)
    positive_count = np.bincount(pairs.positive_class, minlength=num_classes).astype(np.float64)
    rejected = np.stack([np.bincount(pairs.positive_class, weights=(pairs.positive > limit).astype(np.float64),
                                     minlength=num_classes) for limit in limits], axis=1)
    fnmr = _ratio(copies @ rejected, copies @ positive_count)
    keys = pairs.negative_classes[:, 0] * num_classes + pairs.negative_classes[:, 1]
    class_pair, inverse = np.unique(keys, return_inverse=True)
    first, second = class_pair // num_classes, class_pair % num_classes
    negative_count = np.bincount(inverse).astype(np.float64)
    accepted = np.stack([np.bincount(inverse, weights=(pairs.negative <= limit).astype(np.float64),
                                     minlength=len(class_pair)) for limit in limits], axis=1)
    fmr = np.empty((len(draws), len(limits)))
    chunk = max(1, _CHUNK_ENTRIES // len(class_pair))
    for start in range(0, len(draws), chunk):
        weights = copies[start:start + chunk, first] * copies[start:start + chunk, second]
        fmr[start:start + chunk] = _ratio(weights @ accepted, weights @ negative_count)
    return fmr, fnmr


def interval(values: np.ndarray, confidence: float = CONFIDENCE) -> list[float] | None:
    """The percentile interval of the finite replicate values; ``None`` when there are none."""
    finite = values[np.isfinite(values)]
    if len(finite) == 0:
        return None
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(finite, [tail, 100.0 - tail])
    return [float(low), float(high)]


def calibrate(
    calibration_embeddings: Tensor | np.ndarray,
    calibration_labels: Tensor | np.ndarray,
    test_embeddings: Tensor | np.ndarray,
    test_labels: Tensor | np.ndarray,
    target_fmrs: Sequence[float],
    *,
    max_pairs: int = DEFAULT_MAX_PAIRS,
    seed: int = 0,
    replicates: int = DEFAULT_REPLICATES,
) -> dict[str, Any]:
    """For each target FMR: the threshold chosen on the calibration pairs only, the test FMR and FNMR
    it gives with class-bootstrap intervals, and the in-sample optimum on the test pairs (JSON-ready)."""
    targets = check_targets(target_fmrs)
    check_positive_int("replicates", replicates)
    check_reachable(calibration_labels, targets, "calibration set")
    calibration = class_pairs(calibration_embeddings, calibration_labels, max_pairs=max_pairs, seed=seed)
    test = class_pairs(test_embeddings, test_labels, max_pairs=max_pairs, seed=seed)
    if len(test.classes) < 2:
        raise UserInputError("the test set needs at least 2 classes")
    # The threshold sees the calibration pairs alone; the test pairs only measure it.
    chosen = [threshold_at_fmr(calibration.distances(), target) for target in targets]
    thresholds = [point["threshold"] for point in chosen]
    fmr_replicates, fnmr_replicates = bootstrap_rates(test, thresholds, draw_classes(len(test.classes), replicates, seed))
    test_distances, test_summary = test.distances(), test.describe()
    points = []
    for column, (target, point) in enumerate(zip(targets, chosen)):
        in_sample = threshold_at_fmr(test_distances, target)
        points.append({
            "target_fmr": target,
            "threshold": point["threshold"],
            "calibration_fmr": point["fmr"],
            "calibration_fnmr": point["fnmr"],
            "test_fmr": float(np.mean(test.negative <= point["threshold"])),
            "test_fnmr": float(np.mean(test.positive > point["threshold"])),
            "test_fmr_ci": interval(fmr_replicates[:, column]),
            "test_fnmr_ci": interval(fnmr_replicates[:, column]),
            "in_sample_threshold": in_sample["threshold"],
            "in_sample_fmr": in_sample["fmr"],
            "in_sample_fnmr": in_sample["fnmr"],
        })
    return {
        "distance": DISTANCE,
        "seed": seed,
        "bootstrap": {"unit": "class", "replicates": replicates, "confidence": CONFIDENCE,
                      "valid_fmr_replicates": int(np.isfinite(fmr_replicates[:, 0]).sum()),
                      "valid_fnmr_replicates": int(np.isfinite(fnmr_replicates[:, 0]).sum())},
        "calibration": calibration.describe(),
        "test": test_summary,
        "equal_error_rate": test_summary["equal_error_rate"],
        "targets": points,
    }


def _copies(draws: np.ndarray, num_classes: int) -> np.ndarray:
    """``[replicates, num_classes]`` float64: how often each class was drawn in each replicate."""
    offsets = draws + num_classes * np.arange(len(draws), dtype=np.int64)[:, None]
    return np.bincount(offsets.ravel(), minlength=len(draws) * num_classes).reshape(len(draws), num_classes).astype(np.float64)


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """``numerator / denominator`` row by row, NaN where the denominator is 0."""
    denominator = denominator.reshape(-1, 1) if numerator.ndim == 2 else denominator
    out = np.full(np.broadcast_shapes(numerator.shape, denominator.shape), np.nan)
    return np.divide(numerator, denominator, out=out, where=denominator > 0)
