"""Verification use of an embedding: one distance threshold decides "same class" for a pair.

A pair is accepted when its distance is at most the threshold. The false match rate (FMR, false
accepts) is the share of negative pairs accepted, the false non-match rate (FNMR, false rejects) the
share of positive pairs rejected (ISO/IEC 19795-1 terms). Distances are Euclidean on L2-normalised
embeddings, as in ``evaluate``. Every pair of a kind is used up to a limit; beyond it a seeded sample
drawn without replacement, recorded as such.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dmlbench.errors import UserInputError
from dmlbench.evaluation.api import _as_embeddings, _as_labels
from dmlbench.validation import check_positive_int

DEFAULT_TARGET_FMRS = (1e-1, 1e-2, 1e-3, 1e-4)
# All pairs of a kind (positive, negative) are used up to this many; beyond it, this many are sampled
# without replacement.
DEFAULT_MAX_PAIRS = 2_000_000
# Bounds the float64 [rows, N, D] difference tensor of the exact all-pairs distances.
_CHUNK_ENTRIES = 1 << 24


@dataclass(frozen=True)
class PairDistances:
    """Distances of positive (same label) and negative pairs. Each kind holds all its pairs, or (more
    than ``max_pairs`` of that kind) a seeded sample drawn without replacement; ``*_total`` count all."""

    positive: np.ndarray
    negative: np.ndarray
    positive_total: int
    negative_total: int

    @property
    def positive_sampled(self) -> bool:
        return len(self.positive) < self.positive_total

    @property
    def negative_sampled(self) -> bool:
        return len(self.negative) < self.negative_total

    @property
    def sampled(self) -> bool:
        return self.positive_sampled or self.negative_sampled


def pair_distances(
    embeddings: Tensor | np.ndarray,
    labels: Tensor | np.ndarray,
    *,
    normalize: bool = True,
    max_pairs: int = DEFAULT_MAX_PAIRS,
    seed: int = 0,
) -> PairDistances:
    """Every unordered pair i < j of each kind (positive, negative) up to ``max_pairs`` of that kind;
    beyond it, ``max_pairs`` pairs of that kind drawn uniformly without replacement by a generator
    seeded with ``seed``."""
    check_positive_int("max_pairs", max_pairs)
    rows = _as_embeddings(embeddings)
    if normalize:
        rows = torch.nn.functional.normalize(rows, dim=1)
    label_tensor = _as_labels(labels, len(rows))
    label_array = label_tensor.numpy()
    num_rows = len(rows)
    sizes = np.unique(label_array, return_counts=True)[1].astype(np.int64)
    positive_total = int((sizes * (sizes - 1) // 2).sum())
    negative_total = num_rows * (num_rows - 1) // 2 - positive_total
    if positive_total == 0:
        raise UserInputError("no two items share a label; verification needs positive pairs")
    if negative_total == 0:
        raise UserInputError("all items share one label; verification needs negative pairs")
    generator = np.random.default_rng(seed)
    if positive_total <= max_pairs and negative_total <= max_pairs:
        positive, negative = _all_pairs(rows, label_tensor)
        return PairDistances(positive, negative, positive_total, negative_total)
    if negative_total <= max_pairs:  # one class holds nearly everything: all negatives, sampled positives
        negative = _all_pairs(rows, label_tensor)[1]
    else:
        negative = _sampled_negatives(rows, label_array, max_pairs, generator)
    left, right = _positive_pairs(label_array, max_pairs if positive_total > max_pairs else None, generator)
    return PairDistances(_row_distances(rows, left, right), negative, positive_total, negative_total)


@dataclass(frozen=True)
class PairRows:
    """The row indices ``(left, right)`` of the positive and negative pairs ``pair_distances`` uses,
    for callers that need to know which items (and so which classes) each pair joins."""

    positive_left: np.ndarray
    positive_right: np.ndarray
    negative_left: np.ndarray
    negative_right: np.ndarray
    positive_total: int
    negative_total: int


def pair_rows(labels: np.ndarray, *, max_pairs: int = DEFAULT_MAX_PAIRS, seed: int = 0) -> PairRows:
    """The pairs of ``pair_distances(..., max_pairs=max_pairs, seed=seed)`` as row indices: the same
    sets (all pairs of a kind, or the same seeded sample drawn without replacement), in another order."""
    check_positive_int("max_pairs", max_pairs)
    labels = np.asarray(labels, dtype=np.int64)
    sizes = np.unique(labels, return_counts=True)[1].astype(np.int64)
    positive_total = int((sizes * (sizes - 1) // 2).sum())
    negative_total = len(labels) * (len(labels) - 1) // 2 - positive_total
    if positive_total == 0:
        raise UserInputError("no two items share a label; verification needs positive pairs")
    if negative_total == 0:
        raise UserInputError("all items share one label; verification needs negative pairs")
    # The draws in pair_distances' order (negatives, then positives), so that the samples coincide.
    generator = np.random.default_rng(seed)
    if negative_total <= max_pairs:
        negative_left, negative_right = _all_negative_rows(labels)
    else:
        negative_left, negative_right = _sampled_negative_rows(labels, max_pairs, generator)
    positive_left, positive_right = _positive_pairs(labels, max_pairs if positive_total > max_pairs else None, generator)
    return PairRows(positive_left, positive_right, negative_left, negative_right, positive_total, negative_total)


def row_distances(embeddings: Tensor | np.ndarray, left: np.ndarray, right: np.ndarray, *, normalize: bool = True) -> np.ndarray:
    """Euclidean distances of the row pairs ``(left[i], right[i])`` (L2-normalised rows by default,
    as in ``evaluate``), in chunks that bound the float64 difference tensor."""
    rows = _as_embeddings(embeddings)
    if normalize:
        rows = torch.nn.functional.normalize(rows, dim=1)
    chunk = max(1, _CHUNK_ENTRIES // rows.shape[1])
    parts = [_row_distances(rows, left[start:start + chunk], right[start:start + chunk]) for start in range(0, len(left), chunk)]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.float64)


def threshold_at_fmr(pairs: PairDistances, target_fmr: float) -> dict[str, float]:
    """The largest threshold whose FMR does not exceed ``target_fmr``, with the FMR and FNMR it gives.

    Where no threshold reaches the target (fewer negative pairs than 1 / target), the threshold lies
    just below the smallest negative distance (FMR 0).
    """
    if not 0.0 < target_fmr < 1.0:
        raise UserInputError(f"target FMR must lie in (0, 1), got {target_fmr}")
    negative = np.sort(pairs.negative)
    values, first = np.unique(negative, return_index=True)
    accepted_at = np.append(first[1:], len(negative))  # negatives with distance <= values[i]
    allowed = np.flatnonzero(accepted_at <= target_fmr * len(negative))
    if len(allowed) == 0:
        threshold = float(np.nextafter(values[0], -np.inf))
    else:
        threshold = float(values[allowed[-1]])
    return {
        "target_fmr": target_fmr,
        "threshold": threshold,
        "fmr": float(np.mean(pairs.negative <= threshold)),
        "fnmr": float(np.mean(pairs.positive > threshold)),
    }


def roc_curve(pairs: PairDistances) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(fmr, fnmr, thresholds)`` at every distinct distance, thresholds ascending."""
    thresholds = np.unique(np.concatenate([pairs.positive, pairs.negative]))
    fmr = np.searchsorted(np.sort(pairs.negative), thresholds, side="right") / len(pairs.negative)
    fnmr = 1.0 - np.searchsorted(np.sort(pairs.positive), thresholds, side="right") / len(pairs.positive)
    return fmr, fnmr, thresholds


