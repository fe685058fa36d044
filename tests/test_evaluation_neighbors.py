"""The exact neighbour engines: blocked torch, faiss and brute force give identical rankings."""

from __future__ import annotations

import faiss
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_evaluation_reference import distance, hamming, ranked_references

from dmlbench.errors import UserInputError
from dmlbench.evaluation import evaluate, nearest_neighbors
from dmlbench.evaluation.knn_blocked import candidate_search
from dmlbench.evaluation.knn_index import pack_signs, prepare, unpack_signs


def _brute_force(embeddings: torch.Tensor, queries, references, exclude_self, k, binarize=False):
    rows = embeddings.tolist()
    ranking = ranked_references(rows, queries, references, exclude_self, metric=hamming if binarize else distance)
    return torch.tensor([ranked[:k] for ranked in ranking])


@st.composite
def point_sets(draw):
    n = draw(st.integers(3, 70))
    d = draw(st.integers(1, 5))
    values = draw(st.lists(st.integers(-3, 3), min_size=n * d, max_size=n * d))
    return torch.tensor(values, dtype=torch.float64).reshape(n, d)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(points=point_sets(), binarize=st.booleans(), block=st.sampled_from([32, 64, 4096]), data=st.data())
def test_blocked_faiss_and_brute_force_agree_exactly_with_ties(points, binarize, block, data):
    n = len(points)
    k = data.draw(st.integers(1, n - 1))
    space = prepare(points, normalize=False, binarize=binarize)
    everyone = torch.arange(n)
    expected = _brute_force(points, list(range(n)), list(range(n)), True, k, binarize)
    for backend in ("torch", "faiss"):
        found = nearest_neighbors(space, everyone, everyone, k, exclude_self=True, backend=backend, block_size=block)
        assert torch.equal(found.ids, expected), backend
    queries = everyone[everyone % 3 == 0]
    references = everyone[everyone % 3 != 0]
    if len(references) >= k:
        split_expected = _brute_force(points, queries.tolist(), references.tolist(), False, k, binarize)
        for backend in ("torch", "faiss"):
            found = nearest_neighbors(space, queries, references, k, exclude_self=False, backend=backend, block_size=block)
            assert torch.equal(found.ids, split_expected), backend


def test_many_exact_duplicates_force_wider_searches_and_stay_exact():
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(7, 4, generator=generator, dtype=torch.float64)
    points = base[torch.randint(0, 7, (300,), generator=generator)]  # ~43 copies of each point
    everyone = torch.arange(300)
    expected = _brute_force(torch.nn.functional.normalize(points, dim=1), everyone.tolist(), everyone.tolist(), True, 50)
    space = prepare(points, normalize=True, binarize=False)
    for backend in ("torch", "faiss"):
        found = nearest_neighbors(space, everyone, everyone, 50, exclude_self=True, backend=backend, block_size=64)
        assert torch.equal(found.ids, expected)
        assert torch.equal(found.distances, torch.sort(found.distances, dim=1).values)


def test_blocked_candidates_match_dense_float32_topk_scores():
    generator = torch.Generator().manual_seed(1)
    points = torch.randn(500, 16, generator=generator, dtype=torch.float64)
    space = prepare(points, normalize=True, binarize=False)
    everyone = torch.arange(500)
    scores, ids = candidate_search(space, everyone, everyone, 9, exclude_self=True, block_size=96)
    dense = space.search_rows @ space.search_rows.T
    dense.fill_diagonal_(-float("inf"))
    expected = dense.topk(9, dim=1).values
    # Symmetric blocks may round q.r and r.q differently; within the error bound of the product.
    torch.testing.assert_close(scores, expected, atol=1e-6, rtol=0)
    assert bool((ids != everyone.unsqueeze(1)).all())
    assert all(len(set(row.tolist())) == 9 for row in ids)


def test_results_do_not_depend_on_data_order():
    generator = torch.Generator().manual_seed(2)
    embeddings = torch.randn(400, 12, generator=generator)
    labels = torch.randint(0, 40, (400,), generator=generator)
    permutation = torch.randperm(400, generator=generator)
    for options in ({}, {"backend": "faiss"}, {"binarize": False, "normalize": False}):
        first = evaluate(embeddings, labels, metrics=["precision_at_1", "recall_at_4", "r_precision", "map_at_r", "mrr"],
                         block_size=64, **options)
        second = evaluate(embeddings[permutation], labels[permutation],
                          metrics=["precision_at_1", "recall_at_4", "r_precision", "map_at_r", "mrr"], block_size=64, **options)
        for name in first:
            assert first[name] == pytest.approx(second[name], abs=1e-12)


