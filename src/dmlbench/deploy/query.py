"""Querying a stored index with images or embeddings, and writing the answers as JSON and HTML."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dmlbench.data.base import ImageDataset
from dmlbench.deploy.calibration import check_same_model, index_hashes, load_calibration, select_target
from dmlbench.deploy.embeddings import EmbeddingSet, prefix_of, side_file
from dmlbench.deploy.images import InputSpec, model_inputs
from dmlbench.deploy.index import Hit, StoredIndex
from dmlbench.deploy.model import load_run_model
from dmlbench.deploy.pages import Row, Thumbnails, Tile, write_page
from dmlbench.errors import UserInputError
from dmlbench.evaluation.rerank import KReciprocal, Reranking, build, reranked_neighbors
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


@dataclass(frozen=True)
class Threshold:
    """A calibrated distance threshold: a query whose nearest item is farther has no match."""

    value: float
    target_fmr: float
    source: str

    def matches(self, hits: list[Hit]) -> bool:
        return bool(hits) and hits[0].distance <= self.value

    def verdict(self, hits: list[Hit]) -> str:
        nearest = hits[0].distance
        if self.matches(hits):
            return f"match: nearest {nearest:.4f} <= threshold {self.value:.4f} (FMR {self.target_fmr:g})"
        return f"no match: nearest {nearest:.4f} > threshold {self.value:.4f} (FMR {self.target_fmr:g})"

    def to_dict(self, hits: list[Hit]) -> dict[str, Any]:
        return {"match": self.matches(hits), "threshold": self.value, "target_fmr": self.target_fmr}


def query_threshold(index: StoredIndex, calibration: Path | None, fmr: float | None) -> Threshold | None:
    """The threshold at target ``fmr`` of ``calibration`` (checked against the index's model), or of
    the calibration stored with the index; ``None`` when there is neither."""
    if calibration is not None:
        document = load_calibration(calibration)
        check_same_model(document, index_hashes(index.meta.get("embeddings", {})), str(calibration), f"index {index.directory}")
        source = str(calibration)
    elif index.calibration is not None:
        document, source = index.calibration, f"stored with index {index.directory}"
    elif fmr is not None:
        raise UserInputError(f"--fmr needs a calibration: index {index.directory} stores none; give --calibration FILE")
    else:
        return None
    point = select_target(document, fmr, source)
    return Threshold(float(point["threshold"]), float(point["target_fmr"]), source)


def answer(index: StoredIndex, queries: Queries, k: int, rerank: Reranking | None = None) -> list[list[Hit]]:
    """The ``k`` nearest stored items of each query; with ``rerank`` (query expansion only) the lists after
    re-ranking, with the Euclidean distance of the expanded unit vectors."""
    if rerank is None:
        ids, distances = index.search(queries.embeddings, k)
        return index.hits(ids, distances)
    vectors = index.checked_queries(queries.embeddings, k)
    stored = torch.from_numpy(np.asarray(index.embeddings, dtype=np.float64))
    # Exact: DBA expands the stored items among themselves and each query is expanded against them
    # alone, so a query's answer does not depend on the other queries (as evaluate with a query mask).
    found = reranked_neighbors(torch.cat([stored, vectors]), torch.arange(len(stored), len(stored) + len(vectors)),
                               torch.arange(len(stored)), k, exclude_self=False, method=rerank)
    return index.hits(found.ids, found.distances.clamp_min(0.0).sqrt())


def query_reranking(kind: str | None, params: dict[str, Any], threshold: Threshold | None) -> Reranking | None:
    """The re-ranking ``dmlbench query --rerank`` asked for: query expansion; k-reciprocal and a calibrated
    threshold are refused (one line each)."""
    method = None if kind is None else build(kind, **params)
    if isinstance(method, KReciprocal):
        raise UserInputError("dmlbench query re-ranks with query_expansion only: k-reciprocal encoding needs the "
                             "neighbourhoods of every query and stored item computed together (Zhong et al. 2017, eq. 4-7)")
    if method is not None and threshold is not None:
        raise UserInputError(f"--rerank cannot be combined with a calibration ({threshold.source}): its thresholds hold "
                             "raw distances, not re-ranked ones")
    return method


def write_json(path: Path, queries: Queries, answers: list[list[Hit]], threshold: Threshold | None = None) -> None:
    """Each query's neighbours; with a ``threshold``, whether it has a match (``match``: false is "no match")."""
    payload: list[dict[str, Any]] = [
        {"query": name, "label": label, **({} if threshold is None else threshold.to_dict(hits)),
         "neighbors": [hit.to_dict() for hit in hits]}
        for name, label, hits in zip(queries.names, queries.labels, answers)
    ]
    text = json.dumps(payload, indent=2) + "\n"
    atomic_write(path, lambda stream: stream.write(text.encode()))


def write_html(path: Path, index: StoredIndex, queries: Queries, answers: list[list[Hit]], threshold: Threshold | None = None) -> None:
    thumbnails = Thumbnails(_dataset_of(index, [hit.path for hits in answers for hit in hits] + queries.names))
    rows = []
    for name, label, hits in zip(queries.names, queries.labels, answers):
        neighbours = [
            Tile(thumbnails(hit.path), f"#{rank} d={hit.distance:.3f}" + ("" if hit.label is None else f" label {hit.label}"),
                 None if label is None or hit.label is None else hit.label == label)
            for rank, hit in enumerate(hits, start=1)
        ]
        heading = name if label is None else f"{name} (label {label})"
        verdict = "" if threshold is None else threshold.verdict(hits)
        rows.append(Row(Tile(thumbnails(name), "query"), neighbours, heading, verdict,
                        None if threshold is None else threshold.matches(hits)))
    write_page(path, f"{len(rows)} queries against {index.directory.name} ({index.kind}, {len(index)} items)", rows)


def _dataset_of(index: StoredIndex, names: list[str]) -> ImageDataset | None:
    """The run's dataset, loaded only when some item is an in-memory dataset item rather than a file."""
    if all(Path(name).is_file() or ":" not in name for name in names):
        return None
    run_dir = index.meta.get("embeddings", {}).get("run")
    if run_dir is None or not Path(run_dir).is_dir():
        return None
    return load_run_model(run_dir, "cpu").dataset()
