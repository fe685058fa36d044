"""Brute-force float64 references for the evaluation metrics, written as plain loops from the papers.

Imported by the other ``test_evaluation_*`` files; the tests here check the references themselves
against the worked examples of the papers.
"""

from __future__ import annotations

import math

import pytest


def distance(a: list[float], b: list[float]) -> float:
    """Squared Euclidean distance, summed left to right."""
    total = 0.0
    for x, y in zip(a, b):
        total += (x - y) * (x - y)
    return total


def hamming(a: list[float], b: list[float]) -> float:
    """Hamming distance of the sign bits (bit = value > 0)."""
    return float(sum((x > 0) != (y > 0) for x, y in zip(a, b)))


def ranked_references(rows, queries, references, exclude_self, metric=distance):
    """For each query, references sorted by (distance, index)."""
    ranking = []
    for q in queries:
        candidates = [(metric(rows[q], rows[r]), r) for r in references if not (exclude_self and r == q)]
        candidates.sort()
        ranking.append([r for _, r in candidates])
    return ranking


def retrieval_metrics(labels, queries, references, ranking, exclude_self, ks=(1, 2, 4, 8)):
    """Every retrieval metric of docs/decisions.md / the seeds from full rankings (plain loops)."""
    sums = {"precision_at_1": 0.0, "r_precision": 0.0, "map_at_r": 0.0, "mrr": 0.0, "map_at_c": 0.0, "map_at_1000": 0.0}
    sums.update({f"recall_at_{k}": 0.0 for k in ks})
    counted = 0
    without_match = 0
    for position, q in enumerate(queries):
        ranked = ranking[position]
        relevant = sum(1 for r in references if labels[r] == labels[q] and not (exclude_self and r == q))
        rel = [labels[r] == labels[q] for r in ranked]
        # mAP@C / mAP@1000 (Roth et al. supp. eq. 29-30): every query, k_c = class size in the searched set.
        class_size = relevant + 1 if exclude_self else relevant
        if class_size > 0:
            sums["map_at_c"] += sum(rel[:class_size]) / class_size
        sums["map_at_1000"] += sum(rel[:1000]) / 1000
        if relevant == 0:
            without_match += 1
            continue
        counted += 1
        sums["precision_at_1"] += float(rel[0])
        for k in ks:
            sums[f"recall_at_{k}"] += float(any(rel[:k]))
        sums["r_precision"] += sum(rel[:relevant]) / relevant
        average_precision = 0.0
        for i in range(1, relevant + 1):
            if rel[i - 1]:
                average_precision += sum(rel[:i]) / i
        sums["map_at_r"] += average_precision / relevant
        # Reciprocal rank of the first correct neighbour within the k retrieved (k = largest class size).
        k_retrieved = max_class_size(labels, references)
        first = next((i for i, hit in enumerate(rel[:k_retrieved]) if hit), None)
        sums["mrr"] += 0.0 if first is None else 1.0 / (first + 1)
    result = {}
    for name, total in sums.items():
        result[name] = total / len(queries) if name in ("map_at_c", "map_at_1000") else total / counted
    result["num_queries"] = len(queries)
    result["num_queries_without_match"] = without_match
    return result


def max_class_size(labels, references):
    counts = {}
    for r in references:
        counts[labels[r]] = counts.get(labels[r], 0) + 1
    return max(counts.values())


def pairwise_f1(labels, clusters):
    same_cluster = same_class = both = 0
    n = len(labels)
    for i in range(n):
        for j in range(i + 1, n):
            c = clusters[i] == clusters[j]
            y = labels[i] == labels[j]
            same_cluster += c
            same_class += y
            both += c and y
    if both == 0:
        return 0.0
    precision, recall = both / same_cluster, both / same_class
    return 2 * precision * recall / (precision + recall)


def _table3_query(correct_positions, r=10):
    labels = [0] + [0 if i in correct_positions else 1 for i in range(1, r + 1)]
    labels += [0] * (r - len(correct_positions))  # the rest of class 0, ranked after position R
    ranking = [list(range(1, len(labels)))]
    return retrieval_metrics(labels, [0], list(range(len(labels))), ranking, exclude_self=True)


@pytest.mark.parametrize(
    ("correct", "r_precision", "map_at_r"),
    [({1}, 0.10, 0.10), ({1, 10}, 0.20, 0.12), ({1, 2}, 0.20, 0.20), (set(range(1, 11)), 1.0, 1.0)],
)
def test_reference_reproduces_musgrave_table_3(correct, r_precision, map_at_r):
    """Musgrave et al. 2020 Table 3: R = 10, all four rows have Recall@1 = 100%."""
    metrics = _table3_query(correct)
    assert metrics["precision_at_1"] == 1.0
    assert metrics["r_precision"] == pytest.approx(r_precision)
    assert metrics["map_at_r"] == pytest.approx(map_at_r)


def test_reference_pairwise_f1_by_hand():
    # pairs in one cluster: (0,1), (2,3), (2,4), (3,4) = 4; same class: (0,1), (0,2), (1,2), (3,4) = 4; both: (0,1), (3,4).
    assert pairwise_f1([0, 0, 0, 1, 1], [5, 5, 6, 6, 6]) == pytest.approx(0.5)
    assert math.isclose(pairwise_f1([0, 1, 2], [0, 0, 0]), 0.0)