def test_identical_for_one_and_two_threads():
    generator = torch.Generator().manual_seed(4)
    points = torch.randn(700, 24, generator=generator, dtype=torch.float64)
    points[10] = points[11]
    labels = torch.randint(0, 50, (700,), generator=generator)
    space = prepare(points, normalize=True, binarize=False)
    everyone = torch.arange(700)
    outcomes = []
    previous = torch.get_num_threads(), faiss.omp_get_max_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            faiss.omp_set_num_threads(threads)
            outcomes.append([
                nearest_neighbors(space, everyone, everyone, 12, exclude_self=True, backend=backend, block_size=128).ids
                for backend in ("torch", "faiss")
            ] + [evaluate(points, labels, seed=3)])
    finally:
        torch.set_num_threads(previous[0])
        faiss.omp_set_num_threads(previous[1])
    assert torch.equal(outcomes[0][0], outcomes[1][0])
    assert torch.equal(outcomes[0][1], outcomes[1][1])
    assert torch.equal(outcomes[0][0], outcomes[0][1])
    assert outcomes[0][2] == outcomes[1][2]


def test_approximate_faiss_is_close_on_clustered_data():
    rng = np.random.default_rng(0)
    labels = np.arange(3000) % 300
    centres = rng.standard_normal((300, 32))
    embeddings = centres[labels] + 0.3 * rng.standard_normal((3000, 32))
    exact = evaluate(embeddings, labels, metrics=["precision_at_1", "map_at_r"])
    approximate = evaluate(embeddings, labels, metrics=["precision_at_1", "map_at_r"], backend="faiss_approx", nprobe=8)
    assert approximate["precision_at_1"] == pytest.approx(exact["precision_at_1"], abs=0.02)
    assert approximate["map_at_r"] == pytest.approx(exact["map_at_r"], abs=0.02)


@pytest.mark.parametrize("binarize", [False, True])
def test_hnsw_is_close_and_reproducible(binarize: bool):
    rng = np.random.default_rng(1)
    labels = np.arange(2000) % 200
    embeddings = rng.standard_normal((200, 32))[labels] + 0.8 * rng.standard_normal((2000, 32))
    metrics = ["precision_at_1", "map_at_r"]
    exact = evaluate(embeddings, labels, metrics=metrics, binarize=binarize)
    graph = evaluate(embeddings, labels, metrics=metrics, binarize=binarize, backend="faiss_hnsw")
    assert graph["precision_at_1"] == pytest.approx(exact["precision_at_1"], abs=0.01)
    assert graph["map_at_r"] == pytest.approx(exact["map_at_r"], abs=0.01)
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2)  # the graph is built by one thread whatever the setting
    try:
        assert evaluate(embeddings, labels, metrics=metrics, binarize=binarize, backend="faiss_hnsw") == graph
    finally:
        faiss.omp_set_num_threads(previous)


def test_packed_signs_round_trip_like_numpy_packbits():
    generator = torch.Generator().manual_seed(5)
    values = torch.randn(9, 13, generator=generator)
    packed = pack_signs(values)
    assert np.array_equal(packed.numpy(), np.packbits((values > 0).numpy(), axis=1))
    assert torch.equal(unpack_signs(packed, 13), values > 0)


def test_k_outside_the_gallery_is_a_user_error():
    space = prepare(torch.randn(5, 3, dtype=torch.float64), normalize=True, binarize=False)
    everyone = torch.arange(5)
    with pytest.raises(UserInputError, match="k=5"):
        nearest_neighbors(space, everyone, everyone, 5, exclude_self=True)
    with pytest.raises(UserInputError, match="backend"):
        nearest_neighbors(space, everyone, everyone, 2, exclude_self=True, backend="annoy")


@pytest.mark.parametrize(("normalize", "scale"), [(True, 1.0), (False, 1.0), (False, 1e6), (False, 1e-5)])
def test_float32_distances_stay_within_the_certification_bound(normalize, scale):
    generator = torch.Generator().manual_seed(6)
    points = torch.randn(300, 64, generator=generator, dtype=torch.float64) * scale
    points[:50] *= 100.0  # uneven norms
    points[50] = points[51] + 1e-9 * scale  # near-duplicates
    space = prepare(points, normalize=normalize, binarize=False)
    everyone = torch.arange(300)
    approximate = space.scores_to_distances(space.search_rows @ space.reference_rows.T, everyone)
    exact = space.exact_distances(everyone, everyone.unsqueeze(0).expand(300, -1))
    error = (approximate - exact).abs().amax(dim=1)
    bound = space.distance_error_bound(everyone)
    assert bool((error <= bound).all())
    assert float((error / bound).max()) > 1e-3  # the bound is not vacuous
