"""Exact k nearest neighbours, ordered by (exact distance, reference index), from any backend.

A backend proposes float32 candidates; they are re-ranked by the exact key of ``KnnIndex``. A
query's list is *certified* when its k-th exact distance is strictly below the smallest distance
any non-candidate can have (the worst kept candidate's approximate distance minus the error
bound); queries that cannot be certified (ties or near-ties at the boundary) are searched again
with four times as many candidates, until every reference is a candidate. The result is exactly the
brute-force float64 ranking, whatever the backend, block size or thread count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dmlbench.errors import UserInputError
from dmlbench.evaluation import knn_blocked, knn_device, knn_faiss
from dmlbench.evaluation.knn_index import KnnIndex

BACKENDS = ("torch", "faiss", "faiss_approx", "faiss_hnsw")
_FAISS_KINDS = {"faiss": "exact", "faiss_approx": "ivf", "faiss_hnsw": "hnsw"}
APPROXIMATE = ("faiss_approx", "faiss_hnsw")
# (query ids, width) -> (float32 scores [Q, width], larger is nearer; global reference ids, -1 for none).
CandidateSearch = Callable[[Tensor, int], tuple[Tensor, Tensor]]
# Exact keys are computed for at most this many (query, candidate, dimension) entries at a time:
# small chunks stay in cache and reuse memory instead of faulting in fresh pages. A GPU wants large
# ones (each chunk is a few kernel launches); 2**27 float64 entries are 1 GiB.
_EXACT_CHUNK_ENTRIES = 1 << 17
_DEVICE_EXACT_CHUNK_ENTRIES = 1 << 27


@dataclass(frozen=True)
class Neighbors:
    """``ids[q, i]``: global row id of the i-th nearest reference of query q; ``distances``: its exact key."""

    ids: Tensor
    distances: Tensor


def nearest_neighbors(
    space: KnnIndex,
    query_ids: Tensor,
    reference_ids: Tensor,
    k: int,
    *,
    exclude_self: bool,
    backend: str = "torch",
    block_size: int | None = None,
    nprobe: int | None = None,
    seed: int = 0,
    searcher: CandidateSearch | None = None,
    certify: bool = True,
    domains: Tensor | None = None,
) -> Neighbors:
    """The ``k`` nearest ``reference_ids`` (ascending global ids) of each of ``query_ids``.

    ``exclude_self`` removes each query from its own list (queries must then be among the references).
    ``domains`` (an int64 code per row of ``space``) restricts each query's references to the other
    domains: the queries of one domain are searched at a time against the references outside it,
    so the ranking stays exact and ordered by (distance, index) within that restricted gallery.
    ``faiss_approx`` (inverted lists) and ``faiss_hnsw`` (a graph) return the exact ranking of
    approximate candidates, without certification.
    ``searcher`` replaces the backend's candidate search (a stored index, for instance); its scores
    must be products of ``space``'s float32 rows for certification to hold, and ``certify=False``
    ranks whatever it proposes without certification (approximate indexes).
    The search runs on ``space``'s device: backend ``torch`` is ``knn_blocked`` on the CPU and
    ``knn_device`` elsewhere (faiss needs the CPU); the result lies on that device.
    """
    if backend not in BACKENDS:
        raise UserInputError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if domains is not None:
        if searcher is not None:
            raise UserInputError("a stored index searches its whole gallery; it cannot answer cross-domain queries")
        return _cross_domain(space, query_ids, reference_ids, k, domains, backend=backend, block_size=block_size,
                             nprobe=nprobe, seed=seed, certify=certify)
    available = len(reference_ids) - int(exclude_self)
    if not 1 <= k <= available:
        raise UserInputError(f"k={k} must lie in [1, {available}] (the number of references per query)")
    device = space.exact_rows.device
    if device.type != "cpu" and backend != "torch":
        raise UserInputError(f"backend {backend!r} searches on the CPU; evaluate on the CPU or with backend 'torch'")
    query_ids, reference_ids = query_ids.to(device), reference_ids.to(device)
    exact_search = knn_blocked.candidate_search if device.type == "cpu" else knn_device.candidate_search

    def search(queries: Tensor, width: int) -> tuple[Tensor, Tensor]:
        if searcher is not None:
            return searcher(queries, width)
        if backend == "torch":
            return exact_search(space, queries, reference_ids, width, exclude_self=exclude_self, block_size=block_size)
        return knn_faiss.candidate_search(
            space, queries, reference_ids, width, exclude_self=exclude_self,
            kind=_FAISS_KINDS[backend], nprobe=nprobe, seed=seed,
        )

    ids = torch.empty(len(query_ids), k, dtype=torch.int64, device=device)
    distances = torch.empty(len(query_ids), k, dtype=torch.float64, device=device)
    pending = torch.arange(len(query_ids), device=device)
    # A little slack beyond k lets most queries be certified in one pass.
    width = min(available, k + max(8, k // 8))
    while len(pending) > 0:
        pending_queries = query_ids[pending]
        scores, candidates = search(pending_queries, width)
        ranked_ids, ranked_distances, certified = _rank_candidates(
            space, pending_queries, scores, candidates, k,
            exhaustive=width >= available or backend in APPROXIMATE or not certify,
        )
        ids[pending[certified]] = ranked_ids[certified]
        distances[pending[certified]] = ranked_distances[certified]
        pending = pending[~certified]
        width = min(available, 4 * width)
    return Neighbors(ids, distances)


def _cross_domain(space: KnnIndex, query_ids: Tensor, reference_ids: Tensor, k: int, domains: Tensor,
                  **search: Any) -> Neighbors:
    """``nearest_neighbors`` with each query's own domain left out of its references (see there). A
    domain whose gallery holds fewer than ``k`` references fills its queries' lists with -1 (at
    distance inf) beyond them: ``k`` is what the queries of the largest gallery need, and a query's
    matches all lie in its own gallery."""
    device = space.exact_rows.device
    query_ids, reference_ids, domains = query_ids.to(device), reference_ids.to(device), domains.to(device)
    ids = torch.full((len(query_ids), k), -1, dtype=torch.int64, device=device)
    distances = torch.full((len(query_ids), k), float("inf"), dtype=torch.float64, device=device)
    query_domains, reference_domains = domains[query_ids], domains[reference_ids]
    for domain in torch.unique(query_domains).tolist():
        rows = torch.nonzero(query_domains == domain).squeeze(1)
        gallery = reference_ids[reference_domains != domain]
        width = min(k, len(gallery))
        # A query is in its own domain, so it is never among these references: nothing to exclude.
        found = nearest_neighbors(space, query_ids[rows], gallery, width, exclude_self=False, **search)
        ids[rows, :width], distances[rows, :width] = found.ids, found.distances
    return Neighbors(ids, distances)


def _rank_candidates(
    space: KnnIndex, query_ids: Tensor, scores: Tensor, candidates: Tensor, k: int, *, exhaustive: bool
) -> tuple[Tensor, Tensor, Tensor]:
    keys = _exact_keys(space, query_ids, candidates)
    # Lexicographic (key, id): sort by id, then stably by key.
    by_id = candidates.argsort(dim=1, stable=True)
    candidates, keys = candidates.gather(1, by_id), keys.gather(1, by_id)
    by_key = keys.argsort(dim=1, stable=True)
    ranked_ids = candidates.gather(1, by_key)[:, :k]
    ranked_keys = keys.gather(1, by_key)[:, :k]
    if exhaustive:
        return ranked_ids, ranked_keys, torch.ones(len(query_ids), dtype=torch.bool, device=ranked_ids.device)
    worst_kept = space.scores_to_distances(scores, query_ids).amax(dim=1)
    closest_outside = worst_kept - space.distance_error_bound(query_ids)
    return ranked_ids, ranked_keys, ranked_keys[:, -1] < closest_outside


def _exact_keys(space: KnnIndex, query_ids: Tensor, candidates: Tensor) -> Tensor:
    row_entries = max(1, candidates.shape[1] * space.exact_rows.shape[1])
    entries = _EXACT_CHUNK_ENTRIES if candidates.device.type == "cpu" else _DEVICE_EXACT_CHUNK_ENTRIES
    chunk = max(1, entries // row_entries)
    keys = torch.empty(candidates.shape, dtype=torch.float64, device=candidates.device)
    for start in range(0, len(query_ids), chunk):
        stop = start + chunk
        keys[start:stop] = space.exact_distances(query_ids[start:stop], candidates[start:stop])
    return keys
