"""``dmlbench data check``: class counts, split sizes, broken items and leakage between splits."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dmlbench.data.base import ImageDataset, as_index_tensor
from dmlbench.data.splits import standard_splits, train_test_split
from dmlbench.distances import squared_euclidean
from dmlbench.errors import UserInputError
from dmlbench.files import file_sha256

# Above this many multiply-adds (queries x references x pixels) the raw-pixel baseline is skipped:
# it would take more than a few seconds on a laptop CPU.
BASELINE_WORK_LIMIT = 4e11


def summarize(
    dataset: ImageDataset,
    splits: Mapping[str, Sequence[int] | np.ndarray | Tensor] | None = None,
    *,
    validation_fraction: float = 0.2,
    seed: int = 0,
    baseline_queries: int = 1000,
) -> dict[str, Any]:
    """A JSON-ready report on ``dataset`` and its class-disjoint ``splits`` (name -> index array).

    Without ``splits`` the standard ones are used (``splits.standard_splits``)
    with ``validation_fraction`` and ``seed``. ``baseline_queries`` test images (0: none) are matched
    by raw-pixel nearest neighbour against the whole test split, as a difficulty reference.
    """
    labels = dataset.labels.numpy()
    if splits is None:
        split_indices = standard_splits(labels, validation_fraction, seed).as_dict()
        how = {"validation_fraction": validation_fraction, "seed": seed}
    else:
        split_indices = {name: as_index_tensor(indices, len(dataset), f"split {name!r}").numpy() for name, indices in splits.items()}
        how = {"given": True}

    counts = np.bincount(labels, minlength=len(dataset.class_names))
    present = counts[counts > 0]
    image_ids = _exact_duplicate_ids(dataset.images)
    constant = _constant_images(dataset.images)

    summary: dict[str, Any] = {
        "dataset": dataset.name,
        "content_hash": dataset.content_hash,
        "images": len(dataset),
        "image_shape": [dataset.num_channels, *dataset.image_size],
        "classes": len(dataset.class_names),
        "classes_without_images": int((counts == 0).sum()),
        "images_per_class": {
            "min": int(present.min()) if present.size else 0,
            "median": float(np.median(present)) if present.size else 0.0,
            "max": int(present.max()) if present.size else 0,
        },
        "splits": {
            name: {"images": int(len(indices)), "classes": int(np.unique(labels[indices]).size)}
            for name, indices in split_indices.items()
        },
        "split_settings": how,
        "broken": {"constant_images": int(constant.size), "examples": constant[:5].tolist()},
        "conflicting_duplicates": _conflicting_duplicates(image_ids, labels),
        "leakage": _leakage(split_indices, labels, image_ids),
        "raw_pixel_precision_at_1": None,
    }
    if baseline_queries and "test" in split_indices and len(split_indices["test"]) > 1:
        test = split_indices["test"]
        queries = min(baseline_queries, len(test))
        work = queries * len(test) * dataset.images[0].numel()
        if work <= BASELINE_WORK_LIMIT:
            summary["raw_pixel_precision_at_1"] = {
                "split": "test",
                "queries": queries,
                "value": raw_pixel_precision_at_1(dataset, test, max_queries=queries, seed=seed),
            }
    summary["problems"] = _problems(summary)
    if dataset.domains is not None:
        summary["images_per_domain"] = dataset.images_per_domain()
    # What the dataset's reader found on disk (emoji: per vendor and category, missing, unlisted, licences).
    source = dataset.metadata.get("source_report")
    if isinstance(source, dict):
        summary["source"] = source
        summary["problems"] += list(source.get("problems", []))
    summary.update({name: dict(sizes) for name, sizes in summary["splits"].items()})  # one object per split
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """The report of ``summarize`` as human-readable lines."""
    per_class = summary["images_per_class"]
    lines = [
        f"dataset        {summary['dataset']}  ({summary['images']} images of shape {'x'.join(map(str, summary['image_shape']))})",
        f"content hash   {summary['content_hash']}",
        f"classes        {summary['classes']}  ({summary['classes_without_images']} without images)",
        f"per class      min {per_class['min']}, median {per_class['median']:g}, max {per_class['max']} images",
    ]
    settings = summary["split_settings"]
    how = "as given" if settings.get("given") else (
        f"validation fraction {settings['validation_fraction']}, seed {settings['seed']}"
    )
    lines.append(f"splits         ({how})")
    for name, sizes in summary["splits"].items():
        lines.append(f"  {name:<12} {sizes['images']:>8} images  {sizes['classes']:>6} classes")
    broken = summary["broken"]
    lines.append(f"broken         {broken['constant_images']} constant (empty) images"
                 + (f", e.g. items {broken['examples']}" if broken["examples"] else ""))
    lines.append(f"duplicates     {summary['conflicting_duplicates']} images identical to an image of another class")
    leakage = summary["leakage"]
    for pair in leakage["shared_classes"]:
        lines.append(
            f"leakage {pair:<20} {leakage['shared_classes'][pair]} shared classes, "
            f"{leakage['duplicate_images'][pair]} exact duplicate images"
        )
    baseline = summary["raw_pixel_precision_at_1"]
    if baseline is not None:
        lines.append(
            f"difficulty     raw-pixel 1-NN Precision@1 on {baseline['split']} = {baseline['value']:.3f} "
            f"({baseline['queries']} queries)"
        )
    if "images_per_domain" in summary:
        lines.append("domains        " + _inline(summary["images_per_domain"]))
    for key, value in summary.get("source", {}).items():
        if key != "problems":
            lines.append(f"{key.replace('_', ' '):<14} {_inline(value)}")
    lines.append("status         " + ("OK" if not summary["problems"] else "PROBLEMS: " + "; ".join(summary["problems"])))
    return "\n".join(lines)


def _inline(value: Any) -> str:
    """A JSON value of a reader's report on one line: ``key value, key value``; lists comma-separated."""
    if isinstance(value, dict):
        return ", ".join(f"{key} {_inline(item)}" if not isinstance(item, dict) else f"{key} ({_inline(item)})"
                         for key, item in value.items())
    if isinstance(value, list):
        return "[" + ", ".join(str(item) for item in value) + "]"
    return str(value)


