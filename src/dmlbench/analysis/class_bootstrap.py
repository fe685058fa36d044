"""Uncertainty over the test classes: a paired bootstrap that resamples classes, beside the seeds' intervals.

The reproductions' intervals cover seed noise only; the test classes are one draw of classes too. A
reproduction stores, per test class, how many of its queries have a correct reference (R > 0) and the
sum of their per-query values of P@1, R-Precision and AP@R (``class_sums``: per mode; separated takes
each query's mean over the fold models; with ``evaluation.cross_domain`` the cross-domain modes too,
whose queries with R > 0 are those with a match drawn by another domain). Replicate ``b`` draws as
many classes as there are, with replacement; each query then counts as often as its class was drawn,
against the **fixed gallery** of all test images (of the other domains, cross-domain; docs/decisions.md:
the interval is conditional on the gallery), so a replicate's score is ``sum_c w_bc S_c / sum_c w_bc
N_c``. The same draws serve every method and reproduction (paired), so differences between methods get
an interval over classes: *classes* keeps every reproduction (the mean over seeds per replicate);
*classes and seeds* also redraws the seeds in each replicate (the same seeds for every method).
Percentile intervals; the generator is seeded explicitly.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dmlbench.analysis.endpoints import cross_domain_mode
from dmlbench.errors import UserInputError
from dmlbench.evaluation.api import concatenate
from dmlbench.evaluation.per_query import PER_QUERY_METRICS, query_scores

DEFAULT_SEED = 0
# Independent streams of one seed: the classes of each replicate, then its seeds.
_CLASS_STREAM, _SEED_STREAM = 1, 2


def class_sums(embeddings: Mapping[str, Tensor], labels: Tensor, metrics: Sequence[str],
               query_mask: Tensor | None = None, domains: Tensor | None = None) -> dict[str, Any] | None:
    """Per test class: the queries with R > 0 (``queries``) and, per mode and per-query metric, the sum
    of their values (``sums``), for the fold models' test embeddings scored as ``evaluate_many`` scores
    them (seed 001 §3.3); with ``domains`` also the cross-domain modes, whose queries with R > 0 (a
    query needs a match drawn by another domain) are ``queries_by_mode``; ``None`` when ``metrics``
    holds no per-query metric."""
    names = [name for name in metrics if name in PER_QUERY_METRICS]
    if not names:
        return None
    matrices = [matrix.detach().cpu().to(torch.float64) for matrix in embeddings.values()]
    query_labels, values = _mode_values(matrices, labels, names, query_mask, None)
    classes, positions = torch.unique(query_labels, return_inverse=True)

    def queries_and_sums(per_mode: dict[str, dict[str, Tensor]]) -> tuple[list[int], dict[str, dict[str, list[float]]]]:
        valid = ~torch.isnan(next(iter(per_mode.values()))[names[0]])  # R > 0: alike for every metric and fold model
        kept = positions[valid]

        def per_class(value: Tensor) -> Tensor:
            return torch.zeros(len(classes), dtype=value.dtype).index_add_(0, kept, value[valid])

        sums = {mode: {name: per_class(value[name]).tolist() for name in names} for mode, value in per_mode.items()}
        return per_class(torch.ones_like(positions)).tolist(), sums

    queries, sums = queries_and_sums(values)
    record = {"classes": classes.tolist(), "queries": queries, "sums": sums}
    if domains is not None:  # the same queries, so the same classes in the same order
        crossed_values = _mode_values(matrices, labels, names, query_mask, domains)[1]
        crossed, crossed_sums = queries_and_sums({cross_domain_mode(mode): value for mode, value in crossed_values.items()})
        record["sums"].update(crossed_sums)
        record["queries_by_mode"] = {mode: crossed for mode in crossed_sums}
    return record


def _mode_values(matrices: Sequence[Tensor], labels: Tensor, names: Sequence[str], query_mask: Tensor | None,
                 domains: Tensor | None) -> tuple[Tensor, dict[str, dict[str, Tensor]]]:
    """The queries' labels and their per-query values in the two modes: of the concatenated fold models,
    and each query's mean over the fold models (separated)."""
    query_labels, concatenated = query_scores(concatenate(matrices), labels, names, query_mask=query_mask, domains=domains)
    separate = [query_scores(matrix, labels, names, query_mask=query_mask, domains=domains)[1] for matrix in matrices]
    separated = {name: torch.stack([fold[name] for fold in separate]).mean(dim=0) for name in names}
    return query_labels, {"concatenated": concatenated, "separated": separated}


