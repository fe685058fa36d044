"""Nearest neighbours, retrieval and clustering metrics, and embedding-space analysis.

``evaluate(embeddings, labels, ...)`` is the one implementation behind the Python API and
``dmlbench evaluate``.
"""

from dmlbench.evaluation.api import (
    CLUSTERING_METRICS,
    COUNT_KEYS,
    DEFAULT_KS,
    RETRIEVAL_METRICS,
    available_metrics,
    concatenate,
    default_metrics,
    evaluate,
    evaluate_many,
)
from dmlbench.evaluation.neighbors import BACKENDS, Neighbors, nearest_neighbors
from dmlbench.evaluation.table import format_table

__all__ = [
    "BACKENDS",
    "CLUSTERING_METRICS",
    "COUNT_KEYS",
    "DEFAULT_KS",
    "RETRIEVAL_METRICS",
    "Neighbors",
    "available_metrics",
    "concatenate",
    "default_metrics",
    "evaluate",
    "evaluate_many",
    "format_table",
    "nearest_neighbors",
]
