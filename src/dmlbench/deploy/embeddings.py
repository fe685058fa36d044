"""Embedding a collection with a run's model, resumably, into ``EMB.npy`` and its side files.

``EMB`` is a path prefix: ``EMB.npy`` (float32 ``[N, D]``), ``EMB.labels.npy`` (int64 ``[N]``, when
labels are known), ``EMB.paths.txt`` (one item per line) and ``EMB.json`` (which run, checkpoint,
collection and input spec made them). Rows are written into ``EMB.npy.partial`` with the number of
finished rows in ``EMB.progress.json``; a rerun of the same command continues there, and
``EMB.npy`` appears only when every row is in, so its presence means the set is complete.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from dmlbench import __version__, files
from dmlbench.data.base import ImageDataset
from dmlbench.deploy.images import InputSpec, model_inputs
from dmlbench.deploy.model import RunModel
from dmlbench.errors import RunInterrupted, UserInputError
from dmlbench.files import atomic_write, file_sha256
from dmlbench.training import records
from dmlbench.validation import check_positive_int


def prefix_of(path: str | Path) -> Path:
    """``out/emb`` and ``out/emb.npy`` name the same set."""
    path = Path(path)
    return path.with_suffix("") if path.suffix == ".npy" else path


def side_file(prefix: Path, suffix: str) -> Path:
    return prefix.with_name(prefix.name + suffix)


@dataclass
class Collection:
    """Items to embed: ``inputs(start, stop)`` gives model inputs of rows ``[start, stop)``."""

    paths: list[str]
    labels: np.ndarray | None
    inputs: Callable[[int, int], Tensor]
    source: dict[str, Any]
    class_names: list[str] | None = None  # label i is class_names[i]; stored so that query --label takes a name

    def __len__(self) -> int:
        return len(self.paths)


def dataset_collection(dataset: ImageDataset, source: dict[str, Any]) -> Collection:
    """Every readable item of ``dataset`` (a warning counts the others); items without a file are
    named ``<dataset>:<index>``."""
    unreadable = dataset.find_unreadable() if hasattr(dataset, "find_unreadable") else []
    if unreadable and len(unreadable) == len(dataset):
        raise UserInputError(f"dataset {dataset.name!r}: none of its {len(dataset)} images can be read "
                             f"(missing, truncated or not images; dmlbench data check lists them)")
    if unreadable:
        print(f"dmlbench: warning: dataset {dataset.name!r}: skipping {len(unreadable)} unreadable images "
              f"(listed in the output's .json as source.unreadable)", file=sys.stderr, flush=True)
        source = {**source, "unreadable": [str(dataset.paths[i]) for i in unreadable]}
        dataset = dataset.subset(np.setdiff1d(np.arange(len(dataset)), unreadable))
    paths = getattr(dataset, "paths", None)
    names = [str(path) for path in paths] if paths is not None else [f"{dataset.name}:{i}" for i in range(len(dataset))]
    return Collection(
        paths=names,
        labels=np.asarray(dataset.labels, dtype=np.int64),
        inputs=lambda start, stop: dataset.batch(range(start, stop))[0],
        source=source,
        class_names=list(dataset.class_names),
    )


def image_collection(files: Sequence[Path], spec: InputSpec, source: dict[str, Any]) -> Collection:
    """Image files without labels, decoded with the run's evaluation transform."""
    return Collection(
        paths=[str(path) for path in files],
        labels=None,
        inputs=lambda start, stop: model_inputs(files[start:stop], spec),
        source=source,
    )


