"""Per-query diagnostics: for every query, where its first correct neighbour is and its AP@R.

The aggregate metrics of ``evaluate`` say how good a model is; these say *which* queries fail, which
is what a person reads to understand a model. Neighbours come from the same exact engine, ordered by
(exact distance, index), so the numbers here average exactly to ``evaluate``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from dmlbench.evaluation import retrieval
from dmlbench.evaluation.api import _as_embeddings, _as_labels, _as_query_mask, as_domain_codes, query_layout
from dmlbench.evaluation.knn_index import KnnIndex, prepare
from dmlbench.evaluation.neighbors import nearest_neighbors
from dmlbench.validation import check_positive_int

# References whose exact keys are computed at once when a first correct neighbour lies beyond the
# retrieved lists (bounds the [chunk, D] float64 working set).
_REFERENCE_CHUNK = 8192


@dataclass(frozen=True)
class PerQuery:
    """One entry per query (row ids ``query_ids`` of the evaluated matrix).

    ``first_correct_rank`` is 1-based and exact even beyond the retrieved lists; 0 where the query's
    label has no reference (``relevant`` = 0, AP@R is NaN there). ``neighbor_ids`` /
    ``neighbor_distances`` hold the ``k`` nearest references (Euclidean distance, ties by index).
    """

    query_ids: Tensor
    labels: Tensor
    relevant: Tensor
    first_correct_rank: Tensor
    average_precision_at_r: Tensor
    neighbor_ids: Tensor
    neighbor_distances: Tensor

    def worst(self, count: int) -> Tensor:
        """Positions (into this object's rows) of the ``count`` lowest AP@R, ties broken by first
        correct rank (later is worse), then by query id; queries without a match are left out."""
        check_positive_int("count", count)
        valid = torch.nonzero(self.relevant > 0).squeeze(1).numpy()
        order = np.lexsort((
            self.query_ids[valid].numpy(),
            -self.first_correct_rank[valid].numpy(),
            self.average_precision_at_r[valid].numpy(),
        ))
        return torch.from_numpy(valid[order[:count]])


def per_query(
    embeddings: Tensor | np.ndarray,
    labels: Tensor | np.ndarray,
    *,
    query_mask: Tensor | np.ndarray | None = None,
    neighbors: int = 8,
    normalize: bool = True,
    binarize: bool = False,
    backend: str = "torch",
) -> PerQuery:
    """Per-query first correct rank and AP@R (Musgrave et al. 2020 eq. 3), queries as in ``evaluate``."""
    check_positive_int("neighbors", neighbors)
    space = prepare(_as_embeddings(embeddings), normalize=normalize, binarize=binarize)
    label_tensor = _as_labels(labels, space.num_rows)
    layout = query_layout(label_tensor, _as_query_mask(query_mask, space.num_rows))
    k = min(layout.available, max(neighbors, int(layout.relevant.max())))
    found = nearest_neighbors(
        space, layout.query_ids, layout.reference_ids, k, exclude_self=layout.self_retrieval, backend=backend
    )
    query_labels = label_tensor[layout.query_ids]
    hits = label_tensor[found.ids] == query_labels.unsqueeze(1)
    first = torch.where(hits.any(dim=1), hits.to(torch.int8).argmax(dim=1) + 1, 0)
    beyond = torch.nonzero((first == 0) & (layout.relevant > 0)).squeeze(1)
    for position in beyond.tolist():
        first[position] = _exact_first_correct_rank(
            space, label_tensor, int(layout.query_ids[position]), layout.reference_ids, layout.self_retrieval
        )
    shown = min(neighbors, k)
    return PerQuery(
        query_ids=layout.query_ids,
        labels=query_labels,
        relevant=layout.relevant,
        first_correct_rank=first.to(torch.int64),
        average_precision_at_r=retrieval.average_precision_at_r(hits, layout.relevant),
        neighbor_ids=found.ids[:, :shown],
        neighbor_distances=_euclidean(space, found.distances[:, :shown]),
    )


# The retrieval metrics that are a mean over the queries with R > 0 of a per-query value.
PER_QUERY_METRICS = ("precision_at_1", "r_precision", "map_at_r")


def query_scores(
    embeddings: Tensor | np.ndarray,
    labels: Tensor | np.ndarray,
    metrics: Sequence[str],
    *,
    query_mask: Tensor | np.ndarray | None = None,
    domains: Tensor | np.ndarray | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Each query's label and its value of every metric of ``metrics`` in ``PER_QUERY_METRICS`` (float64,
    NaN where R = 0), queries and neighbours as in ``evaluate`` (with ``domains``, cross-domain: each
    query's gallery without its own domain), whose value is their mean over the queries with R > 0:
    P@1 (hit at rank 1), R-Precision r/R and AP@R (Musgrave et al. 2020 §3.2, eq. 3)."""
    space = prepare(_as_embeddings(embeddings), normalize=True, binarize=False)
    label_tensor = _as_labels(labels, space.num_rows)
    domain_codes = as_domain_codes(domains, space.num_rows)
    layout = query_layout(label_tensor, _as_query_mask(query_mask, space.num_rows), domain_codes)
    # R neighbours for every query; a cross-domain gallery shorter than that ends in misses (never matches).
    k = max(1, int(layout.relevant.max()))
    found = nearest_neighbors(space, layout.query_ids, layout.reference_ids, k, exclude_self=layout.self_retrieval,
                              domains=domain_codes)
    query_labels = label_tensor[layout.query_ids]
    # A cross-domain query whose gallery is shorter than k has -1 beyond it (``nearest_neighbors``): misses.
    hits = (found.ids >= 0) & (label_tensor[found.ids.clamp_min(0)] == query_labels.unsqueeze(1))
    within_r = torch.arange(k).unsqueeze(0) < layout.relevant.unsqueeze(1)
    no_match = layout.relevant == 0
    values = {
        "precision_at_1": hits[:, 0].to(torch.float64).masked_fill(no_match, float("nan")),
        "r_precision": ((hits & within_r).sum(dim=1, dtype=torch.float64) / layout.relevant).masked_fill(no_match, float("nan")),
        "map_at_r": retrieval.average_precision_at_r(hits, layout.relevant),
    }
    return query_labels, {name: values[name] for name in metrics if name in PER_QUERY_METRICS}


def _exact_first_correct_rank(
    space: KnnIndex, labels: Tensor, query: int, reference_ids: Tensor, self_retrieval: bool
) -> int:
    """1 + the number of references ordered before the nearest correct one by (exact key, index)."""
    if self_retrieval:
        reference_ids = reference_ids[reference_ids != query]
    keys = torch.cat([
        space.exact_distances(torch.tensor([query]), chunk.unsqueeze(0))[0]
        for chunk in reference_ids.split(_REFERENCE_CHUNK)
    ])
    correct = labels[reference_ids] == labels[query]
    best_key = keys[correct].min()
    best_id = reference_ids[correct & (keys == best_key)].min()
    before = (keys < best_key) | ((keys == best_key) & (reference_ids < best_id))
    return int(before.sum()) + 1


def _euclidean(space: KnnIndex, keys: Tensor) -> Tensor:
    """The exact keys as distances of the embeddings as given: Euclidean, or Hamming when binarised."""
    return keys if space.binary else keys.clamp_min(0.0).sqrt() / space.scale
