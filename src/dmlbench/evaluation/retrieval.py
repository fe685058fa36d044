"""Retrieval metrics from ranked neighbour lists.

Inputs are ``hits`` (bool ``[Q, k]``: the i-th neighbour of query q has q's label), ``relevant``
(int ``[Q]``: R, the number of references with q's label, the query itself excluded) and
``class_sizes`` (int ``[Q]``: k_c of seed 004 eq. 29). Queries with R = 0 are left out of every
metric except mAP@C and mAP@1000, which average over all queries as eq. 29-30 are written.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _mean(values: Tensor) -> float:
    return float(values.to(torch.float64).mean()) if values.numel() else float("nan")


def _positions(hits: Tensor) -> Tensor:
    return torch.arange(1, hits.shape[1] + 1, dtype=torch.float64)


def precision_at_1(hits: Tensor, relevant: Tensor) -> float:
    """Precision@1 ("Recall@1" in most papers), Musgrave et al. 2020 section 3.2."""
    return _mean(hits[relevant > 0, 0])


def recall_at_k(hits: Tensor, relevant: Tensor, k: int) -> float:
    """Recall@K: 1 if any of the K nearest has the query's label, Roth et al. 2020 supp. eq. 26."""
    return _mean(hits[relevant > 0, :k].any(dim=1))


def r_precision(hits: Tensor, relevant: Tensor) -> float:
    """R-Precision r/R over the R nearest, Musgrave et al. 2020 section 3.2."""
    valid = relevant > 0
    hits, relevant = hits[valid], relevant[valid]
    within_r = torch.arange(hits.shape[1]).unsqueeze(0) < relevant.unsqueeze(1)
    return _mean((hits & within_r).sum(dim=1, dtype=torch.float64) / relevant)


def average_precision_at_r(hits: Tensor, relevant: Tensor) -> Tensor:
    """Per-query AP@R = (1/R) sum_{i<=R} P(i) rel(i), Musgrave et al. 2020 eq. 3; NaN where R = 0."""
    within_r = torch.arange(hits.shape[1]).unsqueeze(0) < relevant.unsqueeze(1)
    relevant_hits = hits & within_r
    precision = relevant_hits.cumsum(dim=1, dtype=torch.float64) / _positions(hits)
    values = (precision * relevant_hits).sum(dim=1) / relevant
    return values.masked_fill(relevant == 0, float("nan"))


def map_at_r(hits: Tensor, relevant: Tensor) -> float:
    """MAP@R, the mean of AP@R over queries with R > 0, Musgrave et al. 2020 eq. 4."""
    return _mean(average_precision_at_r(hits, relevant)[relevant > 0])


def mean_reciprocal_rank(hits: Tensor, relevant: Tensor) -> float:
    """Mean of 1/rank of the first correct neighbour among ``hits``' columns (0 if none), Voorhees 1999 (TREC-8 QA report).

    ``evaluate`` passes the k_max nearest neighbours, k_max the largest class size among the
    references (the query counted when queries are the references); pytorch-metric-learning's
    ``AccuracyCalculator`` likewise ranks only its k retrieved neighbours.
    """
    hits = hits[relevant > 0]
    found = hits.any(dim=1)
    first = hits.to(torch.int8).argmax(dim=1).to(torch.float64) + 1.0
    return _mean(torch.where(found, 1.0 / first, torch.zeros_like(first)))


def map_at_c(hits: Tensor, class_sizes: Tensor) -> float:
    """mAP@C, Roth et al. 2020 supp. eq. 29, as written: mean over all queries of |same label among the k_c nearest| / k_c.

    k_c is the number of samples of the query's class (the query included when queries are the
    references), so a query whose class has no other member scores 0. The authors' released code
    averages cumulative precisions instead; we follow the equation (docs/decisions.md).
    """
    within = torch.arange(hits.shape[1]).unsqueeze(0) < class_sizes.unsqueeze(1)
    found = (hits & within).sum(dim=1, dtype=torch.float64)
    return _mean(torch.where(class_sizes > 0, found / class_sizes.clamp_min(1), torch.zeros_like(found)))


def map_at_1000(hits: Tensor) -> float:
    """mAP@1000, Roth et al. 2020 supp. eq. 30, as written: mean over all queries of |same label among the 1000 nearest| / 1000.

    With fewer than 1000 references all of them are recalled and the divisor stays 1000.
    """
    return _mean(hits[:, :1000].sum(dim=1, dtype=torch.float64) / 1000.0)
