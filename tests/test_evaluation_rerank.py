"""Re-ranking (dmlbench.evaluation.rerank) against float64 brute-force implementations of the equations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dmlbench.errors import UserInputError
from dmlbench.evaluation import rerank
from dmlbench.evaluation.rerank import KReciprocal, QueryExpansion, reranked_neighbors


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _nearest(vector: np.ndarray, database: np.ndarray, candidates: list[int], count: int) -> list[tuple[float, int]]:
    """(squared distance, id) of the ``count`` nearest candidates, ties by id, one at a time."""
    scored = sorted((float(((vector - database[g]) ** 2).sum()), g) for g in candidates)
    return scored[:count]


def _expand(vector: np.ndarray, database: np.ndarray, found: list[tuple[float, int]], alpha: float) -> np.ndarray:
    total = vector.copy()
    for distance, g in found:
        total = total + max(1.0 - distance / 2.0, 0.0) ** alpha * database[g]
    return total / np.linalg.norm(total)


def brute_query_expansion(rows, queries, references, k, exclude_self, method: QueryExpansion):
    unit = _unit(rows)
    database = unit.copy()
    if method.database_side:
        for r in references:
            others = [g for g in references if g != r]
            database[r] = _expand(unit[r], unit, _nearest(unit[r], unit, others, method.neighbours), method.alpha)
    ids, distances = [], []
    for q in queries:
        pool = [g for g in references if not (exclude_self and g == q)]
        expanded = _expand(unit[q], database, _nearest(unit[q], database, pool, method.neighbours), method.alpha)
        found = _nearest(expanded, database, pool, k)
        ids.append([g for _, g in found])
        distances.append([d for d, _ in found])
    return np.array(ids), np.array(distances)


def brute_k_reciprocal(rows, queries, references, k, exclude_self, method: KReciprocal):
    """Zhong et al. 2017 eq. 4, 6, 7, 10, 11, 12 written out as loops over dense float64 matrices."""
    unit = _unit(rows)
    n = len(unit)
    distance = np.array([[((unit[p] - unit[g]) ** 2).sum() for g in range(n)] for p in range(n)])
    order = [[p] + [g for _, g in sorted((distance[p, g], g) for g in range(n) if g != p)] for p in range(n)]

    def reciprocal(p: int, size: int) -> set[int]:
        return {g for g in order[p][:size + 1] if p in order[g][:size + 1]}

    half = (method.k1 + 1) // 2
    encoding = np.zeros((n, n))
    for p in range(n):
        base = reciprocal(p, method.k1)
        expanded = set(base)
        for q in base:
            candidate = reciprocal(q, half)
            if 3 * len(base & candidate) >= 2 * len(candidate):
                expanded |= candidate
        for g in expanded:
            encoding[p, g] = np.exp(-distance[p, g])
    if method.k2 > 1:
        encoding = np.array([encoding[order[p][:method.k2]].mean(axis=0) for p in range(n)])
    ids, distances = [], []
    for q in queries:
        scored = []
        for g in references:
            if exclude_self and g == q:
                continue
            jaccard = 1.0 - np.minimum(encoding[q], encoding[g]).sum() / np.maximum(encoding[q], encoding[g]).sum()
            final = (1 - method.original_weight) * jaccard + method.original_weight * distance[q, g]
            scored.append((final, g))
        scored.sort()
        ids.append([g for _, g in scored[:k]])
        distances.append([d for d, _ in scored[:k]])
    return np.array(ids), np.array(distances)


def assert_same_ranking(found, expected_ids: np.ndarray, expected_distances: np.ndarray) -> None:
    """Equal distances (1e-10) and ids of the first k; the expected lists are longer than k so that
    entries whose distances agree to 1e-9 (a tie up to round-off, such as two references expanded
    from the same set of rows) may come in either order, also across the k-th position."""
    distances, ids = found.distances.numpy(), found.ids.numpy()
    k = ids.shape[1]
    np.testing.assert_allclose(distances, expected_distances[:, :k], rtol=0, atol=1e-10)
    for row in range(len(ids)):
        groups = np.concatenate([[0], np.cumsum(np.diff(expected_distances[row]) > 1e-9)])
        for group in np.unique(groups[:k]):
            members = np.flatnonzero(groups == group)
            inside = members[members < k]
            assert set(ids[row][inside]) <= set(expected_ids[row][members]), (row, ids[row], expected_ids[row])


def _clustered(seed: int, classes: int, per_class: int, dim: int, duplicates: int = 0) -> np.ndarray:
    generator = np.random.default_rng(seed)
    centres = generator.normal(size=(classes, dim))
    rows = np.repeat(centres, per_class, axis=0) + 0.6 * generator.normal(size=(classes * per_class, dim))
    if duplicates:
        rows[-duplicates:] = rows[:duplicates]  # exact ties, broken by index
    return rows


def _layout(n: int, query_every: int | None):
    if query_every is None:
        everyone = np.arange(n)
        return everyone, everyone, True
    queries = np.arange(0, n, query_every)
    return queries, np.setdiff1d(np.arange(n), queries), False


@pytest.mark.parametrize("method", [
    QueryExpansion(neighbours=1, alpha=3.0, database_side=False),
    QueryExpansion(neighbours=3, alpha=3.0, database_side=True),
    QueryExpansion(neighbours=2, alpha=0.0, database_side=True),
])
@pytest.mark.parametrize("query_every", [None, 4])
def test_query_expansion_matches_brute_force(method: QueryExpansion, query_every: int | None) -> None:
    # No duplicated rows: expanded copies of one row are equal only up to the order of their sums,
    # so their order would follow round-off, not index.
    rows = _clustered(1, classes=6, per_class=7, dim=5)
    queries, references, self_retrieval = _layout(len(rows), query_every)
    k = 6
    expected_ids, expected_distances = brute_query_expansion(rows, queries, references, k + 3, self_retrieval, method)
    found = reranked_neighbors(torch.from_numpy(rows), torch.from_numpy(queries), torch.from_numpy(references), k,
                               exclude_self=self_retrieval, method=method)
    assert_same_ranking(found, expected_ids, expected_distances)


@pytest.mark.parametrize("method", [
    KReciprocal(k1=6, k2=3, original_weight=0.3),
    KReciprocal(k1=5, k2=1, original_weight=0.5),
    KReciprocal(k1=8, k2=4, original_weight=0.0),
    KReciprocal(k1=4, k2=2, original_weight=1.0),
])
@pytest.mark.parametrize("query_every", [None, 3])
def test_k_reciprocal_matches_brute_force(method: KReciprocal, query_every: int | None) -> None:
    rows = _clustered(2, classes=5, per_class=8, dim=4, duplicates=2)
    queries, references, self_retrieval = _layout(len(rows), query_every)
    k = 7
    expected_ids, expected_distances = brute_k_reciprocal(rows, queries, references, k + 3, self_retrieval, method)
    found = reranked_neighbors(torch.from_numpy(rows), torch.from_numpy(queries), torch.from_numpy(references), k,
                               exclude_self=self_retrieval, method=method)
    assert_same_ranking(found, expected_ids, expected_distances)


def test_k_reciprocal_in_small_batches_equals_one_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = torch.from_numpy(_clustered(3, classes=8, per_class=6, dim=6))
    everyone = torch.arange(len(rows))
    method = KReciprocal(k1=7, k2=3)
    whole = reranked_neighbors(rows, everyone, everyone, 10, exclude_self=True, method=method)
    monkeypatch.setattr(rerank, "_JACCARD_ENTRIES", 64)
    batched = reranked_neighbors(rows, everyone, everyone, 10, exclude_self=True, method=method)
    assert torch.equal(whole.ids, batched.ids)
    # Float64 products of other block shapes round differently in the last bits.
    torch.testing.assert_close(whole.distances, batched.distances, rtol=0, atol=1e-12)


def test_build_checks_kind_and_parameters() -> None:
    assert rerank.build("none") is None
    assert rerank.build("k_reciprocal", k1=10) == KReciprocal(k1=10)
    with pytest.raises(UserInputError, match="rerank.kind must be one of"):
        rerank.build("diffusion")
    with pytest.raises(UserInputError, match="has no parameter lambda; it takes k1, k2, original_weight"):
        rerank.build("k_reciprocal", **{"lambda": 0.3})
    with pytest.raises(UserInputError, match="rerank.original_weight must lie in"):
        KReciprocal(original_weight=1.5)
    with pytest.raises(UserInputError, match="rerank.neighbours must be an integer > 0"):
        QueryExpansion(neighbours=0)
    with pytest.raises(UserInputError, match="more than 20 rows"):
        reranked_neighbors(torch.randn(10, 3, dtype=torch.float64), torch.arange(10), torch.arange(10), 3,
                           exclude_self=True, method=KReciprocal())
