"""Clustering metrics on a k-means assignment with as many clusters as classes (docs/decisions.md, Definitions)."""

from __future__ import annotations

import faiss
import numpy as np
from torch import Tensor

# scikit-learn is imported where it is used: it is a second of start-up that retrieval metrics
# (and `dmlbench evaluate --metrics map_at_r`) do not need.

DEFAULT_KMEANS_ITERATIONS = 20


def kmeans_assignment(rows: Tensor, num_clusters: int, *, seed: int, iterations: int = DEFAULT_KMEANS_ITERATIONS) -> np.ndarray:
    """Cluster id of each row after ``iterations`` Lloyd steps of faiss k-means seeded with ``seed``, on all rows."""
    points = np.ascontiguousarray(rows.float().numpy())
    kmeans = faiss.Kmeans(
        points.shape[1], num_clusters, niter=iterations, seed=seed, verbose=False,
        # Use every point (no subsampling) and accept few points per cluster without warnings.
        max_points_per_centroid=max(1, -(-points.shape[0] // num_clusters)), min_points_per_centroid=1,
    )
    kmeans.train(points)
    _, assignment = kmeans.index.search(points, 1)
    return assignment.ravel()


def nmi(labels: np.ndarray, clusters: np.ndarray) -> float:
    """Normalized mutual information (arithmetic normalisation, sklearn), Roth et al. 2020 supp. eq. 27."""
    from sklearn.metrics import normalized_mutual_info_score

    return float(normalized_mutual_info_score(labels, clusters))


def ami(labels: np.ndarray, clusters: np.ndarray) -> float:
    """Adjusted mutual information (sklearn), recommended over NMI by Musgrave et al. 2020 section 2.2."""
    from sklearn.metrics import adjusted_mutual_info_score

    return float(adjusted_mutual_info_score(labels, clusters))


def pairwise_f1(labels: np.ndarray, clusters: np.ndarray) -> float:
    """Pairwise clustering F1 = 2PR/(P+R) over sample pairs, Roth et al. 2020 supp. eq. 28 (pairwise form, docs/decisions.md).

    P: share of same-cluster pairs that share a class; R: share of same-class pairs put in one cluster.
    """
    from sklearn.metrics.cluster import contingency_matrix

    counts = contingency_matrix(labels, clusters, sparse=True).data.astype(np.float64)
    together_and_same = float((counts * (counts - 1) / 2).sum())
    class_sizes = np.bincount(np.unique(labels, return_inverse=True)[1]).astype(np.float64)
    cluster_sizes = np.bincount(np.unique(clusters, return_inverse=True)[1]).astype(np.float64)
    same_class = float((class_sizes * (class_sizes - 1) / 2).sum())
    together = float((cluster_sizes * (cluster_sizes - 1) / 2).sum())
    if together_and_same == 0.0:
        return 0.0
    precision, recall = together_and_same / together, together_and_same / same_class
    return 2.0 * precision * recall / (precision + recall)
