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
from dmlbench.errors import ParameterError, UserInputError
from dmlbench.evaluation.rerank import KReciprocal, Reranking, build, reranked_neighbors
from dmlbench.files import atomic_write, load_array


@dataclass(frozen=True)
class Queries:
    """Query embeddings ``[Q, D]`` with, where known, their names (paths) and labels."""

    embeddings: np.ndarray
    names: list[str]
    labels: list[int | None]


def image_queries(index: StoredIndex, image: Path, label: str | None, device: str | None = None) -> Queries:
    """One image, embedded with the run and evaluation transform that made the index's embeddings;
    ``label`` (a class name or number, ``resolve_label``) marks its correct neighbours."""
    source = index.meta.get("embeddings", {})
    if "run" not in source or "input" not in source:
        raise ParameterError("image", f"cannot be embedded: index {index.directory} does not record the run that made it; "
                             "query it with `embeddings`")
    number = None if label is None else resolve_label(index, label)  # before the model loads: a typo is said at once
    run = load_run_model(source["run"], device)
    spec = InputSpec.from_dict(source["input"])
    return Queries(run.embed(model_inputs([image], spec)).numpy(), [str(image)], [number])


def class_name_text(index: StoredIndex, label: int) -> str:
    """`` (NAME)`` after a label number where the index knows its class name, else nothing."""
    names = index.class_names
    return f" ({names[label]})" if names is not None and 0 <= label < len(names) else ""


def resolve_label(index: StoredIndex, text: str) -> int:
    """The label number of ``--label``: a class name the index stores (``dmlbench embed`` records the
    dataset's), a number, or ``#N`` for the number N where a class is also named N (glyphs has a class
    "5"; a folder dataset may have "001"): such a clash is refused rather than guessed."""
    names = index.class_names
    digits = text[1:] if text.startswith("#") else text
    number = int(digits) if digits.lstrip("-").isdigit() else None
    if names is not None and text in names:
        found = names.index(text)
        if number is not None and number != found and 0 <= number < len(names):
            raise ParameterError("label", f"{text} is ambiguous: class {text!r} has label {found}, and label {number} is "
                                 f"class {names[number]!r}; write it #{number} for the number")
        return found
    if number is None:
        shown = "it stores no class names (an embedding set made before they were recorded)" if names is None else (
            f"its classes are {', '.join(names[:10])}" + (f" and {len(names) - 10} more" if len(names) > 10 else ""))
        raise ParameterError("label", f"{text!r} is neither a class name of index {index.directory} nor a number; {shown}")
    if names is not None and not 0 <= number < len(names):
        raise ParameterError("label", f"{text} is not a class of index {index.directory} (labels 0 to {len(names) - 1})")
    return number


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
        raise ParameterError("fmr", f"needs a calibration: index {index.directory} stores none; give `calibration` FILE")
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


def query_reranking(rerank: str | None, params: dict[str, Any], calibrated: str | None) -> Reranking | None:
    """The re-ranking of kind ``rerank`` (``dmlbench query --rerank``) with ``params``: query expansion; k-reciprocal, and any
    re-ranking where a calibration applies (``calibrated``: where it comes from), are refused (one
    line each). Asked before the calibration's target is chosen, so that the refusal is the first
    and only message, not one after a request for ``--fmr``."""
    method = None if rerank is None else build(rerank, **params)
    if isinstance(method, KReciprocal):
        raise UserInputError("dmlbench query re-ranks with query_expansion only: k-reciprocal encoding needs the "
                             "neighbourhoods of every query and stored item computed together (Zhong et al. 2017, eq. 4-7)")
    if method is not None and calibrated is not None:
        # Query expansion moves every vector, so its distances are on another scale than the raw ones
        # the threshold was chosen on: a threshold applied to them would claim an FMR it never had.
        raise ParameterError("rerank", f"cannot be used with a calibration ({calibrated}): its thresholds were chosen on "
                             "raw distances, which re-ranking replaces; query without `rerank` for calibrated "
                             "matches, or re-rank an index built without `calibration`")
    return method


def calibration_source(index: StoredIndex, calibration: Path | None) -> str | None:
    """Where the calibration ``query`` would apply comes from (``--calibration`` or the index), or ``None``."""
    if calibration is not None:
        return str(calibration)
    return f"stored with index {index.directory}" if index.calibration is not None else None


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
