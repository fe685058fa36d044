"""A faiss index over an embedding set, stored with its paths and labels, answering k-NN queries.

``exact`` (a flat inner-product index over the unit rows) returns exactly the evaluation engine's
neighbours: candidates are re-ranked by the exact float64 distance with ties broken by index and
certified as in ``dmlbench.evaluation.neighbors``. ``ivf`` (inverted lists) and ``hnsw`` (a graph)
propose candidates faster but may miss some; their recall@10 against ``exact`` is measured when the
index is built. Distances are Euclidean between L2-normalised embeddings, as in ``evaluate``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any

import faiss
import numpy as np
import torch
from torch import Tensor

from dmlbench import __version__, files, provenance
from dmlbench.deploy.calibration import check_same_model, index_hashes, load_calibration
from dmlbench.deploy.embeddings import EmbeddingSet
from dmlbench.errors import ParameterError, UserInputError
from dmlbench.evaluation.knn_faiss import HNSW_EF_SEARCH, HNSW_NEIGHBOURS, add_with_one_thread
from dmlbench.evaluation.knn_index import KnnIndex, prepare
from dmlbench.evaluation.neighbors import nearest_neighbors
from dmlbench.files import atomic_write
from dmlbench.validation import check_positive_int

KINDS = ("exact", "ivf", "hnsw")
INDEX_FILE, EMBEDDINGS_FILE, LABELS_FILE, PATHS_FILE, META_FILE = (
    "index.faiss", "embeddings.npy", "labels.npy", "paths.txt", "index.json",
)
CALIBRATION_FILE = "calibration.json"  # the thresholds stored with the index (``index --calibration``)
RECALL_K = 10
RECALL_QUERIES = 1000


@dataclass(frozen=True)
class Hit:
    """One neighbour: its row in the index, path, label (``None`` when unknown) and distance."""

    index: int
    path: str
    label: int | None
    distance: float

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "path": self.path, "label": self.label, "distance": self.distance}


@dataclass
class StoredIndex:
    """An index directory: the faiss index, the float32 rows for exact re-ranking, paths, labels, meta."""

    directory: Path
    faiss_index: faiss.Index
    embeddings: np.ndarray
    labels: np.ndarray | None
    paths: list[str]
    meta: dict[str, Any]
    calibration: dict[str, Any] | None = None

    @property
    def kind(self) -> str:
        return str(self.meta["kind"])

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    def __len__(self) -> int:
        return int(self.embeddings.shape[0])

    @property
    def class_names(self) -> list[str] | None:
        """The names of the labels (label i is name i), as the embedding set recorded them; ``None`` if it did not."""
        names = self.meta.get("embeddings", {}).get("class_names")
        return None if names is None else [str(name) for name in names]

    @classmethod
    def load(cls, directory: str | Path) -> StoredIndex:
        directory = Path(directory)
        meta_file = directory / META_FILE
        if not meta_file.is_file():
            raise UserInputError(f"{directory} is not a dmlbench index (no {META_FILE}); build one with dmlbench index")
        meta = _read_part(directory, META_FILE, files.read_json)
        index = _read_part(directory, INDEX_FILE, lambda path: faiss.read_index(str(path)))
        embeddings = _read_part(directory, EMBEDDINGS_FILE, lambda path: np.load(path, mmap_mode="r", allow_pickle=False))
        labels = (_read_part(directory, LABELS_FILE, lambda path: np.load(path, allow_pickle=False))
                  if (directory / LABELS_FILE).is_file() else None)
        paths = _read_part(directory, PATHS_FILE, lambda path: path.read_text().splitlines())
        calibration = (_read_part(directory, CALIBRATION_FILE, files.read_json)
                       if (directory / CALIBRATION_FILE).is_file() else None)
        if not isinstance(meta, dict) or "kind" not in meta:
            raise UserInputError(f"{directory / META_FILE} is not an index description written by dmlbench index; "
                                 "rebuild the index with dmlbench index EMBEDDINGS -o NEW_DIR")
        if calibration is not None and not (isinstance(calibration, dict) and isinstance(calibration.get("targets"), list)):
            raise UserInputError(f"{directory / CALIBRATION_FILE} is not a calibration; rebuild the index with "
                                 "dmlbench index EMBEDDINGS -o NEW_DIR --calibration CALIBRATION.json")
        _configure(index, meta)
        return cls(directory, index, embeddings, labels, paths, meta, calibration)

    def search(self, queries: np.ndarray | Tensor, k: int) -> tuple[Tensor, Tensor]:
        """Row ids ``[Q, k]`` and Euclidean distances ``[Q, k]`` of the k nearest stored items."""
        queries = self.checked_queries(queries, k)
        return _search(self.faiss_index, self.embeddings, queries, k, certify=self.kind == "exact")

    def checked_queries(self, queries: np.ndarray | Tensor, k: int) -> Tensor:
        """``queries`` as float64 ``[Q, D]`` once they and ``k`` fit the index (one-line errors otherwise)."""
        queries = torch.as_tensor(np.asarray(queries, dtype=np.float64))
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise UserInputError(
                f"queries have dimension {queries.shape[-1] if queries.ndim else 0}, but the index holds "
                f"{self.dim}-dimensional embeddings"
            )
        if not bool(torch.isfinite(queries).all()):
            raise UserInputError("queries contain NaN or Inf values")
        check_positive_int("k", k)
        if k > len(self):
            raise UserInputError(f"k={k} exceeds the {len(self)} items in the index")
        return queries

    def hits(self, ids: Tensor, distances: Tensor) -> list[list[Hit]]:
        return [
            [
                Hit(int(i), self.paths[int(i)], None if self.labels is None else int(self.labels[int(i)]), float(d))
                for i, d in zip(row_ids, row_distances)
            ]
            for row_ids, row_distances in zip(ids.tolist(), distances.tolist())
        ]


def _read_part(directory: Path, name: str, read: Callable[[Path], Any]) -> Any:
    """One file of an index directory read by ``read``, or one line naming it when it is damaged (cut
    short by an interrupted copy, edited by hand): faiss, json and numpy each raise their own error,
    none of which names the file or the way out."""
    path = directory / name
    try:
        return read(path)
    except (OSError, RuntimeError, ValueError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        # faiss's own message is a C++ assertion; the file name and the way out are what a user needs.
        reason = "not a complete faiss index" if isinstance(error, RuntimeError) else str(error).splitlines()[0]
        raise UserInputError(f"index file {path} is damaged or missing ({reason}); rebuild the index with "
                             "dmlbench index EMBEDDINGS -o NEW_DIR") from None


def build_index(
    embedding_set: EmbeddingSet,
    out: str | Path,
    *,
    kind: str = "exact",
    seed: int = 0,
    nprobe: int | None = None,
    ef_search: int = HNSW_EF_SEARCH,
    calibration: Path | None = None,
) -> StoredIndex:
    """Build and store an index of ``embedding_set``; approximate kinds get their recall@10 measured.
    ``calibration`` (a ``calibration.json`` of the model that made the embeddings, checked by its
    model and config hashes) is stored with the index, so that queries apply its thresholds."""
    if kind not in KINDS:
        raise ParameterError("kind", f"must be one of {', '.join(KINDS)}; got {kind!r}")
    thresholds = None
    if calibration is not None:
        thresholds = load_calibration(calibration)
        check_same_model(thresholds, index_hashes(embedding_set.meta), str(calibration), f"embeddings {embedding_set.prefix}")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserInputError(f"index directory {out} already exists and is not empty")
    rows = np.asarray(embedding_set.embeddings, dtype=np.float64)
    if not np.isfinite(rows).all():
        raise UserInputError(f"embeddings {embedding_set.prefix}.npy contain NaN or Inf values")
    if len(rows) < 1:
        raise UserInputError(f"embeddings {embedding_set.prefix}.npy are empty")
    space = prepare(torch.from_numpy(rows), normalize=True, binarize=False)
    reference_rows = np.ascontiguousarray(space.reference_rows.numpy())
    started = time.perf_counter()
    index, parameters = _new_index(kind, reference_rows, seed=seed, nprobe=nprobe, ef_search=ef_search)
    meta: dict[str, Any] = {
        "kind": kind,
        "items": len(rows),
        "dim": rows.shape[1],
        "metric": "euclidean on L2-normalised embeddings",
        "parameters": parameters,
        "seed": seed,
        "build_seconds": round(time.perf_counter() - started, 3),
        "embeddings": {"prefix": str(embedding_set.prefix.resolve()), **embedding_set.meta},
        "built": provenance.now(),
        "dmlbench": __version__,
        "faiss": faiss.__version__,
    }
    _configure(index, meta)
    if kind != "exact":
        meta["recall_at_10"] = _recall_against_exact(index, rows, seed)
    if thresholds is not None:
        meta["calibration"] = {"file": CALIBRATION_FILE, "source": str(Path(calibration).resolve()),
                               "target_fmrs": [point["target_fmr"] for point in thresholds["targets"]]}
    out.mkdir(parents=True, exist_ok=True)
    if thresholds is not None:
        files.write_json(out / CALIBRATION_FILE, thresholds)
    _store(out, index, rows.astype(np.float32), embedding_set, meta)
    return StoredIndex.load(out)


def _new_index(kind: str, rows: np.ndarray, *, seed: int, nprobe: int | None, ef_search: int) -> tuple[faiss.Index, dict[str, Any]]:
    count, dim = rows.shape
    if kind == "exact":
        index = faiss.IndexFlatIP(dim)
        index.add(rows)
        return index, {}
    if kind == "ivf":
        # sqrt(N) lists, but no fewer than 39 training points per centroid (faiss warns below that).
        lists = max(1, min(round(math.sqrt(count)), count // 39))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, lists, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = seed
        index.train(rows)
        index.add(rows)
        return index, {"nlist": lists, "nprobe": nprobe if nprobe is not None else max(1, lists // 8)}
    check_positive_int("ef_search", ef_search)
    index = faiss.IndexHNSWFlat(dim, HNSW_NEIGHBOURS, faiss.METRIC_INNER_PRODUCT)
    add_with_one_thread(index, rows)
    return index, {"M": HNSW_NEIGHBOURS, "ef_construction": index.hnsw.efConstruction, "ef_search": ef_search}


def _configure(index: faiss.Index, meta: dict[str, Any]) -> None:
    parameters = meta.get("parameters", {})
    if meta["kind"] == "ivf":
        index.nprobe = int(parameters["nprobe"])
    elif meta["kind"] == "hnsw":
        index.hnsw.efSearch = int(parameters["ef_search"])


def _search(index: faiss.Index, stored: np.ndarray, queries: Tensor, k: int, *, certify: bool) -> tuple[Tensor, Tensor]:
    """Exact re-ranking of the index's candidates, in one ``KnnIndex`` of the stored rows and the queries."""
    count = len(stored)
    space: KnnIndex = prepare(torch.cat([torch.from_numpy(np.asarray(stored, dtype=np.float64)), queries]), normalize=True, binarize=False)

    def candidates(query_ids: Tensor, width: int) -> tuple[Tensor, Tensor]:
        scores, ids = index.search(np.ascontiguousarray(space.search_rows[query_ids].numpy()), width)
        found = torch.from_numpy(ids).long()
        return torch.from_numpy(scores).masked_fill(found < 0, -math.inf), found

    neighbours = nearest_neighbors(
        space, torch.arange(count, count + len(queries)), torch.arange(count), k,
        exclude_self=False, searcher=candidates, certify=certify,
    )
    return neighbours.ids, neighbours.distances.clamp_min(0.0).sqrt()


