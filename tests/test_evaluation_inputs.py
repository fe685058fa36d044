"""Input validation of ``evaluate`` / ``evaluate_many``: one-line ``UserInputError``s naming the problem."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dmlbench.errors import UserInputError
from dmlbench.evaluation import default_metrics, evaluate, evaluate_many


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 5)), rng.integers(0, 5, n)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda e, l: (e[:-1], l, {}), "rows but labels"),
        (lambda e, l: (np.full_like(e, np.inf), l, {}), "NaN or Inf"),
        (lambda e, l: (e[:, 0], l, {}), "shape"),
        (lambda e, l: (e, l.astype(float), {}), "integers"),
        (lambda e, l: (e, np.zeros_like(l), {}), "single class"),
        (lambda e, l: (e, l, {"k": 40}), "k=40"),
        (lambda e, l: (e, l, {"k": 0}), "k must be"),
        (lambda e, l: (e, l, {"metrics": ["map@r"]}), "unknown metric 'map@r'"),
        (lambda e, l: (e, l, {"metrics": []}), "selects nothing"),
        (lambda e, l: (e, l, {"ks": (0,)}), "ks"),
        (lambda e, l: (e, l, {"query_mask": np.zeros(40, bool)}), "selects no query"),
        (lambda e, l: (e, l, {"query_mask": np.ones(40, bool)}), "no gallery"),
        (lambda e, l: (e, l, {"query_mask": np.zeros(39, bool)}), "query_mask"),
        (lambda e, l: (e, l, {"backend": "annoy"}), "backend"),
        (lambda e, l: (e, np.arange(40), {}), "no query has a reference"),
        (lambda e, l: (e, l, {"metrics": ["map_at_r"], "k": 1}), "too small for map_at_r"),
    ],
)
def test_bad_input_raises_one_line_user_error(change, message):
    embeddings, labels = _data()
    embeddings, labels, options = change(embeddings, labels)
    with pytest.raises(UserInputError, match=message) as caught:
        evaluate(embeddings, labels, **options)
    assert "\n" not in str(caught.value)


def test_accepts_tensors_arrays_lists_and_recall_at_any_k():
    embeddings, labels = _data()
    from_numpy = evaluate(embeddings, labels, metrics=["recall_at_3", "recall_at_17", "map_at_r"])
    from_torch = evaluate(torch.from_numpy(embeddings).float(), torch.from_numpy(labels), metrics="recall_at_3,recall_at_17,map_at_r")
    from_list = evaluate(embeddings.astype(np.float32).tolist(), labels.tolist(), metrics=["recall_at_3", "recall_at_17", "map_at_r"])
    assert from_numpy == pytest.approx(from_torch)
    assert from_numpy == pytest.approx(from_list)
    assert list(from_numpy) == ["recall_at_3", "recall_at_17", "map_at_r", "num_queries", "num_queries_without_match"]


def test_default_metrics_and_keys():
    embeddings, labels = _data()
    result = evaluate(embeddings, labels)
    assert list(result) == [*default_metrics(), "num_queries", "num_queries_without_match"]
    assert all(0.0 <= result[name] <= 1.0 for name in default_metrics() if name != "nmi") and result["num_queries"] == 40


def test_evaluate_many_concatenated_and_separated():
    embeddings, labels = _data()
    other = np.random.default_rng(9).standard_normal((40, 3))
    separated = evaluate_many({"a": embeddings, "b": other}, labels, mode="separated", metrics=["map_at_r", "precision_at_1"])
    single = [evaluate(matrix, labels, metrics=["map_at_r", "precision_at_1"]) for matrix in (embeddings, other)]
    assert separated["map_at_r"] == pytest.approx((single[0]["map_at_r"] + single[1]["map_at_r"]) / 2)
    concatenated = evaluate_many({"a": embeddings, "b": other}, labels, metrics=["map_at_r"])
    unit = [matrix / np.linalg.norm(matrix, axis=1, keepdims=True) for matrix in (embeddings, other)]
    assert concatenated == evaluate(np.concatenate(unit, axis=1), labels, metrics=["map_at_r"])
    with pytest.raises(UserInputError, match="mode"):
        evaluate_many({"a": embeddings}, labels, mode="stacked")
    with pytest.raises(UserInputError, match="same number of rows"):
        evaluate_many({"a": embeddings, "b": other[:-1]}, labels)


@pytest.mark.parametrize("backend", ["torch", "faiss"])
def test_metrics_are_floats_and_the_two_counts_ints(backend):
    """What docs/api.md promises: every metric a Python ``float``, the counts ``int`` (also for queries
    with a gallery, and averaged over separated models)."""
    embeddings, labels = _data(n=60)
    names = [*default_metrics(), "map_at_1000"]
    query_mask = np.arange(60) % 3 == 0
    results = [evaluate(embeddings, labels, metrics=names, backend=backend),
               evaluate(embeddings, labels, metrics=names[:-1], backend=backend, query_mask=query_mask),
               evaluate_many({"a": embeddings, "b": embeddings[:, ::-1].copy()}, labels, mode="separated", backend=backend)]
    for result in results:
        counts = {key: type(value) for key, value in result.items() if key.startswith("num_queries")}
        metrics = {key: type(value) for key, value in result.items() if not key.startswith("num_queries")}
        assert counts == {"num_queries": int, "num_queries_without_match": int}
        assert set(metrics.values()) == {float}, metrics


def test_reversed_views_with_negative_strides_are_accepted():
    """``x[:, ::-1]`` and ``labels[::-1]`` (negative strides, which torch refuses) give what their copies give;
    reversing the columns changes no distance, so the metrics equal the original's too."""
    embeddings, labels = _data(n=60, seed=3)
    original = evaluate(embeddings, labels)
    columns_reversed = evaluate(embeddings[:, ::-1], labels)
    assert columns_reversed == evaluate(embeddings[:, ::-1].copy(), labels)
    assert columns_reversed == pytest.approx(original, rel=1e-12, abs=1e-12)
    rows_reversed = evaluate(embeddings[::-1, ::-1], labels[::-1])
    assert rows_reversed == evaluate(embeddings[::-1, ::-1].copy(), labels[::-1].copy())