def equal_error_rate(pairs: PairDistances) -> float:
    """The error rate where FMR and FNMR meet: their mean at the threshold where they differ least."""
    fmr, fnmr, _ = roc_curve(pairs)
    closest = int(np.argmin(np.abs(fmr - fnmr)))
    return float((fmr[closest] + fnmr[closest]) / 2.0)


def summarize(pairs: PairDistances, target_fmrs: tuple[float, ...] = DEFAULT_TARGET_FMRS) -> dict[str, Any]:
    """FNMR@FMR for each target, the equal error rate and the pair counts (JSON-ready)."""
    return {
        "positive_pairs": len(pairs.positive),
        "negative_pairs": len(pairs.negative),
        "positive_pairs_total": pairs.positive_total,
        "negative_pairs_total": pairs.negative_total,
        "sampled": pairs.sampled,
        "equal_error_rate": equal_error_rate(pairs),
        "operating_points": [threshold_at_fmr(pairs, target) for target in target_fmrs],
    }


def verification(
    embeddings: Tensor | np.ndarray,
    labels: Tensor | np.ndarray,
    *,
    target_fmrs: tuple[float, ...] = DEFAULT_TARGET_FMRS,
    normalize: bool = True,
    max_pairs: int = DEFAULT_MAX_PAIRS,
    seed: int = 0,
) -> dict[str, Any]:
    """``summarize`` of the pairs of ``embeddings`` (all, or a seeded sample of large sets)."""
    pairs = pair_distances(embeddings, labels, normalize=normalize, max_pairs=max_pairs, seed=seed)
    return {**summarize(pairs, target_fmrs), "seed": seed}


