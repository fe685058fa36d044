"""NMI / AMI / pairwise F1 on the k-means assignment, against brute-force pair counting."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_mutual_info_score, normalized_mutual_info_score
from test_evaluation_reference import pairwise_f1 as reference_pairwise_f1

from dmlbench.evaluation import clustering, evaluate
from dmlbench.evaluation.knn_index import prepare


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pairwise_f1_equals_pair_loop(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 7, 80)
    clusters = rng.integers(0, 5, 80)
    labels[0] = 99  # a singleton class
    assert clustering.pairwise_f1(labels, clusters) == pytest.approx(reference_pairwise_f1(labels.tolist(), clusters.tolist()), abs=1e-12)


def test_perfect_clustering_scores_one():
    labels = np.repeat(np.arange(5), 4)
    clusters = labels[::-1] + 10  # a relabelling of the same partition
    assert clustering.pairwise_f1(labels, clusters) == pytest.approx(1.0)


def test_evaluate_uses_kmeans_with_as_many_clusters_as_classes_and_a_fixed_seed():
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 9, (300,), generator=generator)
    embeddings = torch.randn(9, 8, generator=generator)[labels] + 0.8 * torch.randn(300, 8, generator=generator)
    first = evaluate(embeddings, labels, metrics=["nmi", "ami", "f1"], seed=11)
    second = evaluate(embeddings, labels, metrics=["nmi", "ami", "f1"], seed=11)
    assert first == second
    rows = prepare(embeddings.double(), normalize=True, binarize=False).search_rows
    assignment = clustering.kmeans_assignment(rows, len(torch.unique(labels)), seed=11)
    assert len(np.unique(assignment)) <= 9
    assert first["nmi"] == pytest.approx(normalized_mutual_info_score(labels.numpy(), assignment), abs=1e-12)
    assert first["ami"] == pytest.approx(adjusted_mutual_info_score(labels.numpy(), assignment), abs=1e-12)
    assert first["f1"] == pytest.approx(reference_pairwise_f1(labels.tolist(), assignment.tolist()), abs=1e-12)
    assert 0.5 < first["nmi"] <= 1.0
