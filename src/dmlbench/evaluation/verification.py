"""Verification use of an embedding: one distance threshold decides "same class" for a pair.

A pair is accepted when its distance is at most the threshold. The false match rate (FMR, false
accepts) is the share of negative pairs accepted, the false non-match rate (FNMR, false rejects) the
share of positive pairs rejected (ISO/IEC 19795-1 terms). Distances are Euclidean on L2-normalised
embeddings, as in ``evaluate``. Large sets are judged on a seeded sample of pairs, recorded as such.
"""

from __future__ import annotations

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
# All pairs are used up to this many; beyond it, this many positive and this many negative pairs are sampled.
DEFAULT_MAX_PAIRS = 2_000_000
# Bounds the float64 [rows, N, D] difference tensor of the exact all-pairs distances.
_CHUNK_ENTRIES = 1 << 24


@dataclass(frozen=True)
class PairDistances:
    """Distances of positive (same label) and negative pairs; ``sampled``: drawn, not all pairs."""

    positive: np.ndarray
    negative: np.ndarray
    sampled: bool


def pair_distances(
    embeddings: Tensor | np.ndarray,
    labels: Tensor | np.ndarray,
    *,
    normalize: bool = True,
    max_pairs: int = DEFAULT_MAX_PAIRS,
    seed: int = 0,
) -> PairDistances:
    """Every unordered pair i < j, or (more than ``max_pairs`` pairs) ``max_pairs`` of each kind drawn
    uniformly with replacement by a generator seeded with ``seed``."""
    check_positive_int("max_pairs", max_pairs)
    rows = _as_embeddings(embeddings)
    if normalize:
        rows = torch.nn.functional.normalize(rows, dim=1)
    label_tensor = _as_labels(labels, len(rows))
    num_rows = len(rows)
    if num_rows * (num_rows - 1) // 2 <= max_pairs:
        positive, negative = _all_pairs(rows, label_tensor)
        sampled = False
    else:
        positive, negative = _sampled_pairs(rows, label_tensor, max_pairs, seed)
        sampled = True
    if len(positive) == 0:
        raise UserInputError("no two items share a label; verification needs positive pairs")
    if len(negative) == 0:
        raise UserInputError("all items share one label; verification needs negative pairs")
    return PairDistances(positive, negative, sampled)


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


def _sampled_pairs(rows: Tensor, labels: Tensor, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(seed)
    label_array = labels.numpy()
    order = np.argsort(label_array, kind="stable")
    classes, starts, sizes = np.unique(label_array[order], return_index=True, return_counts=True)
    # Positive pairs: a class drawn with probability proportional to its number of pairs, then two members.
    pair_counts = sizes * (sizes - 1) / 2.0
    if pair_counts.sum() == 0:
        return np.empty(0), np.empty(0)
    chosen = generator.choice(len(classes), size=count, p=pair_counts / pair_counts.sum())
    first = generator.integers(0, sizes[chosen])
    second = generator.integers(0, sizes[chosen] - 1)
    second = second + (second >= first)
    positive = _row_distances(rows, order[starts[chosen] + first], order[starts[chosen] + second])
    # Negative pairs: uniform pairs of rows, redrawn while they share a label (few redraws unless one class dominates).
    left = generator.integers(0, len(rows), size=count)
    right = generator.integers(0, len(rows), size=count)
    for _ in range(100):
        clash = label_array[left] == label_array[right]
        if not clash.any():
            break
        right[clash] = generator.integers(0, len(rows), size=int(clash.sum()))
    keep = label_array[left] != label_array[right]
    negative = _row_distances(rows, left[keep], right[keep])
    return positive, negative


def _distances(block: Tensor, rows: Tensor) -> Tensor:
    """Exact float64 Euclidean distances (a direct difference, not the |a|^2 + |b|^2 - 2ab expansion)."""
    return (block.unsqueeze(1) - rows.unsqueeze(0)).square().sum(dim=-1).sqrt()


def _row_distances(rows: Tensor, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    a, b = rows[torch.from_numpy(left)], rows[torch.from_numpy(right)]
    return (a - b).square().sum(dim=1).sqrt().numpy()