def plot_roc(pairs: PairDistances, path: Path, title: str = "verification ROC") -> None:
    """FNMR against FMR (log scale) — the detection error trade-off view used for verification."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fmr, fnmr, _ = roc_curve(pairs)
    figure, axis = plt.subplots(figsize=(5, 4))
    visible = fmr > 0
    axis.plot(fmr[visible], fnmr[visible], drawstyle="steps-post")
    axis.set_xscale("log")
    axis.set_xlabel("false match rate (FMR)")
    axis.set_ylabel("false non-match rate (FNMR)")
    axis.set_title(title)
    axis.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _all_pairs(rows: Tensor, labels: Tensor) -> tuple[np.ndarray, np.ndarray]:
    positive, negative = [], []
    chunk = max(1, _CHUNK_ENTRIES // (rows.shape[0] * rows.shape[1]))
    for start in range(0, len(rows), chunk):
        block = rows[start:start + chunk]
        # Only j > i: each unordered pair once.
        distances = _distances(block, rows[start:])
        upper = torch.arange(start, start + len(block)).unsqueeze(1) < torch.arange(start, len(rows)).unsqueeze(0)
        same = labels[start:start + len(block)].unsqueeze(1) == labels[start:].unsqueeze(0)
        positive.append(distances[upper & same].numpy())
        negative.append(distances[upper & ~same].numpy())
    return np.concatenate(positive), np.concatenate(negative)


def _all_negative_rows(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``(left, right)``, left < right, of every different-label pair; a block of rows at a time."""
    num_rows = len(labels)
    chunk = max(1, (_CHUNK_ENTRIES // 4) // num_rows)
    left, right = [], []
    for start in range(0, num_rows, chunk):
        block = np.arange(start, min(start + chunk, num_rows))
        later = np.arange(num_rows)[None, :] > block[:, None]
        first, second = np.nonzero(later & (labels[block][:, None] != labels[None, :]))
        left.append(block[first])
        right.append(second)
    return np.concatenate(left).astype(np.int64), np.concatenate(right).astype(np.int64)


def _positive_pairs(labels: np.ndarray, count: int | None, generator: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``(left, right)`` of every same-label pair (``count=None``), or of ``count`` of them drawn
    uniformly without replacement: pair ``k`` of the enumeration class by class, i < j within a class."""
    order = np.argsort(labels, kind="stable")
    _, starts, sizes = np.unique(labels[order], return_index=True, return_counts=True)
    per_class = sizes.astype(np.int64) * (sizes - 1) // 2
    offsets = np.concatenate([[0], np.cumsum(per_class)])
    if count is None:
        chosen = np.arange(offsets[-1], dtype=np.int64)
    elif 2 * count > offsets[-1]:  # most of them: a subset of the enumeration (see _sampled_negative_rows)
        chosen = np.sort(generator.choice(int(offsets[-1]), size=count, replace=False))
    else:
        chosen = _distinct(generator, int(offsets[-1]), count, lambda draw: np.ones(len(draw), dtype=bool))
    member_class = np.searchsorted(offsets, chosen, side="right") - 1
    first, second = _triangle(chosen - offsets[member_class], sizes[member_class].astype(np.int64))
    base = starts[member_class]
    return order[base + first], order[base + second]


def _sampled_negatives(rows: Tensor, labels: np.ndarray, count: int, generator: np.random.Generator) -> np.ndarray:
    """Distances of ``count`` different-label pairs drawn uniformly without replacement from all pairs."""
    left, right = _sampled_negative_rows(labels, count, generator)
    return _row_distances(rows, left, right)


def _sampled_negative_rows(labels: np.ndarray, count: int, generator: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``(left, right)`` of ``count`` different-label pairs drawn uniformly without replacement."""
    num_rows = len(labels)
    sizes = np.unique(labels, return_counts=True)[1].astype(np.int64)
    available = num_rows * (num_rows - 1) // 2 - int((sizes * (sizes - 1) // 2).sum())
    if 2 * count > available:
        # Most of the negatives: rejection rounds would mostly redraw pairs already held (about 240
        # rounds for 2 million of 2,064,384), so a uniform subset of their enumeration instead.
        left, right = _all_negative_rows(labels)
        keep = np.sort(generator.choice(available, size=count, replace=False))
        return left[keep], right[keep]

    def different(draw: np.ndarray) -> np.ndarray:
        left, right = _triangle(draw, np.full(len(draw), num_rows, dtype=np.int64))
        return labels[left] != labels[right]

    chosen = _distinct(generator, num_rows * (num_rows - 1) // 2, count, different)
    return _triangle(chosen, np.full(len(chosen), num_rows, dtype=np.int64))


def _distinct(generator: np.random.Generator, population: int, count: int,
              accept: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``count`` distinct accepted integers of ``[0, population)``, uniformly without replacement:
    rounds of independent draws until enough distinct ones are in hand (their set is a uniform subset
    of its size), then a uniform subset of those; sorted."""
    chosen = np.empty(0, dtype=np.int64)
    while len(chosen) < count:
        draw = generator.integers(0, population, size=int(1.1 * (count - len(chosen))) + 16, dtype=np.int64)
        chosen = np.union1d(chosen, draw[accept(draw)])
    if len(chosen) > count:
        chosen = np.sort(generator.choice(chosen, size=count, replace=False))
    return chosen


def _triangle(index: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pair number ``index`` of the pairs i < j of ``size`` items, numbered row by row, as ``(i, j)``."""
    row_start = lambda i: i * (2 * size - i - 1) // 2  # noqa: E731  pairs before row i
    estimate = np.floor(((2 * size - 1) - np.sqrt((2.0 * size - 1) ** 2 - 8.0 * index)) / 2).astype(np.int64)
    estimate = np.clip(estimate, 0, size - 2)
    estimate -= row_start(estimate) > index  # float rounding: at most one row off either way
    estimate += row_start(estimate + 1) <= index
    return estimate, index - row_start(estimate) + estimate + 1


def _distances(block: Tensor, rows: Tensor) -> Tensor:
    """Exact float64 Euclidean distances (a direct difference, not the |a|^2 + |b|^2 - 2ab expansion)."""
    return (block.unsqueeze(1) - rows.unsqueeze(0)).square().sum(dim=-1).sqrt()


def _row_distances(rows: Tensor, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    a, b = rows[torch.from_numpy(left)], rows[torch.from_numpy(right)]
    return (a - b).square().sum(dim=1).sqrt().numpy()
