"""Querying a stored index with images or embeddings, and writing the answers as JSON and HTML."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dmlbench.data.base import ImageDataset
from dmlbench.deploy.embeddings import EmbeddingSet, prefix_of, side_file
from dmlbench.deploy.images import InputSpec, model_inputs
from dmlbench.deploy.index import Hit, StoredIndex
from dmlbench.deploy.model import load_run_model
from dmlbench.deploy.pages import Row, Thumbnails, Tile, write_page
from dmlbench.errors import UserInputError
from dmlbench.files import atomic_write, load_array


@dataclass(frozen=True)
class Queries:
    """Query embeddings ``[Q, D]`` with, where known, their names (paths) and labels."""

    embeddings: np.ndarray
    names: list[str]
    labels: list[int | None]


def image_queries(index: StoredIndex, image: Path, label: int | None, device: str | None = None) -> Queries:
    """One image, embedded with the run and evaluation transform that made the index's embeddings."""
    source = index.meta.get("embeddings", {})
    if "run" not in source or "input" not in source:
        raise UserInputError(f"index {index.directory} does not record the run that made it; query it with --embeddings")
    run = load_run_model(source["run"], device)
    spec = InputSpec.from_dict(source["input"])
    return Queries(run.embed(model_inputs([image], spec)).numpy(), [str(image)], [label])


def embedding_queries(path: Path) -> Queries:
    """``Q.npy`` ``[Q, D]`` (or one vector ``[D]``); an embedding set's paths and labels come along."""
    prefix = prefix_of(path)
    if side_file(prefix, ".paths.txt").is_file() or side_file(prefix, ".labels.npy").is_file():
        stored = EmbeddingSet.load(prefix)
        labels = [None] * len(stored.paths) if stored.labels is None else [int(v) for v in stored.labels]
        return Queries(np.asarray(stored.embeddings), stored.paths, labels)
    array = load_array(Path(path), "query embeddings")
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.number):
        raise UserInputError(f"query embeddings {path} must be a numeric array [Q, D]; got shape {list(array.shape)}")
    return Queries(array, [f"query {i}" for i in range(len(array))], [None] * len(array))


def answer(index: StoredIndex, queries: Queries, k: int) -> list[list[Hit]]:
    ids, distances = index.search(queries.embeddings, k)
    return index.hits(ids, distances)


def write_json(path: Path, queries: Queries, answers: list[list[Hit]]) -> None:
    payload: list[dict[str, Any]] = [
        {"query": name, "label": label, "neighbors": [hit.to_dict() for hit in hits]}
        for name, label, hits in zip(queries.names, queries.labels, answers)
    ]
    text = json.dumps(payload, indent=2) + "\n"
    atomic_write(path, lambda stream: stream.write(text.encode()))


def write_html(path: Path, index: StoredIndex, queries: Queries, answers: list[list[Hit]]) -> None:
    thumbnails = Thumbnails(_dataset_of(index, [hit.path for hits in answers for hit in hits] + queries.names))
    rows = []
    for name, label, hits in zip(queries.names, queries.labels, answers):
        neighbours = [
            Tile(thumbnails(hit.path), f"#{rank} d={hit.distance:.3f}" + ("" if hit.label is None else f" label {hit.label}"),
                 None if label is None or hit.label is None else hit.label == label)
            for rank, hit in enumerate(hits, start=1)
        ]
        heading = name if label is None else f"{name} (label {label})"
        rows.append(Row(Tile(thumbnails(name), "query"), neighbours, heading))
    write_page(path, f"{len(rows)} queries against {index.directory.name} ({index.kind}, {len(index)} items)", rows)


def _dataset_of(index: StoredIndex, names: list[str]) -> ImageDataset | None:
    """The run's dataset, loaded only when some item is an in-memory dataset item rather than a file."""
    if all(Path(name).is_file() or ":" not in name for name in names):
        return None
    run_dir = index.meta.get("embeddings", {}).get("run")
    if run_dir is None or not Path(run_dir).is_dir():
        return None
    return load_run_model(run_dir, "cpu").dataset()