def raw_pixel_precision_at_1(
    dataset: ImageDataset, indices: Sequence[int] | np.ndarray | Tensor, max_queries: int | None = None, seed: int = 0
) -> float:
    """Precision@1 (Musgrave et al. 2020 §3.2) of euclidean nearest neighbours on raw pixels, self excluded.

    A query counts as a hit when its nearest other image (ties to the lower index) has its class. References are all items at ``indices``; queries are all of them, or ``max_queries`` drawn
    without replacement with ``numpy.random.default_rng(seed)``.
    """
    index = as_index_tensor(indices, len(dataset)).numpy()
    if len(index) < 2:
        raise UserInputError(f"raw-pixel Precision@1 needs at least two images, got {len(index)}")
    query_positions = np.arange(len(index))
    if max_queries is not None and max_queries < len(index):
        query_positions = np.sort(np.random.default_rng(seed).choice(len(index), size=max_queries, replace=False))
    # Raw integer pixel values in float64: every sum stays an exactly representable integer, so equal
    # distances are exactly equal and ties really go to the lower index.
    references = dataset.images[torch.from_numpy(index)].flatten(1).to(torch.float64)
    labels = dataset.labels[torch.from_numpy(index)]
    hits = 0
    for block in np.array_split(query_positions, max(1, len(query_positions) // 256)):
        block_tensor = torch.from_numpy(block)
        distances = squared_euclidean(references[block_tensor], references)
        distances[torch.arange(len(block)), block_tensor] = torch.inf  # a query is not its own neighbour
        nearest = distances.argmin(dim=1)  # first minimum: ties go to the lower index
        hits += int((labels[nearest] == labels[block_tensor]).sum())
    return hits / len(query_positions)


def _exact_duplicate_ids(images: Tensor) -> np.ndarray:
    """One id per image; two images share an id exactly when their bytes are equal."""
    rows = np.ascontiguousarray(images.reshape(images.shape[0], -1).numpy())
    as_bytes = rows.view(np.dtype((np.void, rows.shape[1])))[:, 0]
    _, ids = np.unique(as_bytes, return_inverse=True)
    return ids.reshape(-1)


def _constant_images(images: Tensor) -> np.ndarray:
    """Indices of images whose pixels are all equal (blank or broken)."""
    flat = images.reshape(images.shape[0], -1)
    if flat.shape[1] == 0:
        return np.arange(images.shape[0])
    return torch.nonzero((flat == flat[:, :1]).all(dim=1)).flatten().numpy()


def _conflicting_duplicates(image_ids: np.ndarray, labels: np.ndarray) -> int:
    """Images whose exact bytes also occur with a different label."""
    pairs = np.unique(np.stack([image_ids, labels], axis=1), axis=0)
    labels_per_image = np.bincount(pairs[:, 0], minlength=image_ids.max(initial=-1) + 1)
    return int((labels_per_image[image_ids] > 1).sum())


def _leakage(splits: dict[str, np.ndarray], labels: np.ndarray, image_ids: np.ndarray) -> dict[str, dict[str, int]]:
    shared_classes, duplicates = {}, {}
    for (first, first_indices), (second, second_indices) in itertools.combinations(splits.items(), 2):
        pair = f"{first}/{second}"
        shared_classes[pair] = int(np.intersect1d(labels[first_indices], labels[second_indices]).size)
        # Images of the second split whose exact bytes also appear in the first.
        duplicates[pair] = int(np.isin(image_ids[second_indices], image_ids[first_indices]).sum())
    return {"shared_classes": shared_classes, "duplicate_images": duplicates}


def _problems(summary: dict[str, Any]) -> list[str]:
    problems = []
    if summary["broken"]["constant_images"]:
        problems.append(f"{summary['broken']['constant_images']} constant images")
    if summary["classes_without_images"]:
        problems.append(f"{summary['classes_without_images']} classes without images")
    if summary["conflicting_duplicates"]:
        problems.append(f"{summary['conflicting_duplicates']} images duplicated across classes")
    for pair, count in summary["leakage"]["shared_classes"].items():
        if count:
            problems.append(f"{count} classes shared by {pair}")
    for pair, count in summary["leakage"]["duplicate_images"].items():
        if count:
            problems.append(f"{count} images of {pair.split('/')[1]} duplicated in {pair.split('/')[0]}")
    for name, sizes in summary["splits"].items():
        if sizes["images"] == 0:
            problems.append(f"split {name} is empty")
    return problems


def summarize_files(dataset: Any) -> dict[str, Any]:
    """A JSON-ready report on a ``FileDataset``: its declared splits, unreadable and duplicate files.

    Splits: ``train`` and ``test``, or ``train``, ``query`` and ``gallery`` for a dataset with roles;
    each with ``classes`` and ``images``, also repeated at the top level. Duplicates are files with
    equal sha256 of their bytes (every file is read once); unreadable files are those Pillow cannot
    decode completely (missing, truncated, not an image).
    """
    labels = dataset.labels.numpy()
    pool, test = train_test_split(dataset)
    split_indices: dict[str, np.ndarray] = {"train": pool}
    roles = dataset.roles
    if roles is not None:
        split_indices["query"] = test[roles[test] == "query"]
        split_indices["gallery"] = test[roles[test] == "gallery"]
    else:
        split_indices["test"] = test
    counts = np.bincount(labels, minlength=len(dataset.class_names))
    present = counts[counts > 0]
    paths = dataset.paths
    root = Path(dataset.metadata.get("root", ""))
    unreadable = dataset.find_unreadable()
    duplicate_groups = _duplicate_files(paths, set(unreadable))
    splits = {name: {"classes": int(np.unique(labels[indices]).size), "images": int(len(indices))}
              for name, indices in split_indices.items()}
    overlap = int(np.intersect1d(labels[pool], labels[test]).size)
    summary: dict[str, Any] = {
        "dataset": dataset.name,
        "root": str(root),
        "content_hash": dataset.content_hash,
        "classes": len(dataset.class_names),
        "images": len(dataset),
        "declared_split": dataset.test is not None,
        "images_per_class": {
            "min": int(present.min()) if present.size else 0,
            "median": float(np.median(present)) if present.size else 0.0,
            "max": int(present.max()) if present.size else 0,
        },
        "singleton_classes": int((counts == 1).sum()),
        "splits": splits,
        **splits,
        "unreadable": {"count": len(unreadable), "files": [_relative(paths[i], root) for i in unreadable]},
        "duplicate_files": {
            "groups": len(duplicate_groups),
            "files": sum(len(group) for group in duplicate_groups),
            "examples": [[_relative(paths[i], root) for i in group] for group in duplicate_groups[:10]],
        },
        "train_test_class_overlap": overlap,
    }
    if roles is not None:
        gallery_classes = set(labels[split_indices["gallery"]].tolist())
        summary["queries_without_gallery_class"] = int(
            sum(label not in gallery_classes for label in labels[split_indices["query"]].tolist()))
    skipped = list(dataset.metadata.get("skipped_links", []))
    summary["skipped_links"] = skipped
    problems = []
    if unreadable:
        problems.append(f"{len(unreadable)} unreadable images")
    if skipped:
        problems.append(f"{len(skipped)} linked folder(s) not followed (they show images the root lists already)")
    if duplicate_groups:
        problems.append(f"{len(duplicate_groups)} groups of identical files")
    if overlap:
        problems.append(f"{overlap} classes shared by train and test")
    if summary.get("queries_without_gallery_class"):
        problems.append(f"{summary['queries_without_gallery_class']} queries whose class has no gallery image")
    problems += [f"split {name} is empty" for name, sizes in splits.items() if sizes["images"] == 0]
    summary["problems"] = problems
    return summary


def format_file_summary(summary: dict[str, Any]) -> str:
    """The report of ``summarize_files`` as human-readable lines."""
    per_class = summary["images_per_class"]
    lines = [
        f"dataset        {summary['dataset']}  ({summary['images']} images under {summary['root']})",
        f"content hash   {summary['content_hash']}",
        f"classes        {summary['classes']}  ({summary['singleton_classes']} with a single image)",
        f"per class      min {per_class['min']}, median {per_class['median']:g}, max {per_class['max']} images",
        "splits         (" + ("declared by the dataset" if summary["declared_split"] else "first half of the classes trains") + ")",
    ]
    for name, sizes in summary["splits"].items():
        lines.append(f"  {name:<12} {sizes['images']:>8} images  {sizes['classes']:>6} classes")
    unreadable = summary["unreadable"]
    lines.append(f"unreadable     {unreadable['count']} images" + (": " + ", ".join(unreadable["files"][:5]) if unreadable["count"] else ""))
    duplicates = summary["duplicate_files"]
    lines.append(f"duplicates     {duplicates['groups']} groups of identical files ({duplicates['files']} files)")
    # Named here too: a count alone sends the user to --json to find which files to remove.
    lines += [f"  identical    {' = '.join(group)}" for group in duplicates["examples"]]
    if duplicates["groups"] > len(duplicates["examples"]):
        lines.append(f"  (the first {len(duplicates['examples'])} of {duplicates['groups']} groups)")
    if summary.get("skipped_links"):
        lines.append(f"links          {len(summary['skipped_links'])} folder(s) link inside the root, not followed: "
                     + ", ".join(summary["skipped_links"][:5]))
    lines.append(f"overlap        {summary['train_test_class_overlap']} classes in both train and test")
    if "queries_without_gallery_class" in summary:
        lines.append(f"queries        {summary['queries_without_gallery_class']} whose class has no gallery image")
    lines.append("status         " + ("OK" if not summary["problems"] else "PROBLEMS: " + "; ".join(summary["problems"])))
    return "\n".join(lines)


def _duplicate_files(paths: list[Path], skip: set[int]) -> list[list[int]]:
    """Groups (of >= 2 item indices) of files with identical bytes, by sha256."""
    by_digest: dict[str, list[int]] = {}
    for index, path in enumerate(paths):
        if index in skip:
            continue
        try:
            digest = file_sha256(path)
        except OSError:
            continue
        by_digest.setdefault(digest, []).append(index)
    return [group for group in by_digest.values() if len(group) > 1]


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)
