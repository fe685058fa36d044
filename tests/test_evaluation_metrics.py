"""Every retrieval metric against the brute-force float64 references, ties and edge cases included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_evaluation_reference import hamming, ranked_references, retrieval_metrics

from dmlbench.evaluation import evaluate

RETRIEVAL = ["precision_at_1", "recall_at_1", "recall_at_2", "recall_at_4", "recall_at_8", "r_precision",
             "map_at_r", "map_at_c", "map_at_1000", "mrr"]


@st.composite
def datasets(draw):
    """Small integer embeddings (many exact ties and duplicate rows), few classes, optional query mask."""
    n = draw(st.integers(4, 28))
    d = draw(st.integers(1, 4))
    values = draw(st.lists(st.integers(-2, 2), min_size=n * d, max_size=n * d))
    labels = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n).filter(lambda y: len(set(y)) >= 2))
    split = draw(st.booleans())
    mask = None
    if split:
        mask = draw(st.lists(st.booleans(), min_size=n, max_size=n).filter(lambda m: any(m) and not all(m)))
    return np.array(values, dtype=np.float64).reshape(n, d), np.array(labels), mask


def _reference(embeddings, labels, mask, binarize):
    rows = embeddings.tolist()
    n = len(rows)
    if mask is None:
        queries = references = list(range(n))
    else:
        queries = [i for i in range(n) if mask[i]]
        references = [i for i in range(n) if not mask[i]]
    metric = hamming if binarize else None
    ranking = ranked_references(rows, queries, references, mask is None, **({"metric": metric} if metric else {}))
    return retrieval_metrics(labels.tolist(), queries, references, ranking, mask is None)


def _has_match(labels, mask):
    if mask is None:
        return any(np.sum(labels == y) > 1 for y in labels)
    gallery = set(labels[~np.array(mask)].tolist())
    return any(labels[i] in gallery for i in range(len(labels)) if mask[i])


@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(data=datasets(), binarize=st.booleans(), backend=st.sampled_from(["torch", "faiss"]), block=st.sampled_from([32, 64]))
def test_metrics_equal_brute_force_with_ties_duplicates_and_missing_matches(data, binarize, backend, block):
    embeddings, labels, mask = data
    if not _has_match(labels, mask):
        return
    result = evaluate(embeddings, labels, metrics=RETRIEVAL, query_mask=None if mask is None else np.array(mask),
                      normalize=False, binarize=binarize, backend=backend, block_size=block)
    expected = _reference(embeddings, labels, mask, binarize)
    for name in RETRIEVAL:
        assert result[name] == pytest.approx(expected[name], abs=1e-12), name
    assert result["num_queries"] == expected["num_queries"]
    assert result["num_queries_without_match"] == expected["num_queries_without_match"]


def test_normalized_random_data_with_duplicates_singletons_and_unmatched_queries():
    generator = torch.Generator().manual_seed(3)
    embeddings = torch.randn(90, 6, generator=generator, dtype=torch.float64)
    embeddings[5] = embeddings[40]
    embeddings[41] = embeddings[40]
    labels = torch.randint(0, 12, (90,), generator=generator)
    labels[0] = 99  # a singleton class
    mask = torch.zeros(90, dtype=torch.bool)
    mask[::3] = True
    labels[3] = 77  # a query whose label is not in the gallery
    for query_mask in (None, mask):
        result = evaluate(embeddings, labels, metrics=RETRIEVAL, query_mask=query_mask, block_size=32)
        unit = torch.nn.functional.normalize(embeddings, dim=1).numpy()
        expected = _reference(unit, labels.numpy(), None if query_mask is None else query_mask.numpy(), False)
        assert result["num_queries_without_match"] >= 1
        for name in RETRIEVAL:
            assert result[name] == pytest.approx(expected[name], abs=1e-12), name


def test_equidistant_references_are_ranked_by_index():
    # Query 0 at the origin, references 1-4 all at distance 1; labels make the tie order visible.
    embeddings = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0], [9.0, 9.0]])
    labels = np.array([0, 1, 1, 0, 0, 1])
    mask = np.array([True, False, False, False, False, False])
    result = evaluate(embeddings, labels, metrics=["precision_at_1", "map_at_r", "recall_at_3"],
                      query_mask=mask, normalize=False)
    # ranking 1, 2, 3, 4 -> hits at positions 3 and 4 with R = 2
    assert result["precision_at_1"] == 0.0
    assert result["recall_at_3"] == 1.0
    assert result["map_at_r"] == 0.0
    reordered = evaluate(embeddings[[0, 3, 4, 1, 2, 5]], labels[[0, 3, 4, 1, 2, 5]], metrics=["map_at_r"],
                         query_mask=mask, normalize=False)
    assert reordered["map_at_r"] == 1.0


def test_binarized_embeddings_use_hamming_distance_of_signs():
    generator = np.random.default_rng(0)
    embeddings = generator.standard_normal((60, 24))
    labels = generator.integers(0, 6, 60)
    signs = np.where(embeddings > 0, 1.0, -1.0)
    scaled = embeddings * generator.uniform(0.1, 10.0, size=(60, 1))
    # Only the signs matter: magnitudes and the +-1 codes give the same result.
    first = evaluate(scaled, labels, metrics=RETRIEVAL, binarize=True)
    second = evaluate(signs, labels, metrics=RETRIEVAL, binarize=True, backend="faiss")
    assert first == second
    expected = _reference(embeddings, labels, None, True)
    for name in RETRIEVAL:
        assert first[name] == pytest.approx(expected[name], abs=1e-12), name


def test_map_at_1000_divides_by_1000_and_map_at_c_counts_all_queries():
    labels = np.array([0, 0, 0, 1, 1, 2])
    embeddings = np.array([[0.0], [0.1], [0.2], [5.0], [5.1], [9.0]])
    result = evaluate(embeddings, labels, metrics=["map_at_c", "map_at_1000", "map_at_r"], normalize=False)
    # class 0: k_c = 3, each query finds its 2 classmates in its 3 nearest -> 2/3; class 1: k_c = 2 -> 1/2;
    # class 2 (singleton): k_c = 1 -> 0. mAP@C averages over all 6 queries.
    assert result["map_at_c"] == pytest.approx((3 * 2 / 3 + 2 * 1 / 2 + 0) / 6)
    assert result["map_at_1000"] == pytest.approx((3 * 2 + 2 * 1 + 0) / 1000 / 6)
    assert result["map_at_r"] == 1.0 and result["num_queries_without_match"] == 1