ClassSums = dict[str, dict[int, dict[str, Any]]]  # method -> reproduction seed -> ``class_sums`` record
CLASS_SUMS_COLUMNS = ["method", "seed", "mode", "class", "queries"]


def class_sums_csv(per_class: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> str:
    """``method -> seed -> class_sums record`` as CSV text, one row per method, seed, mode and class (in the
    record's order, which the bootstrap's draws index), the sums as ``repr`` so they read back exactly:
    the committed file from which ``class_bootstrap`` recomputes without the study's storage."""
    metrics = sorted({metric for records in per_class.values() for record in records.values()
                      for by_metric in record["sums"].values() for metric in by_metric})
    stream = io.StringIO()
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow([*CLASS_SUMS_COLUMNS, *metrics])
    for method, records in per_class.items():
        for seed, record in records.items():
            for mode, by_metric in record["sums"].items():
                for position, label in enumerate(record["classes"]):
                    writer.writerow([method, seed, mode, label, int(queries_of(record, mode)[position]),
                                     *(repr(float(by_metric[metric][position])) if metric in by_metric else "" for metric in metrics)])
    return stream.getvalue()


def read_class_sums(path: Path) -> ClassSums:
    """The records ``class_sums_csv`` wrote; a file that is not one is a one-line ``UserInputError``."""
    try:
        with Path(path).open(newline="") as stream:
            rows = list(csv.DictReader(stream))
            header = list(rows[0]) if rows else []
        if header[:len(CLASS_SUMS_COLUMNS)] != CLASS_SUMS_COLUMNS:
            raise ValueError("header")
        metrics = header[len(CLASS_SUMS_COLUMNS):]
        per_class: ClassSums = {}
        for row in rows:
            record = per_class.setdefault(row["method"], {}).setdefault(int(row["seed"]), {
                "classes": [], "queries": [], "sums": {}, "queries_by_mode": {}})
            mode = row["mode"]
            if mode not in record["sums"]:
                record["sums"][mode] = {metric: [] for metric in metrics if row[metric] != ""}
                record["queries_by_mode"][mode] = []
            if len(record["sums"]) == 1:  # the first mode lists the classes
                record["classes"].append(int(row["class"]))
            record["queries_by_mode"][mode].append(int(row["queries"]))
            for metric, values in record["sums"][mode].items():
                values.append(float(row[metric]))
    except (OSError, KeyError, ValueError, TypeError, IndexError, csv.Error):
        raise UserInputError(f"{path} is not a class-sums file ({', '.join(CLASS_SUMS_COLUMNS)}, then one "
                             "column per metric) or is cut short; restore the committed copy (git checkout), or, where the "
                             "study's storage is on this machine, write it again with dmlbench report") from None
    for records in per_class.values():
        for record in records.values():
            record["queries"] = next(iter(record["queries_by_mode"].values()))
            if any(len(queries) != len(record["classes"]) for queries in record["queries_by_mode"].values()):
                raise UserInputError(f"{path} lists other classes for one reproduction's modes; restore the committed copy "
                                 "(git checkout), or, where the study's storage is on this machine, write it again with dmlbench report")
    return per_class


def queries_of(record: Mapping[str, Any], mode: str) -> list[int]:
    """A ``class_sums`` record's queries with R > 0 per class in ``mode``."""
    return record.get("queries_by_mode", {}).get(mode, record["queries"])


def draw_classes(num_classes: int, replicates: int, seed: int = DEFAULT_SEED) -> np.ndarray:
    """``[replicates, num_classes]`` positions of classes, each replicate drawn with replacement."""
    return np.random.default_rng([seed, _CLASS_STREAM]).integers(0, num_classes, size=(replicates, num_classes))


def draw_seeds(num_seeds: int, replicates: int, seed: int = DEFAULT_SEED) -> np.ndarray:
    """``[replicates, num_seeds]`` positions of reproductions, each replicate drawn with replacement."""
    return np.random.default_rng([seed, _SEED_STREAM]).integers(0, num_seeds, size=(replicates, num_seeds))


def draw_counts(draws: np.ndarray, num_classes: int) -> np.ndarray:
    """How often each class was drawn in each replicate (``[replicates, num_classes]``)."""
    counts = np.zeros((len(draws), num_classes))
    np.add.at(counts, (np.arange(len(draws))[:, None], draws), 1.0)
    return counts


def replicate_scores(counts: np.ndarray, sums: Sequence[float], queries: Sequence[int]) -> np.ndarray:
    """One reproduction's score in every replicate: each query weighted by its class's draw count, the
    gallery fixed, the mean over the weighted queries with R > 0 (``sum_c w_c S_c / sum_c w_c N_c``)."""
    with np.errstate(invalid="ignore", divide="ignore"):  # a replicate that drew no class with a query: NaN
        return counts @ np.asarray(sums, dtype=np.float64) / (counts @ np.asarray(queries, dtype=np.float64))


@dataclass(frozen=True)
class BootstrapInterval:
    """An estimate (the mean over every reproduction on every class) and its percentile intervals with
    the classes resampled (``class_*``) and with the classes and the seeds resampled (``both_*``)."""

    estimate: float
    class_low: float
    class_high: float
    both_low: float
    both_high: float


@dataclass(frozen=True)
class ClassBootstrap:
    """The class bootstrap of one mode and metric: per method, and per compared pair (``a - b``)."""

    mode: str
    metric: str
    replicates: int
    classes: int
    seeds: list[int]
    methods: dict[str, BootstrapInterval]
    differences: dict[tuple[str, str], BootstrapInterval]


def class_bootstrap(per_class: Mapping[str, Mapping[int, Mapping[str, Any]]], mode: str, metric: str,
                    pairs: Sequence[tuple[str, str]], *, replicates: int, seed: int = DEFAULT_SEED,
                    confidence: float = 0.95) -> ClassBootstrap:
    """The paired class bootstrap of ``method -> reproduction seed -> class_sums record`` on one mode and
    metric, over the seeds every method has; ``pairs`` ``(a, b)`` get intervals of ``a - b``."""
    seeds = sorted(set.intersection(*(set(records) for records in per_class.values()))) if per_class else []
    if not seeds or replicates < 1:
        raise UserInputError("the class bootstrap needs per-class test scores of a common reproduction seed "
                             "and at least one replicate")
    first = per_class[next(iter(per_class))][seeds[0]]
    for method, records in per_class.items():
        if any(records[s]["classes"] != first["classes"] for s in seeds):
            raise UserInputError(f"method {method!r} was scored on other test classes than the rest")
        if any(metric not in records[s]["sums"].get(mode, {}) for s in seeds):
            raise UserInputError(f"no per-class {mode} {metric} of method {method!r}")
    count = len(first["classes"])
    counts = draw_counts(draw_classes(count, replicates, seed), count)
    seed_rows = draw_seeds(len(seeds), replicates, seed)
    ones = np.ones((1, count))
    # [seeds, replicates + 1]: every reproduction's score in every replicate; the last column is the
    # unresampled test set.
    values = {method: np.stack([replicate_scores(np.vstack([counts, ones]), records[s]["sums"][mode][metric],
                                                 queries_of(records[s], mode)) for s in seeds])
              for method, records in per_class.items()}

    def interval(table: np.ndarray) -> BootstrapInterval:
        tail = 100.0 * (1.0 - confidence) / 2.0
        by_class = table[:, :-1].mean(axis=0)
        by_both = table[seed_rows, np.arange(replicates)[:, None]].mean(axis=1)
        (class_low, class_high), (both_low, both_high) = (np.nanpercentile(d, [tail, 100.0 - tail]) for d in (by_class, by_both))
        return BootstrapInterval(float(table[:, -1].mean()), float(class_low), float(class_high), float(both_low),
                                 float(both_high))

    return ClassBootstrap(mode, metric, replicates, count, seeds, {method: interval(table) for method, table in values.items()},
                          {(a, b): interval(values[a] - values[b]) for a, b in pairs if a in values and b in values})
