"""Embedding-space analysis: singular-value spectrum, spectral decay rho and the pi distance ratios.

Roth et al. 2020, section 5 (seed 003; seed 004 section 5). Computed in float64 with a full SVD,
the same on every device.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dmlbench.distances import euclidean
from dmlbench.errors import UserInputError

# Entries of a pairwise-distance block computed at once.
_BLOCK_ENTRIES = 1 << 22


def _prepared(embeddings: Tensor | np.ndarray, normalize: bool) -> Tensor:
    data = torch.as_tensor(embeddings.detach().cpu() if isinstance(embeddings, Tensor) else np.asarray(embeddings))
    if data.ndim != 2 or data.shape[0] < 2:
        raise UserInputError(f"embeddings must have shape [N, D] with N >= 2; got {list(data.shape)}")
    data = data.to(torch.float64)
    if not bool(torch.isfinite(data).all()):
        raise UserInputError("embeddings contain NaN or Inf values")
    return torch.nn.functional.normalize(data, dim=1) if normalize else data


def singular_values(embeddings: Tensor | np.ndarray, *, center: bool = False, normalize: bool = True) -> Tensor:
    """Singular values of the embedded data, descending (float64), Roth et al. 2020 section 5."""
    data = _prepared(embeddings, normalize)
    if center:
        data = data - data.mean(dim=0, keepdim=True)
    return torch.linalg.svdvals(data)


def spectral_decay(
    embeddings: Tensor | np.ndarray, *, drop: int = 1, center: bool = False, normalize: bool = True
) -> float:
    """rho = KL(U || S), S the sorted spectrum without its ``drop`` largest values normalised to sum 1, Roth et al. 2020 section 5."""
    values = singular_values(embeddings, center=center, normalize=normalize)
    _check_drop(drop, len(values))
    return spectral_decay_of(values, drop=drop)


def _check_drop(drop: int, count: int) -> None:
    if isinstance(drop, bool) or not isinstance(drop, int) or not 0 <= drop < count:
        raise UserInputError(f"drop must be an integer in [0, {count - 1}] (it removes the largest of {count} singular values), got {drop!r}")


def spectral_decay_of(values: Tensor, *, drop: int = 1) -> float:
    """rho from a descending spectrum: KL(U_D || S) with S = values[drop:] / sum, Roth et al. 2020 section 5."""
    kept = values[drop:].to(torch.float64)
    total = float(kept.sum())
    if total <= 0.0:
        return math.inf
    spectrum = kept / total
    uniform = 1.0 / len(kept)
    if bool((spectrum <= 0).any()):
        return math.inf
    return float((uniform * torch.log(uniform / spectrum)).sum())


def class_distances(
    embeddings: Tensor | np.ndarray, labels: Tensor | np.ndarray, *, normalize: bool = True
) -> dict[str, float]:
    """pi_intra, pi_inter and pi_ratio = pi_intra / pi_inter, Roth et al. 2020 section 5 (Euclidean d).

    pi_intra: per class, the mean distance over ordered pairs i != j, averaged over classes with at
    least two samples (singleton classes have no pair and are left out; ``num_singleton_classes``
    counts them). pi_inter: mean distance between the class means over ordered pairs l != k.
    """
    data = _prepared(embeddings, normalize)
    label_array = np.asarray(labels.detach().cpu() if isinstance(labels, Tensor) else labels)
    if label_array.shape != (len(data),):
        raise UserInputError(f"labels must have shape [{len(data)}]; got {list(label_array.shape)}")
    classes, inverse, counts = np.unique(label_array, return_inverse=True, return_counts=True)
    if len(classes) < 2:
        raise UserInputError("labels contain a single class; pi_inter needs at least 2 classes")
    inverse_t, counts_t = torch.from_numpy(inverse), torch.from_numpy(counts)
    means = torch.zeros(len(classes), data.shape[1], dtype=torch.float64).index_add_(0, inverse_t, data)
    means /= counts_t.unsqueeze(1)
    pi_inter = _mean_pairwise_distance(means)
    intra_per_class = _intra_class_mean_distances(data, inverse_t, counts_t)
    has_pairs = counts_t >= 2
    pi_intra = float(intra_per_class[has_pairs].mean()) if bool(has_pairs.any()) else math.nan
    return {
        "pi_intra": pi_intra,
        "pi_inter": pi_inter,
        "pi_ratio": pi_intra / pi_inter if pi_inter > 0 else math.nan,
        "num_singleton_classes": int((~has_pairs).sum()),
    }


def _mean_pairwise_distance(rows: Tensor) -> float:
    """Mean distance over the ``count * (count - 1)`` ordered pairs of distinct rows."""
    count = len(rows)
    block = max(1, _BLOCK_ENTRIES // count)
    total = 0.0
    for start in range(0, count, block):
        distances = euclidean(rows[start : start + block], rows)
        # A row against itself is 0 by definition, not the round-off of the product formula.
        distances[torch.arange(len(distances)), torch.arange(start, start + len(distances))] = 0.0
        total += float(distances.sum())
    return total / (count * (count - 1))


def _intra_class_mean_distances(data: Tensor, inverse: Tensor, counts: Tensor) -> Tensor:
    """Mean distance over ordered pairs within each class (0 for singletons), classes padded by size."""
    order = torch.argsort(inverse, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    by_size = torch.argsort(counts, stable=True)
    means = torch.zeros(len(counts), dtype=torch.float64)
    position = 0
    while position < len(by_size):
        # Classes are sorted by size and padded to the group's largest; a group stays within the budget.
        end = min(len(by_size), position + max(1, _BLOCK_ENTRIES // int(counts[by_size[position]]) ** 2))
        end = min(end, position + max(1, _BLOCK_ENTRIES // int(counts[by_size[end - 1]]) ** 2))
        group = by_size[position:end]
        width = int(counts[group[-1]])
        offsets = torch.arange(width)
        valid = offsets.unsqueeze(0) < counts[group].unsqueeze(1)
        rows = order[(starts[group].unsqueeze(1) + offsets).clamp_max(len(order) - 1)]
        members = data[rows] * valid.unsqueeze(2)
        distances = torch.cdist(members, members, compute_mode="donot_use_mm_for_euclid_dist")
        pair_mask = valid.unsqueeze(2) & valid.unsqueeze(1)
        sums = (distances * pair_mask).sum(dim=(1, 2))
        pairs = (counts[group] * (counts[group] - 1)).to(torch.float64)
        means[group] = torch.where(pairs > 0, sums / pairs.clamp_min(1), torch.zeros_like(sums))
        position += len(group)
    return means


def analyze(
    embeddings: Tensor | np.ndarray,
    labels: Tensor | np.ndarray,
    *,
    drop: int = 1,
    center: bool = False,
    normalize: bool = True,
) -> dict[str, Any]:
    """rho, pi_intra, pi_inter, pi_ratio and the singular-value spectrum, Roth et al. 2020 section 5."""
    values = singular_values(embeddings, center=center, normalize=normalize)
    _check_drop(drop, len(values))
    result: dict[str, Any] = {"rho": spectral_decay_of(values, drop=drop)}
    result.update(class_distances(embeddings, labels, normalize=normalize))
    result["singular_values"] = values.tolist()
    return result


def plot_spectrum(values: Tensor | list[float], path: str | Path, *, drop: int = 1, title: str = "") -> Path:
    """Write the normalised singular-value spectrum (after dropping ``drop`` values) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    _check_drop(drop, len(values))
    kept = torch.as_tensor(values, dtype=torch.float64)[drop:]
    spectrum = (kept / kept.sum()).numpy()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure, axis = pyplot.subplots(figsize=(5, 3.5))
    axis.plot(np.arange(drop + 1, drop + 1 + len(spectrum)), spectrum, marker=".")
    axis.set_yscale("log")
    axis.set_xlabel("singular value index")
    axis.set_ylabel("normalised singular value")
    axis.set_title(title or f"spectrum, rho = {spectral_decay_of(torch.as_tensor(values, dtype=torch.float64), drop=drop):.4f}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path
