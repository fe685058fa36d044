"""faiss candidate search: exact flat indexes, or inverted-file and HNSW graph indexes for very large galleries.

Scores follow ``KnnIndex``'s convention (larger is nearer), so the exact re-ranking in
``dmlbench.evaluation.neighbors`` treats faiss and the torch engine alike.
"""

from __future__ import annotations

import math

import faiss
import numpy as np
import torch
from torch import Tensor

from dmlbench.evaluation.knn_index import KnnIndex

# HNSW graph degree (faiss's M) and the least efSearch; the values faiss's documentation starts from.
HNSW_NEIGHBOURS = 32
HNSW_EF_SEARCH = 64


def candidate_search(
    space: KnnIndex,
    query_ids: Tensor,
    reference_ids: Tensor,
    width: int,
    *,
    exclude_self: bool,
    kind: str = "exact",
    nprobe: int | None = None,
    seed: int = 0,
) -> tuple[Tensor, Tensor]:
    """Top ``width`` candidates per query from a faiss index of ``kind`` (``exact``, ``ivf``, ``hnsw``):
    (scores ``[Q, width]``, global reference ids)."""
    index = _build_index(space, reference_ids, kind=kind, nprobe=nprobe, seed=seed)
    if kind == "hnsw":
        # The graph search keeps efSearch candidates: at least the width asked for.
        index.hnsw.efSearch = max(HNSW_EF_SEARCH, width + int(exclude_self))
    wanted = min(width + int(exclude_self), len(reference_ids))
    if space.binary:
        hamming, positions = index.search(space.exact_rows[query_ids].numpy(), wanted)
        scores = space.dim - 2.0 * torch.from_numpy(hamming.astype(np.float32))
    else:
        raw_scores, positions = index.search(space.search_rows[query_ids].numpy(), wanted)
        scores = torch.from_numpy(raw_scores)
    positions = torch.from_numpy(positions).long()
    found = positions >= 0
    ids = torch.where(found, reference_ids[positions.clamp_min(0)], positions)
    scores = scores.masked_fill(~found, -math.inf)
    if exclude_self:
        # Stable sort moves the query itself (wherever ties put it) behind the other candidates.
        order = (ids == query_ids.unsqueeze(1)).to(torch.int8).argsort(dim=1, stable=True)[:, :width]
        ids, scores = ids.gather(1, order), scores.gather(1, order)
    return scores[:, :width].contiguous(), ids[:, :width].contiguous()


def _build_index(
    space: KnnIndex, reference_ids: Tensor, *, kind: str, nprobe: int | None, seed: int
) -> faiss.Index | faiss.IndexBinary:
    num_references = len(reference_ids)
    lists = max(1, round(math.sqrt(num_references)))
    if space.binary:
        references = space.exact_rows[reference_ids].numpy()
        bits = references.shape[1] * 8
        if kind == "ivf":
            index = faiss.IndexBinaryIVF(faiss.IndexBinaryFlat(bits), bits, lists)
            index.cp.seed = seed
            index.train(references)
        elif kind == "hnsw":
            index = faiss.IndexBinaryHNSW(bits, HNSW_NEIGHBOURS)
        else:
            index = faiss.IndexBinaryFlat(bits)
    else:
        references = np.ascontiguousarray(space.reference_rows[reference_ids].numpy())
        dim = references.shape[1]
        if kind == "ivf":
            index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, lists, faiss.METRIC_INNER_PRODUCT)
            index.cp.seed = seed
            index.train(references)
        elif kind == "hnsw":
            index = faiss.IndexHNSWFlat(dim, HNSW_NEIGHBOURS, faiss.METRIC_INNER_PRODUCT)
        else:
            index = faiss.IndexFlatIP(dim)
    if kind == "hnsw":
        add_with_one_thread(index, references)
    else:
        index.add(references)
    if kind == "ivf":
        index.nprobe = nprobe if nprobe is not None else max(1, lists // 8)
    return index


def add_with_one_thread(index: faiss.Index | faiss.IndexBinary, rows: np.ndarray) -> None:
    """``index.add(rows)`` on one faiss thread: a graph built by several depends on their timing."""
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        index.add(rows)
    finally:
        faiss.omp_set_num_threads(threads)
