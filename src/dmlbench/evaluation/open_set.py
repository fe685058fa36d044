"""Open-set identification: some classes are enrolled in a gallery, queries come from them and from others.

The measures of open-set ("watch list") identification in face recognition (Phillips, Grother and
Micheals, *Evaluation Methods in Face Recognition*, Handbook of Face Recognition, 2nd ed. 2011): a
query's nearest gallery item is accepted when its distance is at most the threshold t. The
detection and identification rate DIR(t) is the share of known queries (their class is enrolled)
whose nearest gallery item has their class and is accepted; the false alarm rate FAR(t) is the share
of unknown queries (their class is not enrolled) whose nearest gallery item is accepted. Lowering t
rejects more unknowns and loses more known queries: the rejection curve. Distances are Euclidean on
L2-normalised embeddings, as in ``evaluate``; the nearest item is exact, ties broken by index.

Intervals come from a bootstrap over classes: known and unknown classes are resampled separately,
with replacement, and each drawn class brings all its queries; the gallery stays as enrolled, so the
intervals are conditional on it (docs/decisions.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dmlbench.errors import UserInputError
from dmlbench.evaluation.api import _as_embeddings, _as_labels
from dmlbench.evaluation.calibration import CONFIDENCE, DEFAULT_REPLICATES, DISTANCE, check_targets, interval
from dmlbench.evaluation.knn_index import prepare
from dmlbench.evaluation.neighbors import nearest_neighbors
from dmlbench.evaluation.verification import PairDistances, threshold_at_fmr
from dmlbench.validation import check_positive_int

DEFAULT_FAR_TARGETS = (1e-1, 1e-2, 1e-3)
CURVE_POINTS = 101
# The bootstrap's stream and the enrolment's, apart from each other under one seed.
_ENROLMENT_STREAM, _BOOTSTRAP_STREAM = 2, 3


@dataclass(frozen=True)
class OpenSetSplit:
    """Row indices (ascending) of the gallery, the known queries and the unknown queries."""

    gallery: np.ndarray
    known: np.ndarray
    unknown: np.ndarray
    enrolled_classes: np.ndarray
    unknown_classes: np.ndarray


@dataclass(frozen=True)
class NearestGallery:
    """Each query's distance to its nearest gallery item, whether that item has the query's class
    (known queries), and the query's class position (for the class bootstrap)."""

    known_distance: np.ndarray
    known_correct: np.ndarray
    known_class: np.ndarray
    unknown_distance: np.ndarray
    unknown_class: np.ndarray