@dataclass
class EmbeddingSet:
    """A stored embedding set (memory-mapped, read-only)."""

    prefix: Path
    embeddings: np.ndarray
    labels: np.ndarray | None
    paths: list[str]
    meta: dict[str, Any]

    @classmethod
    def load(cls, path: str | Path) -> EmbeddingSet:
        prefix = prefix_of(path)
        array_file = side_file(prefix, ".npy")
        if not array_file.is_file():
            partial = side_file(prefix, ".npy.partial").is_file()
            hint = " (it is incomplete: rerun the embed command to finish it)" if partial else ""
            raise UserInputError(f"embeddings {array_file} do not exist{hint}")
        try:
            embeddings = np.load(array_file, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as error:
            raise UserInputError(f"embeddings {array_file} are not a valid .npy array: {error}") from None
        if embeddings.ndim != 2:
            raise UserInputError(f"embeddings {array_file} must have shape [N, D]; got {list(embeddings.shape)}")
        labels_file, paths_file, meta_file = (side_file(prefix, s) for s in (".labels.npy", ".paths.txt", ".json"))
        labels = np.load(labels_file, allow_pickle=False) if labels_file.is_file() else None
        paths = paths_file.read_text().splitlines() if paths_file.is_file() else [str(i) for i in range(len(embeddings))]
        meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
        for what, values in (("labels", labels), ("paths", paths)):
            if values is not None and len(values) != len(embeddings):
                raise UserInputError(f"{what} beside {array_file} have {len(values)} entries for {len(embeddings)} rows")
        return cls(prefix, embeddings, labels, paths, meta)


def embed_collection(
    run: RunModel,
    collection: Collection,
    out: str | Path,
    *,
    spec: InputSpec,
    batch_size: int = 256,
    progress: bool = True,
) -> tuple[EmbeddingSet, int]:
    """Embed every item (resuming an interrupted job of the same command); returns the set and the
    number of rows computed now (0 when the set was already complete)."""
    check_positive_int("batch_size", batch_size)
    if len(collection) == 0:
        raise UserInputError("the collection to embed is empty")
    prefix = prefix_of(out)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    meta = _meta(run, collection, spec, batch_size)
    array_file, partial_file, progress_file = (side_file(prefix, s) for s in (".npy", ".npy.partial", ".progress.json"))
    if array_file.exists():
        existing = EmbeddingSet.load(prefix)
        if existing.meta.get("fingerprint") != meta["fingerprint"]:
            raise UserInputError(f"{array_file} already exists and holds other embeddings; choose another -o or remove it")
        return existing, 0
    start = _resume_point(partial_file, progress_file, meta["fingerprint"], batch_size)
    if start == 0:
        rows = np.lib.format.open_memmap(partial_file, mode="w+", dtype=np.float32, shape=(len(collection), run.embedding_dim))
        _reserve(partial_file)
        files.write_json(progress_file, {"fingerprint": meta["fingerprint"], "rows_done": 0})
    else:
        rows = np.load(partial_file, mmap_mode="r+")
    computed = 0
    bar = tqdm(total=len(collection), initial=start, desc="embed", unit="img", disable=None if progress else True)
    try:
        for first in range(start, len(collection), batch_size):
            last = min(first + batch_size, len(collection))
            batch = run.embed(collection.inputs(first, last)).numpy()
            if not np.isfinite(batch).all():
                raise UserInputError(f"the model produced NaN or infinite embeddings for rows {first}..{last - 1}; no EMB.npy was written")
            rows[first:last] = batch
            rows.flush()
            # The count moves only after the rows are on disk: a crash repeats at most one batch.
            files.write_json(progress_file, {"fingerprint": meta["fingerprint"], "rows_done": last})
            computed += last - first
            bar.update(last - first)
    except KeyboardInterrupt:
        raise RunInterrupted(f"embedding stopped after {start + computed} rows; the same command continues it") from None
    finally:
        bar.close()
    del rows
    _finish(prefix, collection, meta)
    os.replace(partial_file, array_file)
    progress_file.unlink(missing_ok=True)
    return EmbeddingSet.load(prefix), computed


def _reserve(path: Path) -> None:
    """Give the memory-mapped file its blocks now: a sparse file on a full disk kills the process
    with SIGBUS at the first row that finds no block; reserving fails here with ENOSPC instead."""
    if not hasattr(os, "posix_fallocate"):  # macOS, Windows: no reservation, the mapping as is
        return
    descriptor = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(descriptor, 0, os.fstat(descriptor).st_size)
    except OSError as error:
        if error.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # a filesystem without fallocate
            return
        raise OSError(error.errno, error.strerror, str(path)) from None
    finally:
        os.close(descriptor)


def _meta(run: RunModel, collection: Collection, spec: InputSpec, batch_size: int) -> dict[str, Any]:
    checkpoint = run.run_dir / records.BEST_CHECKPOINT
    identity = {
        "run": str(run.run_dir.resolve()),
        "checkpoint_sha256": file_sha256(checkpoint),
        "source": collection.source,
        "items": len(collection),
        "paths_sha256": hashlib.sha256("\n".join(collection.paths).encode()).hexdigest(),
        "batch_size": batch_size,
    }
    return {
        **identity,
        "fingerprint": hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest(),
        # With checkpoint_sha256, what a calibration of this model must match (training.records.run_hashes).
        "config_sha256": file_sha256(run.run_dir / records.CONFIG_FILE),
        "checkpoint_epoch": run.epoch,
        "embedding_dim": run.embedding_dim,
        "normalized": bool(run.config.model.normalize),
        "input": spec.to_dict(),
        **({} if collection.class_names is None else {"class_names": collection.class_names}),
        "dmlbench": __version__,
        "torch": torch.__version__,
    }


def _resume_point(partial_file: Path, progress_file: Path, fingerprint: str, batch_size: int) -> int:
    """Rows already done by an interrupted job of the same command (0: start afresh)."""
    if not (partial_file.is_file() and progress_file.is_file()):
        return 0
    try:
        progress = files.read_json(progress_file)
    except (OSError, ValueError):
        return 0
    if progress.get("fingerprint") != fingerprint:
        return 0
    done = int(progress.get("rows_done", 0))
    # Resuming on a batch boundary keeps every batch identical to an uninterrupted job's.
    return done - done % batch_size


def _finish(prefix: Path, collection: Collection, meta: dict[str, Any]) -> None:
    if collection.labels is not None:
        labels = collection.labels
        atomic_write(side_file(prefix, ".labels.npy"), lambda stream: np.save(stream, labels, allow_pickle=False))
    files.atomic_write_text(side_file(prefix, ".paths.txt"), "".join(f"{path}\n" for path in collection.paths))
    files.write_json(side_file(prefix, ".json"), meta)
