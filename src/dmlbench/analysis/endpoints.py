"""What a study is judged on: its endpoints (a mode and a metric), the scores of ``runs.csv`` per
endpoint, reproductions paired by seed, and the comparisons declared as one Holm family.

These are the judging half's view of a study's committed files; the running half (``protocol``) writes
them, and ``protocol.layout`` names them, so every function here takes a path or plain values."""

from __future__ import annotations

import csv
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from dmlbench.errors import UserInputError

MODES = ("concatenated", "separated")
# With evaluation.cross_domain each mode is scored again with every query's gallery restricted to the
# other domains; those modes are stored only then.
CROSS_DOMAIN_SUFFIX = "_cross_domain"
# With evaluation.rerank each mode is scored again with every query's list re-ranked (not cross-domain).
RERANKED_SUFFIX = "_reranked"
ALL_MODES = (*MODES, *(f"{mode}{CROSS_DOMAIN_SUFFIX}" for mode in MODES), *(f"{mode}{RERANKED_SUFFIX}" for mode in MODES))
# ``search``: which of the method's searches the reproduction reproduced (0, then the repeats of
# ``protocol.search_repeats``); a file written before the column existed holds search 0 only. ``seed``: the seed
# the reproduction trained with (``protocol.search_seeds``); a file written before it existed used
# ``first_seed + reproduction`` in every search.
RUNS_COLUMNS = ("method", "reproduction", "mode", "metric", "value", "search", "seed")

# (mode, metric) -> method -> reproduction -> value
ScoreTable = dict[tuple[str, str], dict[str, dict[int, float]]]
# (mode, metric) -> method -> search -> reproduction -> value
SearchTable = dict[tuple[str, str], dict[str, dict[int, dict[int, float]]]]


def cross_domain_mode(mode: str) -> str:
    """The name of ``mode`` scored cross-domain (``concatenated`` -> ``concatenated_cross_domain``)."""
    return f"{mode}{CROSS_DOMAIN_SUFFIX}"


def reranked_mode(mode: str) -> str:
    """The name of ``mode`` scored with re-ranking (``concatenated`` -> ``concatenated_reranked``)."""
    return f"{mode}{RERANKED_SUFFIX}"


def read_search_table(path: Path) -> SearchTable:
    """Every score of a ``runs.csv`` at ``path`` (baselines included) by search, in the file's order; a
    damaged file (cut short: it is always written whole, ending in a newline; a row that is not a
    score) is a one-line ``UserInputError`` naming it, never a verdict from part of it."""
    table: SearchTable = {}
    for line, row in _whole_rows(path):
        try:
            by_method = table.setdefault((row["mode"], row["metric"]), {})
            by_search = by_method.setdefault(row["method"], {}).setdefault(int(row.get("search") or 0), {})
            by_search[int(row["reproduction"])] = float(row["value"])
        except (KeyError, TypeError, ValueError):
            raise UserInputError(f"{path} line {line} is not a score row of {', '.join(RUNS_COLUMNS)}; "
                                 "restore the file from a copy") from None
    return table


def read_result_counts(path: Path) -> dict[tuple[str, str, str], int]:
    """``(method, mode, metric) -> n`` of a ``results.csv`` at ``path``: the reproductions each mean rests on;
    a damaged file is a one-line ``UserInputError`` naming it, as ``read_search_table``'s."""
    counts = {}
    for line, row in _whole_rows(path):
        try:
            counts[(row["method"], row["mode"], row["metric"])] = int(row["n"])
        except (KeyError, TypeError, ValueError):
            raise UserInputError(f"{path} line {line} is not a row of method, mode, metric, ..., n; "
                                 "restore the file from a copy") from None
    return counts


def _whole_rows(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line number, row)`` of a CSV file always written whole; one cut short is a one-line ``UserInputError``."""
    text = Path(path).read_text()
    if not text.endswith("\n"):
        raise UserInputError(f"{path} is truncated (it does not end with a whole row); restore it from a copy")
    return enumerate(csv.DictReader(text.splitlines()), start=2)


def read_score_table(path: Path) -> ScoreTable:
    """The scores of a ``runs.csv`` at ``path`` from each method's first search (search 0; baselines
    included), in the file's order: what a comparison conditional on one search is made of."""
    return {endpoint: {method: dict(by_search[0]) for method, by_search in methods.items() if 0 in by_search}
            for endpoint, methods in read_search_table(path).items()}


def common_seeds(scores: Mapping[str, Mapping[int, float]]) -> dict[str, dict[int, float]]:
    """``method -> seed -> score`` kept for the seeds (or reproduction numbers) every method scored, in
    order: a failed reproduction removes its seed from all methods, so every comparison stays paired."""
    common = set.intersection(*(set(values) for values in scores.values())) if scores else set()
    return {method: {seed: values[seed] for seed in sorted(common)} for method, values in scores.items()}


def declared_comparisons(references: Sequence[str], pairs: Sequence[Sequence[str]], methods: Sequence[str]) -> list[tuple[str, str]]:
    """The comparisons of one Holm family, ``(a, b)`` for ``a - b``: each method against each reference, then
    the pairs; a pair of methods already compared keeps its first orientation; none declared: every pair."""
    present = set(methods)
    candidates = [(name, reference) for reference in references if reference in present for name in methods if name != reference]
    candidates += [(a, b) for a, b in pairs if a in present and b in present]
    if not references and not pairs:
        candidates = [(a, b) for index, a in enumerate(methods) for b in methods[index + 1:]]
    chosen: dict[frozenset[str], tuple[str, str]] = {}
    for a, b in candidates:
        chosen.setdefault(frozenset((a, b)), (a, b))
    return list(chosen.values())