def enrol(labels: Tensor | np.ndarray, *, seed: int = 0, query_mask: np.ndarray | None = None) -> OpenSetSplit:
    """A seeded half of the classes (rounded down, at least one) enrolled, the rest unknown. Each
    enrolled class puts a seeded half of its items (rounded up) in the gallery and queries with the
    others; with ``query_mask`` (a dataset's query/gallery roles) its gallery items and its queries
    instead. Every item of an unknown class is an unknown query."""
    label_array = _as_labels(labels, len(labels)).numpy()
    classes = np.unique(label_array)
    if len(classes) < 2:
        raise UserInputError("open-set identification needs at least 2 classes (enrolled and unknown)")
    generator = np.random.default_rng([seed, _ENROLMENT_STREAM])
    enrolled = np.sort(generator.choice(classes, size=len(classes) // 2, replace=False))
    gallery, known = [], []
    for class_id in enrolled:
        members = np.flatnonzero(label_array == class_id)
        if query_mask is not None:
            gallery.append(members[~query_mask[members]])
            known.append(members[query_mask[members]])
            continue
        shuffled = generator.permutation(members)
        half = (len(members) + 1) // 2
        gallery.append(shuffled[:half])
        known.append(shuffled[half:])
    split = OpenSetSplit(
        gallery=np.sort(np.concatenate(gallery)),
        known=np.sort(np.concatenate(known)),
        unknown=np.flatnonzero(~np.isin(label_array, enrolled)),
        enrolled_classes=enrolled,
        unknown_classes=np.setdiff1d(classes, enrolled),
    )
    if len(split.gallery) == 0 or len(split.known) == 0:
        raise UserInputError("no enrolled class has both a gallery item and a query; open-set identification "
                             "needs classes of at least 2 items")
    return split


def nearest_gallery(embeddings: Tensor | np.ndarray, labels: Tensor | np.ndarray, split: OpenSetSplit) -> NearestGallery:
    """The exact nearest gallery item of every known and unknown query."""
    rows = _as_embeddings(embeddings)
    label_tensor = _as_labels(labels, len(rows))
    space = prepare(rows, normalize=True, binarize=False)
    gallery = torch.from_numpy(split.gallery)
    _, position = np.unique(label_tensor.numpy(), return_inverse=True)

    def nearest(query_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        found = nearest_neighbors(space, torch.from_numpy(query_ids), gallery, 1, exclude_self=False)
        return found.distances[:, 0].clamp_min(0.0).sqrt().numpy(), found.ids[:, 0].numpy()

    known_distance, known_match = nearest(split.known)
    unknown_distance, _ = nearest(split.unknown) if len(split.unknown) else (np.empty(0), None)
    label_array = label_tensor.numpy()
    return NearestGallery(
        known_distance=known_distance,
        known_correct=label_array[known_match] == label_array[split.known],
        known_class=position[split.known],
        unknown_distance=unknown_distance,
        unknown_class=position[split.unknown],
    )


def rates(found: NearestGallery, thresholds: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """DIR and FAR at each threshold (accepted: distance at most the threshold)."""
    limits = np.asarray(thresholds, dtype=np.float64)[:, None]
    detected = found.known_correct[None, :] & (found.known_distance[None, :] <= limits)
    alarms = found.unknown_distance[None, :] <= limits
    return detected.mean(axis=1), alarms.mean(axis=1)


def threshold_at_far(found: NearestGallery, target_far: float) -> float:
    """The largest threshold whose FAR does not exceed ``target_far``: the verification rule with the
    unknown queries' nearest distances as the impostor distances."""
    impostors = PairDistances(found.known_distance, found.unknown_distance, len(found.known_distance), len(found.unknown_distance))
    return threshold_at_fmr(impostors, target_far)["threshold"]


def bootstrap_rates(found: NearestGallery, thresholds: Sequence[float], replicates: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """DIR and FAR ``[replicates, thresholds]`` over class resamples: known and unknown classes drawn
    separately with replacement, a class drawn m times counting its queries m times."""
    check_positive_int("replicates", replicates)
    generator = np.random.default_rng([seed, _BOOTSTRAP_STREAM])
    limits = np.asarray(thresholds, dtype=np.float64)
    detected = found.known_correct[:, None] & (found.known_distance[:, None] <= limits[None, :])
    alarms = found.unknown_distance[:, None] <= limits[None, :]
    dir_replicates = _class_weighted(found.known_class, detected, replicates, generator)
    far_replicates = _class_weighted(found.unknown_class, alarms, replicates, generator)
    return dir_replicates, far_replicates


def rejection_curve(found: NearestGallery, points: int = CURVE_POINTS) -> dict[str, list[float]]:
    """DIR and FAR at up to ``points`` thresholds: quantiles of all queries' nearest distances."""
    distances = np.concatenate([found.known_distance, found.unknown_distance])
    thresholds = np.unique(np.quantile(distances, np.linspace(0.0, 1.0, points), method="inverted_cdf"))
    detection, alarm = rates(found, thresholds)
    return {"threshold": thresholds.tolist(), "dir": detection.tolist(), "far": alarm.tolist()}


def open_set(
    embeddings: Tensor | np.ndarray,
    labels: Tensor | np.ndarray,
    *,
    far_targets: Sequence[float] = DEFAULT_FAR_TARGETS,
    calibrated: Mapping[float, float] | None = None,
    seed: int = 0,
    replicates: int = DEFAULT_REPLICATES,
    query_mask: np.ndarray | None = None,
) -> dict[str, Any]:
    """DIR and FAR at the thresholds meeting ``far_targets`` on these queries, at ``calibrated``
    thresholds (target FMR -> threshold, chosen elsewhere), with class-bootstrap intervals, and the
    rejection curve (JSON-ready)."""
    targets = check_targets(far_targets)
    split = enrol(labels, seed=seed, query_mask=query_mask)
    if len(split.unknown) == 0:
        raise UserInputError("no unknown query: every class is enrolled")
    found = nearest_gallery(embeddings, labels, split)
    rows = [("target_far", target, threshold_at_far(found, target)) for target in targets]
    rows += [("target_fmr", float(target), float(threshold)) for target, threshold in (calibrated or {}).items()]
    thresholds = [threshold for _, _, threshold in rows]
    detection, alarm = rates(found, thresholds)
    dir_replicates, far_replicates = bootstrap_rates(found, thresholds, replicates, seed)
    points = [
        {key: target, "threshold": threshold, "dir": float(detection[column]), "far": float(alarm[column]),
         # Fewer unknown queries than 1 / target: no threshold can show that FAR; the one below every alarm is used.
         **({"reachable": target * len(split.unknown) >= 1.0} if key == "target_far" else {}),
         "dir_ci": interval(dir_replicates[:, column]), "far_ci": interval(far_replicates[:, column])}
        for column, (key, target, threshold) in enumerate(rows)
    ]
    return {
        "distance": DISTANCE,
        "seed": seed,
        "enrolled_classes": len(split.enrolled_classes),
        "unknown_classes": len(split.unknown_classes),
        "gallery_items": len(split.gallery),
        "known_queries": len(split.known),
        "unknown_queries": len(split.unknown),
        "rank_1_identification_rate": float(found.known_correct.mean()),
        "bootstrap": {"unit": "class", "replicates": replicates, "confidence": CONFIDENCE, "gallery": "fixed"},
        "at_far": [point for point in points if "target_far" in point],
        "at_calibrated_threshold": [point for point in points if "target_fmr" in point],
        "rejection_curve": rejection_curve(found),
    }


def _class_weighted(query_class: np.ndarray, outcome: np.ndarray, replicates: int, generator: np.random.Generator) -> np.ndarray:
    """Share of ``outcome`` rows that are true, ``[replicates, columns]``, each class counted as often as drawn."""
    classes, position = np.unique(query_class, return_inverse=True)
    per_class = np.stack([np.bincount(position, weights=outcome[:, column].astype(np.float64), minlength=len(classes))
                          for column in range(outcome.shape[1])], axis=1)
    sizes = np.bincount(position, minlength=len(classes)).astype(np.float64)
    draws = generator.integers(0, len(classes), size=(replicates, len(classes)))
    copies = np.stack([np.bincount(row, minlength=len(classes)) for row in draws]).astype(np.float64)
    return (copies @ per_class) / (copies @ sizes)[:, None]
