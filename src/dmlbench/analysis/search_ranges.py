"""Search spaces that can be searched: where the chosen values sit in their ranges over a method's searches, and
parameter values that train the same model.

A range whose best values pile up at one end may not contain the optimum; a range in which different values train
bit-identical models (e.g. a contrastive margin above the distance-weighted sampler's cutoff: every sampled
negative's hinge is active whatever the margin) spends trials on one model. Both inflate the search's luck
(``analysis.search_luck``) and waste a budget, and neither shows in a score table. These functions take plain
values: the ranges as the benchmark YAML declares them (``{low, high, log}``), the values each search chose, and
each trained model's digest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# A chosen value this close to an end (a fraction of the range, on its log scale where searched on it) is at the edge.
EDGE_FRACTION = 0.05
# A parameter is flagged when at least this share of a method's searches chose a value at the same edge: three times
# the share that values spread evenly over the range would put within one edge's ``EDGE_FRACTION``.
EDGE_SHARE = 0.15


def edge_position(bounds: Mapping[str, Any] | None, value: Any) -> float | None:
    """Where ``value`` lies in its search range, 0 at ``low`` and 1 at ``high``, on the log scale when the
    range is searched on it; ``None`` for a categorical or non-numeric entry."""
    if not isinstance(bounds, Mapping) or "low" not in bounds or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    low, high = float(bounds["low"]), float(bounds["high"])
    if bounds.get("log"):
        return (math.log(value) - math.log(low)) / (math.log(high) - math.log(low))
    return (value - low) / (high - low)


@dataclass(frozen=True)
class EdgeCount:
    """How many of a method's ``searches`` chose parameter ``key`` within ``EDGE_FRACTION`` of the range's ``edge``
    (``low`` or ``high``)."""

    method: str
    key: str
    edge: str
    at_edge: int
    searches: int

    @property
    def share(self) -> float:
        return self.at_edge / self.searches


def edge_counts(spaces: Mapping[str, Mapping[str, Any]], chosen: Mapping[str, Sequence[Mapping[str, Any]]],
                share: float = EDGE_SHARE, fraction: float = EDGE_FRACTION) -> list[EdgeCount]:
    """Every (method, parameter, edge) at which at least ``share`` of the method's searches chose a value within
    ``fraction`` of that end of the range: ``spaces`` maps a method to its search space as declared, ``chosen`` to
    the best parameters of each of its searches. In the order of ``chosen``, then of the space."""
    flagged = []
    for method, searches in chosen.items():
        for key, bounds in spaces.get(method, {}).items():
            positions = [edge_position(bounds, params.get(key)) for params in searches]
            found = [p for p in positions if p is not None]
            if not found:
                continue
            for edge, near in (("low", lambda p: p <= fraction), ("high", lambda p: p >= 1.0 - fraction)):
                at_edge = sum(near(p) for p in found)
                if at_edge and at_edge >= share * len(found):
                    flagged.append(EdgeCount(method, key, edge, at_edge, len(found)))
    return flagged


def edge_words(flags: Sequence[EdgeCount]) -> str:
    """The flags in one sentence, or "" for none."""
    if not flags:
        return ""
    listed = "; ".join(f"{f.method} {f.key} at its {f.edge} end in {f.at_edge} of {f.searches} search(es)" for f in flags)
    return (f"Search ranges whose chosen values sit at an edge (within {100 * EDGE_FRACTION:g}% of the range, in at least "
            f"{100 * EDGE_SHARE:g}% of the searches), where the optimum may lie outside the range: {listed}.")


@dataclass(frozen=True)
class SameModel:
    """Different values of a method's parameters that trained the same model (equal ``digest``) in one search."""

    method: str
    digest: str
    params: tuple[tuple[tuple[str, Any], ...], ...]  # each trial's parameters, as sorted items


def same_models(trials: Mapping[str, Sequence[tuple[Mapping[str, Any], str]]]) -> list[SameModel]:
    """Per search (``trials``: search name -> each trial's parameters and its model's digest, trained on the same
    seed and fold), the groups of trials with different parameters and one digest: the parameters' difference
    changed nothing the training did."""
    found = []
    for name, runs in trials.items():
        by_digest: dict[str, list[tuple[tuple[str, Any], ...]]] = {}
        for params, digest in runs:
            items = tuple(sorted(params.items()))
            if items not in by_digest.setdefault(digest, []):
                by_digest[digest].append(items)
        found += [SameModel(name, digest, tuple(group)) for digest, group in by_digest.items() if len(group) > 1]
    return found


def same_model_groups(found: Sequence[SameModel], quoted: bool = True) -> str:
    """The groups as a list: ``method: k=v = k=v; ...`` (the method in backticks when ``quoted``)."""
    return "; ".join((f"`{group.method}`" if quoted else group.method) + ": "
                     + " = ".join(", ".join(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}"
                                            for key, value in params) for params in group.params) for group in found)


def same_model_words(found: Sequence[SameModel]) -> str:
    """The groups in one sentence, or "" for none."""
    if not found:
        return ""
    return (f"Different parameter values that trained bit-identical models (the same checkpoint under the same seed and "
            f"fold), so a range spends trials on one model: {same_model_groups(found)}.")
