"""The metric registry: each metric's function, the neighbours it needs, its title and its direction.

``evaluate`` computes, the report titles and ``dmlbench list metrics`` lists whatever is registered
here, so a new metric is one module (CONTRIBUTING.md). A retrieval metric is
``compute(hits, layout) -> float`` (``hits``: bool ``[Q, k]``, the i-th neighbour of query q has
q's label; ``layout``: the ``QueryLayout`` of the queries) and needs ``neighbours(layout)`` columns
of ``hits``; a clustering metric is ``compute(labels, clusters) -> float`` on int arrays ``[N]``.
A family of names (``recall_at_<k>``) is a pattern whose match builds the metric.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from dmlbench.errors import UserInputError
from dmlbench.evaluation import clustering, retrieval


@dataclass(frozen=True)
class QueryLayout:
    """Who queries whom in one retrieval evaluation, and how many correct answers each query has.

    ``relevant`` is R per query (references with its label, itself excluded, and with ``domains`` only
    those of other domains); ``class_sizes`` is k_c of seed 004 eq. 29 (the query counted when queries
    are the references); ``available`` is the number of references every query can retrieve.
    """

    query_ids: Tensor
    reference_ids: Tensor
    relevant: Tensor
    class_sizes: Tensor
    self_retrieval: bool
    largest_class: int
    available: int


@dataclass(frozen=True)
class Metric:
    """One registered metric. ``neighbours`` is ``None`` for a clustering metric."""

    name: str
    title: str  # as the report's tables and figures name it
    higher_is_better: bool
    compute: Callable[..., float]
    neighbours: Callable[[QueryLayout], int] | None
    summary: str = ""  # the first line of the docstring of the function that holds the formula

    @property
    def is_clustering(self) -> bool:
        return self.neighbours is None


class MetricRegistry:
    """Metrics by name, and families of names resolved by a pattern, listed in the order registered."""

    def __init__(self) -> None:
        self._metrics: dict[str, Metric] = {}
        self._families: dict[str, tuple[re.Pattern[str], Callable[[re.Match[str]], Metric]]] = {}
        self._listing: list[str] = []  # names and family names (``recall_at_<k>``)

    def add(self, metric: Metric) -> Metric:
        if metric.name in self._metrics or self._family_of(metric.name) is not None:
                raise UserInputError(f"metric {metric.name!r} is already registered; choose another name")
        self._metrics[metric.name] = metric
        self._listing.append(metric.name)
        return metric

    def add_family(self, shown_as: str, pattern: str, build: Callable[[re.Match[str]], Metric]) -> None:
        """Names that fully match ``pattern`` are ``build(match)``; ``shown_as`` lists the family."""
        if shown_as in self._families:
                raise UserInputError(f"metric {shown_as!r} is already registered; choose another name")
        self._families[shown_as] = (re.compile(pattern), build)
        self._listing.append(shown_as)

    def register(
        self, name: str, *, title: str | None = None, neighbours: int | Callable[[QueryLayout], int] | None = None,
        higher_is_better: bool = True, clustering: bool = False,
    ) -> Callable[[Callable[..., float]], Callable[..., float]]:
        """Decorator for a metric function (the module docstring says which arguments it takes).

        ``neighbours``: how many nearest neighbours per query it reads, an int (at most the
        references available) or a function of the ``QueryLayout``; default the largest class,
        which ``evaluate`` retrieves anyway. ``title`` defaults to ``name``."""
        if clustering and neighbours is not None:
                raise UserInputError(f"metric {name!r}: a clustering metric reads no neighbours")

        def decorator(compute: Callable[..., float]) -> Callable[..., float]:
                needs = None if clustering else _as_neighbours(neighbours)
                self.add(Metric(name, title or name, higher_is_better, compute, needs, _summary(compute)))
                return compute

        return decorator

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._metrics or self._family_of(name) is not None)

    def get(self, name: str) -> Metric:
        if name in self._metrics:
                return self._metrics[name]
        family = self._family_of(name)
        if family is None:
                raise UserInputError(f"unknown metric {name!r}; known: {', '.join(self._listing)}")
        pattern, build = self._families[family]
        match = pattern.fullmatch(name)
        assert match is not None
        return build(match)

    def listing(self) -> list[str]:
        """Every name and family, in the order registered (the built-in ones first)."""
        return list(self._listing)

    def entry(self, shown: str) -> Metric | None:
        """The metric a listed name stands for; ``None`` for a family."""
        return self._metrics.get(shown)

    def family_summary(self, shown_as: str) -> str:
        return _summary(self._families[shown_as][1])

    def _family_of(self, name: str) -> str | None:
        return next((shown for shown, (pattern, _) in self._families.items() if pattern.fullmatch(name)), None)


def _as_neighbours(neighbours: int | Callable[[QueryLayout], int] | None) -> Callable[[QueryLayout], int]:
    if neighbours is None:
        return _largest_class
    if callable(neighbours):
        return neighbours
    if not isinstance(neighbours, int) or isinstance(neighbours, bool) or neighbours < 1:
        raise UserInputError(f"a metric's neighbours must be a positive int or a function of the layout; got {neighbours!r}")
    count = neighbours
    return lambda layout: min(layout.available, count)


def _summary(function: Callable[..., object]) -> str:
    doc = inspect.getdoc(function) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


METRICS = MetricRegistry()


def metric_title(name: str) -> str:
    """The registered title of ``name``, or ``name`` itself (a plugin's metric this process did not load)."""
    return METRICS.get(name).title if name in METRICS else name


def _largest_class(layout: QueryLayout) -> int:
    return layout.largest_class


def _max_relevant(layout: QueryLayout) -> int:
    return int(layout.relevant.max())


def _recall_at(match: re.Match[str]) -> Metric:
    """Recall@K: 1 if any of the K nearest has the query's label, Roth et al. 2020 supp. eq. 26."""
    k = int(match.group(1))
    return Metric(match.group(0), f"R@{k}", True, lambda hits, layout: retrieval.recall_at_k(hits, layout.relevant, k),
                  lambda layout: min(layout.available, k), _summary(retrieval.recall_at_k))


def _add_retrieval(name: str, title: str, compute: Callable[[Tensor, QueryLayout], float],
                   neighbours: Callable[[QueryLayout], int], formula: Callable[..., float]) -> None:
    METRICS.add(Metric(name, title, True, compute, neighbours, _summary(formula)))


def _add_clustering(name: str, title: str, compute: Callable[[np.ndarray, np.ndarray], float]) -> None:
    METRICS.add(Metric(name, title, True, compute, None, _summary(compute)))


# The built-in metrics, in the order ``dmlbench list metrics`` has always shown them.
_add_retrieval("precision_at_1", "P@1", lambda hits, layout: retrieval.precision_at_1(hits, layout.relevant),
               lambda layout: 1, retrieval.precision_at_1)
METRICS.add_family("recall_at_<k>", r"recall_at_([1-9][0-9]*)", _recall_at)
_add_retrieval("r_precision", "R-Precision", lambda hits, layout: retrieval.r_precision(hits, layout.relevant),
               _max_relevant, retrieval.r_precision)
_add_retrieval("map_at_r", "MAP@R", lambda hits, layout: retrieval.map_at_r(hits, layout.relevant),
               _max_relevant, retrieval.map_at_r)
_add_retrieval("map_at_c", "mAP@C", lambda hits, layout: retrieval.map_at_c(hits, layout.class_sizes),
               lambda layout: min(layout.available, int(layout.class_sizes.max())), retrieval.map_at_c)
_add_retrieval("map_at_1000", "mAP@1000", lambda hits, layout: retrieval.map_at_1000(hits),
               lambda layout: min(layout.available, 1000), retrieval.map_at_1000)
_add_retrieval("mrr", "MRR",
               lambda hits, layout: retrieval.mean_reciprocal_rank(hits[:, :layout.largest_class], layout.relevant),
               _largest_class, retrieval.mean_reciprocal_rank)
_add_clustering("nmi", "NMI", clustering.nmi)
_add_clustering("ami", "AMI", clustering.ami)
_add_clustering("f1", "F1", clustering.pairwise_f1)
