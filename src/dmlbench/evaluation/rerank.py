"""Re-ranking after the first retrieval: alpha-weighted query expansion with database-side augmentation
(Radenović, Tolias and Chum 2018) and k-reciprocal encoding with the Jaccard distance (Zhong et al. 2017).

Both work on L2-normalised rows and the evaluation's exact key, the squared Euclidean distance of
unit rows (so the similarity of two rows is ``1 - key / 2``), and both return lists ordered by
(re-ranked distance, reference index), like ``neighbors.nearest_neighbors``; k-reciprocal takes d
from float64 products, so two distances equal up to round-off (1e-15) may come in either order:

- Query expansion replaces a vector by the normalised sum of itself and its ``neighbours`` nearest
  references weighted by ``max(similarity, 0) ** alpha`` (alpha-QE; the vector itself has weight
  ``1 ** alpha``). With ``database_side`` the references are expanded first among themselves (DBA),
  and the queries are expanded against the expanded references. The final lists are searched with
  the expanded vectors by the exact engine; a query never retrieves itself.
- k-reciprocal encoding (Zhong et al. 2017, eq. 4-12) is computed sparsely over all rows of the
  evaluation (the encodings V have a few dozen entries per row), and the re-ranked distances of a
  batch of queries against every row are dense ``[B, N]`` blocks of bounded size: no ``N x N``
  matrix is ever formed.
Definitions left open by the paper are in docs/decisions.md ("Re-ranking").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse
import torch
from torch import Tensor

from dmlbench.errors import UserInputError
from dmlbench.evaluation.knn_index import prepare
from dmlbench.evaluation.neighbors import Neighbors, nearest_neighbors
from dmlbench.validation import check_non_negative, check_positive_int, check_probability

RERANK_KINDS = ("none", "query_expansion", "k_reciprocal")
# Entries of the (query, shared column, reference) expansion held at once by the Jaccard step, and
# of each dense [queries, rows] block of re-ranked distances (64 MB of float64).
_JACCARD_ENTRIES = 1 << 22
_BLOCK_ENTRIES = 1 << 23


@dataclass(frozen=True)
class QueryExpansion:
    """alpha-QE with ``neighbours`` nearest references, optionally with database-side augmentation."""

    neighbours: int = 2
    alpha: float = 3.0
    database_side: bool = True

    def __post_init__(self) -> None:
        check_positive_int("rerank.neighbours", self.neighbours)
        check_non_negative("rerank.alpha", self.alpha)
        if not isinstance(self.database_side, bool):
            raise UserInputError(f"rerank.database_side must be true or false, got {self.database_side!r}")


@dataclass(frozen=True)
class KReciprocal:
    """k-reciprocal encoding: ``k1`` and ``k2`` neighbourhoods, ``original_weight`` is lambda of eq. 12."""

    k1: int = 20
    k2: int = 6
    original_weight: float = 0.3

    def __post_init__(self) -> None:
        check_positive_int("rerank.k1", self.k1)
        check_positive_int("rerank.k2", self.k2)
        check_probability("rerank.original_weight", self.original_weight)


Reranking = QueryExpansion | KReciprocal


def build(kind: str, **params: object) -> Reranking | None:
    """The re-ranking ``kind`` (``none`` gives ``None``) with its parameters, validated."""
    if kind not in RERANK_KINDS:
        raise UserInputError(f"rerank.kind must be one of {', '.join(RERANK_KINDS)}; got {kind!r}")
    if kind == "none":
        if params:
            raise UserInputError(f"rerank.kind none takes no parameters; got {', '.join(sorted(params))}")
        return None
    cls = QueryExpansion if kind == "query_expansion" else KReciprocal
    accepted = set(cls.__dataclass_fields__)
    unknown = sorted(set(params) - accepted)
    if unknown:
        raise UserInputError(f"rerank.kind {kind} has no parameter {', '.join(unknown)}; "
                             f"it takes {', '.join(sorted(accepted))}")
    return cls(**params)  # type: ignore[arg-type]


def reranked_neighbors(
    rows: Tensor, query_ids: Tensor, reference_ids: Tensor, k: int, *, exclude_self: bool, method: Reranking
) -> Neighbors:
    """The ``k`` nearest ``reference_ids`` of each of ``query_ids`` after re-ranking float64 ``rows`` ``[N, D]``.

    ``exclude_self`` as in ``nearest_neighbors`` (the queries are then among the references);
    ``distances`` are the re-ranked distances (squared Euclidean of the expanded unit rows for query
    expansion, eq. 12's d* for k-reciprocal).
    """
    available = len(reference_ids) - int(exclude_self)
    if not 1 <= k <= available:
        raise UserInputError(f"k={k} must lie in [1, {available}] (the number of references per query)")
    unit = torch.nn.functional.normalize(rows.to(torch.float64), dim=1)
    if isinstance(method, QueryExpansion):
        return _query_expansion(unit, query_ids, reference_ids, k, exclude_self, method)
    return _k_reciprocal(unit, query_ids, reference_ids, k, exclude_self, method)


# --- alpha-weighted query expansion and database-side augmentation --------------------------------


def _query_expansion(
    unit: Tensor, query_ids: Tensor, reference_ids: Tensor, k: int, exclude_self: bool, method: QueryExpansion
) -> Neighbors:
    """alpha-QE and DBA (Radenović et al. 2018, "Fine-tuning CNN image retrieval with no human annotation")."""
    database = unit
    if method.database_side:
        database = unit.clone()
        neighbours = _nearest_of_vectors(unit, unit[reference_ids], reference_ids, method.neighbours,
                                         self_ids=reference_ids)
        database[reference_ids] = _expanded(unit[reference_ids], database_rows=unit, neighbours=neighbours,
                                             alpha=method.alpha)
    self_ids = query_ids if exclude_self else None
    neighbours = _nearest_of_vectors(database, unit[query_ids], reference_ids, method.neighbours, self_ids=self_ids)
    queries = _expanded(unit[query_ids], database_rows=database, neighbours=neighbours, alpha=method.alpha)
    return _nearest_of_vectors(database, queries, reference_ids, k, self_ids=self_ids)


def _expanded(vectors: Tensor, *, database_rows: Tensor, neighbours: Neighbors, alpha: float) -> Tensor:
    """Each vector plus its neighbours weighted by ``max(similarity, 0) ** alpha``, normalised."""
    similarities = (1.0 - neighbours.distances / 2.0).clamp_min(0.0)
    weights = similarities.pow(alpha) if alpha > 0 else torch.ones_like(similarities)
    total = vectors + (weights.unsqueeze(2) * database_rows[neighbours.ids]).sum(dim=1)
    return torch.nn.functional.normalize(total, dim=1)


def _nearest_of_vectors(
    database_rows: Tensor, vectors: Tensor, reference_ids: Tensor, k: int, *, self_ids: Tensor | None
) -> Neighbors:
    """The ``k`` nearest ``reference_ids`` rows of ``database_rows`` to each of ``vectors``, exact.

    ``self_ids[i]`` (when given) is the reference that vector i must not retrieve: one more neighbour
    is searched and that one removed, which keeps the (distance, index) order of the others.
    """
    num_rows = len(database_rows)
    available = len(reference_ids) - int(self_ids is not None)
    width = min(k, available)
    space = prepare(torch.cat([database_rows, vectors]), normalize=True, binarize=False)
    vector_ids = torch.arange(num_rows, num_rows + len(vectors))
    found = nearest_neighbors(space, vector_ids, reference_ids, width + int(self_ids is not None), exclude_self=False)
    if self_ids is None:
        return found
    # Stable: the one entry equal to the vector's own id (if any) moves to the end and is cut off.
    order = (found.ids == self_ids.unsqueeze(1)).to(torch.int8).argsort(dim=1, stable=True)[:, :width]
    return Neighbors(found.ids.gather(1, order), found.distances.gather(1, order))


# --- k-reciprocal encoding ---------------------------------------------------------------------------


def _k_reciprocal(
    unit: Tensor, query_ids: Tensor, reference_ids: Tensor, k: int, exclude_self: bool, method: KReciprocal
) -> Neighbors:
    """Zhong et al. 2017, "Re-ranking person re-identification with k-reciprocal encoding", eq. 4-12."""
    num_rows = len(unit)
    if method.k1 >= num_rows or method.k2 > num_rows:
        raise UserInputError(f"rerank.k1={method.k1} and rerank.k2={method.k2} need more than {method.k1} rows "
                             f"(the evaluation has {num_rows})")
    space = prepare(unit, normalize=True, binarize=False)
    everyone = torch.arange(num_rows)
    # N(p, k1): p itself, then its k1 nearest rows by (distance, index).
    nearest = nearest_neighbors(space, everyone, everyone, method.k1, exclude_self=True).ids.numpy()
    ranked = np.concatenate([everyone.numpy()[:, None], nearest], axis=1)
    encoding = _encodings(unit, ranked, method.k1)
    if method.k2 > 1:
        # Eq. 11: the mean encoding of p's k2 nearest rows (p included).
        rows = np.repeat(np.arange(num_rows), method.k2)
        averaging = scipy.sparse.csr_matrix((np.full(rows.size, 1.0 / method.k2), (rows, ranked[:, :method.k2].ravel())),
                                            shape=(num_rows, num_rows))
        encoding = (averaging @ encoding).tocsr()
    encoding.sort_indices()
    return _jaccard_ranking(unit, encoding, query_ids, reference_ids, k, exclude_self, method.original_weight)


def _reciprocal_sets(ranked: np.ndarray, size: int) -> scipy.sparse.csr_matrix:
    """Eq. 4: R(p, size) = {g in N(p, size) : p in N(g, size)}, as a boolean ``[N, N]`` sparse matrix."""
    num_rows = len(ranked)
    forward = ranked[:, :size + 1]
    rows = np.repeat(np.arange(num_rows), forward.shape[1])
    columns = forward.ravel()
    keys = np.sort(rows * num_rows + columns)
    backward = columns * num_rows + rows
    position = np.searchsorted(keys, backward).clip(max=len(keys) - 1)
    reciprocal = keys[position] == backward
    return scipy.sparse.csr_matrix((np.ones(int(reciprocal.sum()), dtype=bool), (rows[reciprocal], columns[reciprocal])),
                                   shape=(num_rows, num_rows))


def _encodings(unit: Tensor, ranked: np.ndarray, k1: int) -> scipy.sparse.csr_matrix:
    """Eq. 6-7: the expanded sets R*(p, k1) and V[p, g] = exp(-d(p, g)) on them, sparse ``[N, N]``."""
    num_rows = len(ranked)
    full = _reciprocal_sets(ranked, k1)
    half = _reciprocal_sets(ranked, (k1 + 1) // 2)
    half_sizes = np.diff(half.indptr)
    # For every q in R(p, k1): |R(p, k1) n R(q, k1/2)| >= 2/3 |R(q, k1/2)| adds R(q, k1/2) (eq. 6).
    owners, candidates = full.nonzero()
    overlaps = (full.astype(np.int64) @ half.astype(np.int64).T).tocsr()
    overlap = np.asarray(overlaps[owners, candidates]).ravel()
    accepted = 3 * overlap >= 2 * half_sizes[candidates]
    added = scipy.sparse.csr_matrix((np.ones(int(accepted.sum()), dtype=np.int64), (owners[accepted], candidates[accepted])),
                                    shape=(num_rows, num_rows)) @ half.astype(np.int64)
    expanded = ((full.astype(np.int64) + added) > 0).tocsr()
    expanded.sort_indices()
    rows = np.repeat(np.arange(num_rows), np.diff(expanded.indptr))
    columns = expanded.indices
    values = np.empty(len(rows))
    for start in range(0, len(rows), _JACCARD_ENTRIES // max(1, unit.shape[1])):
        stop = start + _JACCARD_ENTRIES // max(1, unit.shape[1])
        difference = unit[torch.from_numpy(rows[start:stop])] - unit[torch.from_numpy(columns[start:stop])]
        values[start:stop] = torch.exp(-difference.square().sum(dim=1)).numpy()
    return scipy.sparse.csr_matrix((values, columns, expanded.indptr), shape=(num_rows, num_rows))


def _jaccard_ranking(
    unit: Tensor, encoding: scipy.sparse.csr_matrix, query_ids: Tensor, reference_ids: Tensor, k: int,
    exclude_self: bool, original_weight: float,
) -> Neighbors:
    """Eq. 10 and 12 for every query against every reference, exact, in batches of queries.

    A batch holds ``[B, N]`` dense blocks (at most ``_BLOCK_ENTRIES`` entries each), never ``[N, N]``.
    """
    num_rows = encoding.shape[0]
    is_reference = np.zeros(num_rows, dtype=bool)
    is_reference[reference_ids.numpy()] = True
    by_column = encoding.tocsc()
    by_column.sort_indices()
    column_sizes = np.diff(by_column.indptr)
    totals = np.asarray(encoding.sum(axis=1)).ravel()
    rows = unit.numpy()
    ids = torch.empty(len(query_ids), k, dtype=torch.int64)
    distances = torch.empty(len(query_ids), k, dtype=torch.float64)
    queries = query_ids.numpy()
    largest_batch = max(1, _BLOCK_ENTRIES // num_rows)
    start = 0
    while start < len(queries):
        stop = _batch_end(encoding, column_sizes, queries, start, largest_batch)
        batch = queries[start:stop]
        overlap = _shared_minima(encoding, by_column, batch).toarray()
        jaccard = 1.0 - overlap / (totals[batch, None] + totals[None, :] - overlap)
        # Squared Euclidean distance of unit rows (the evaluation's exact key, up to round-off).
        original = np.maximum(2.0 - 2.0 * (rows[batch] @ rows.T), 0.0)
        final = (1.0 - original_weight) * jaccard + original_weight * original
        final[:, ~is_reference] = np.inf
        if exclude_self:
            final[np.arange(len(batch)), batch] = np.inf
        ids[start:stop], distances[start:stop] = _smallest(final, k)
        start = stop
    return Neighbors(ids, distances)


def _batch_end(
    encoding: scipy.sparse.csr_matrix, column_sizes: np.ndarray, queries: np.ndarray, start: int, largest: int
) -> int:
    """The end of the next batch: at most ``largest`` queries whose expansion stays below ``_JACCARD_ENTRIES``."""
    entries = 0
    stop = start
    while stop < len(queries) and stop - start < largest:
        row = queries[stop]
        cost = int(column_sizes[encoding.indices[encoding.indptr[row]:encoding.indptr[row + 1]]].sum())
        if stop > start and entries + cost > _JACCARD_ENTRIES:
            break
        entries += cost
        stop += 1
    return stop


def _shared_minima(
    encoding: scipy.sparse.csr_matrix, by_column: scipy.sparse.csc_matrix, batch: np.ndarray
) -> scipy.sparse.csr_matrix:
    """``[B, N]``: sum_j min(V[p, j], V[g, j]) for every query p of the batch and row g sharing support (eq. 10)."""
    query_rows = encoding[batch]
    local = np.repeat(np.arange(len(batch)), np.diff(query_rows.indptr))
    columns, query_values = query_rows.indices, query_rows.data
    counts = np.diff(by_column.indptr)[columns]
    # Every (query entry, row of its column) pair, without a Python loop over queries.
    owner = np.repeat(np.arange(len(columns)), counts)
    positions = np.repeat(by_column.indptr[columns] - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
    minima = np.minimum(query_values[owner], by_column.data[positions])
    shared = scipy.sparse.csr_matrix((minima, (local[owner], by_column.indices[positions])),
                                     shape=(len(batch), encoding.shape[0]))
    shared.sum_duplicates()
    return shared


def _smallest(values: np.ndarray, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` smallest entries of each row, ordered by (value, column index)."""
    kth = np.partition(values, k - 1, axis=1)[:, k - 1]
    ids = np.empty((len(values), k), dtype=np.int64)
    for row in range(len(values)):
        candidates = np.flatnonzero(values[row] <= kth[row])
        ids[row] = candidates[np.lexsort((candidates, values[row, candidates]))[:k]]
    return torch.from_numpy(ids), torch.from_numpy(np.take_along_axis(values, ids, axis=1))


def validate_combination(*, binarize: bool, normalize: bool) -> None:
    """Re-ranking is defined on L2-normalised float embeddings."""
    if binarize or not normalize:
        raise UserInputError("re-ranking needs L2-normalised float embeddings (normalize=true, binarize=false)")


__all__ = ["RERANK_KINDS", "KReciprocal", "QueryExpansion", "Reranking", "build", "reranked_neighbors",
           "validate_combination"]