def _recall_against_exact(index: faiss.Index, rows: np.ndarray, seed: int) -> float:
    """Mean share of the exact 10 nearest neighbours that the index returns, over up to 1000 stored rows."""
    generator = np.random.default_rng(seed)
    sample = np.sort(generator.choice(len(rows), size=min(RECALL_QUERIES, len(rows)), replace=False))
    k = min(RECALL_K, len(rows))
    queries = torch.from_numpy(rows[sample])
    exact = faiss.IndexFlatIP(rows.shape[1])
    exact.add(np.ascontiguousarray(prepare(torch.from_numpy(rows), normalize=True, binarize=False).reference_rows.numpy()))
    truth, _ = _search(exact, rows, queries, k, certify=True)
    found, _ = _search(index, rows, queries, k, certify=False)
    shared = [len(set(a) & set(b)) for a, b in zip(truth.tolist(), found.tolist())]
    return float(np.mean(shared) / k)


def _store(out: Path, index: faiss.Index, rows: np.ndarray, embedding_set: EmbeddingSet, meta: dict[str, Any]) -> None:
    atomic_write(out / INDEX_FILE, lambda stream: stream.write(faiss.serialize_index(index).tobytes()))
    atomic_write(out / EMBEDDINGS_FILE, lambda stream: np.save(stream, rows, allow_pickle=False))
    if embedding_set.labels is not None:
        labels = np.asarray(embedding_set.labels, dtype=np.int64)
        atomic_write(out / LABELS_FILE, lambda stream: np.save(stream, labels, allow_pickle=False))
    files.atomic_write_text(out / PATHS_FILE, "".join(f"{path}\n" for path in embedding_set.paths))
    # The meta file last: an index directory without it is incomplete and is refused on load.
    files.write_json(out / META_FILE, meta)
