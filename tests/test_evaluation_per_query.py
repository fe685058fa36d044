"""Per-query diagnostics against a brute-force float64 loop and against ``evaluate``'s averages."""

import numpy as np
import pytest

from dmlbench import evaluation
from dmlbench.evaluation.per_query import per_query


def _brute_force(embeddings: np.ndarray, labels: np.ndarray, query_mask: np.ndarray | None) -> tuple[list[int], list[float]]:
    """First correct rank (1-based, 0 without a match) and AP@R of every query, by sorting all references."""
    rows = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    queries = range(len(rows)) if query_mask is None else np.flatnonzero(query_mask)
    references = list(range(len(rows))) if query_mask is None else list(np.flatnonzero(~query_mask))
    ranks, precisions = [], []
    for query in queries:
        candidates = [r for r in references if query_mask is not None or r != query]
        order = sorted(candidates, key=lambda r: (float(((rows[query] - rows[r]) ** 2).sum()), r))
        correct = [labels[r] == labels[query] for r in order]
        relevant = sum(correct)
        ranks.append(correct.index(True) + 1 if relevant else 0)
        if relevant == 0:
            precisions.append(float("nan"))
            continue
        hits, total = 0, 0.0
        for position, is_correct in enumerate(correct[:relevant], start=1):
            if is_correct:
                hits += 1
                total += hits / position
        precisions.append(total / relevant)
    return ranks, precisions


@pytest.mark.parametrize("with_gallery", [False, True])
def test_per_query_matches_brute_force_and_averages_to_evaluate(with_gallery: bool) -> None:
    generator = np.random.default_rng(3)
    labels = generator.integers(0, 6, size=70)
    # Few dimensions and rounded values: plenty of exact ties, and first correct ranks far down the list.
    embeddings = np.round(generator.normal(size=(70, 3)), 1)
    embeddings[5] = embeddings[9]
    mask = (np.arange(70) % 3 == 0) if with_gallery else None
    found = per_query(embeddings, labels, query_mask=mask, neighbors=4)
    ranks, precisions = _brute_force(embeddings, labels, mask)
    assert found.first_correct_rank.tolist() == ranks
    np.testing.assert_allclose(found.average_precision_at_r.numpy(), precisions, atol=1e-12)
    assert max(ranks) > int(found.relevant.max())  # some first correct neighbours lie beyond the retrieved lists
    metrics = evaluation.evaluate(embeddings, labels, query_mask=mask, metrics=["map_at_r", "precision_at_1"])
    valid = found.relevant > 0
    assert float(found.average_precision_at_r[valid].mean()) == pytest.approx(metrics["map_at_r"], abs=1e-12)
    assert float((found.first_correct_rank[valid] == 1).double().mean()) == pytest.approx(metrics["precision_at_1"], abs=1e-12)
    assert found.neighbor_ids.shape == (len(found.query_ids), 4)


def test_worst_orders_by_ap_then_first_rank_and_skips_queries_without_a_match() -> None:
    labels = np.array([0, 0, 1, 1, 2, 3])
    embeddings = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.05], [0.0, 1.05], [0.7, 0.7], [-1.0, 0.0]])
    found = per_query(embeddings, labels, neighbors=2)
    worst = found.worst(10)
    assert set(found.query_ids[worst].tolist()) == {0, 1, 2, 3}  # labels 2 and 3 have no other member
    ap = found.average_precision_at_r[worst].numpy()
    assert (np.diff(ap) >= 0).all()
