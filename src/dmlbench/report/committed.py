"""A committed study re-judged from the files it was committed with, by today's rules: ``runs.csv`` and
``benchmark.json`` (and ``search_repeats.csv`` where the searches were repeated), with no storage and
no checkpoints. Its scores become the report's reproductions and go through the report's own analysis
(``report.analysis.analyse``), so the verdict files come out as a new report would write them:
``comparisons.csv``, ``claim_comparisons.csv``, with repeated searches ``method_comparisons.csv`` and
``search_variance.csv``, and, where the study was committed with its per-class sums (``class_sums.csv``),
``class_bootstrap.csv``."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dmlbench import files
from dmlbench.analysis.class_bootstrap import ClassBootstrap, read_class_sums
from dmlbench.analysis.endpoints import ALL_MODES, SearchTable, read_result_counts, read_search_table
from dmlbench.analysis.search_luck import (
    VarianceComponents,
    pooled_search_sd,
    search_sd_upper_bound,
    search_variance_from_means,
    variance_components,
)
from dmlbench.analysis.search_ranges import edge_counts, edge_words, same_model_groups, same_models
from dmlbench.analysis.sequential import sequential_csv
from dmlbench.analysis.verdicts import CLAIM_COLUMNS, LEADERBOARD_METRICS, comparison_csv, judge_search_means
from dmlbench.errors import UserInputError
from dmlbench.protocol import layout
from dmlbench.protocol.design.benchmark import SHARED_SEEDS
from dmlbench.protocol.design.benchmark_file import read_benchmark
from dmlbench.protocol.run.rounds import judge_study
from dmlbench.protocol.units.results import MethodReproductions, ReproductionOutcome, compared_modes
from dmlbench.report.analysis import ALPHA, analyse
from dmlbench.report.tables import claim_rows, csv_text
from dmlbench.report.uncertainty import (
    bootstrap_endpoints,
    class_bootstrap_csv,
    judged_bootstrap,
    judged_method_families,
    listed_families,
    repeated_scores,
    search_variance_csv,
)

SearchMeans = dict[tuple[str, str], dict[str, dict[int, float]]]


@dataclass(frozen=True)
class Rejudged:
    """The verdict files re-judged (name -> text), which of them differ from the stored ones, and a summary."""

    texts: dict[str, str]
    changed: list[str]
    summary: str


def rejudge(directory: Path, *, write: bool) -> Rejudged:
    """The verdict files of the study in ``directory`` as today's rules give them from its committed files;
    with ``write`` the ones that differ replace the stored ones (atomically)."""
    directory = Path(directory)
    if not (directory / layout.RUNS_CSV).is_file():
        raise UserInputError(f"{directory} holds no {layout.RUNS_CSV} (a finished benchmark or report folder)")
    texts = verdict_texts(directory)
    changed = [name for name, text in texts.items()
               if not (directory / name).is_file() or (directory / name).read_text() != text]
    if write:
        for name in changed:
            files.atomic_write_text(directory / name, texts[name])
    lines = [f"{directory / name}: {'rewritten' if write else 'differs from today' + chr(39) + 's rules'}" for name in changed]
    same = [name for name in texts if name not in changed]
    if same:
        lines.append(f"{directory}: {', '.join(same)} the same as today's rules give")
    return Rejudged(texts, changed, "\n".join(lines))


def verdict_texts(directory: Path) -> dict[str, str]:
    """``comparisons.csv``, ``claim_comparisons.csv`` and (searches repeated) ``method_comparisons.csv``, or for a
    sequential study ``sequential.csv``."""
    record = read_benchmark(directory)
    analysis = record.analysis_spec()
    table = read_search_table(directory / layout.RUNS_CSV)
    check_complete(directory, table, record.methods)
    results = _reproductions(table, record.protocol.first_seed)
    computed = list(record.metrics or LEADERBOARD_METRICS)
    claims = analyse(results, analysis, {}, computed)
    families = [(mode, metric, claims.families[(mode, metric)]) for mode in compared_modes(results)
                for metric in LEADERBOARD_METRICS if (mode, metric) in claims.families]
    texts = {layout.COMPARISONS_CSV: comparison_csv([f for f in families if not isinstance(f[2], str)], ALPHA)}
    if claims.references or claims.pairs or claims.reranking:
        texts[layout.CLAIM_COMPARISONS_CSV] = csv_text(CLAIM_COLUMNS, claim_rows(claims))
    shared = record.protocol.search_seeds == SHARED_SEEDS
    repeated = repeated_scores(table)
    sequential = (judge_study(record.protocol, analysis, record.methods, table.get(claims.primary, {}))
                  if record.protocol.sequential else None)
    if sequential is not None:  # its verdicts about the methods are the looks', never a fixed test's
        texts[layout.SEQUENTIAL_CSV] = sequential_csv(sequential, claims.primary)
        repeated = {}
    listed = (judged_method_families(repeated, analysis, shared) if repeated
              else listed_families(judge_search_means(_repeat_means(directory), analysis, layout.BASELINES))
              if sequential is None else [])
    if listed:
        texts[layout.METHOD_COMPARISONS_CSV] = comparison_csv(listed, ALPHA, conditional=False)
    found = search_variances(directory, claims.primary)
    if found:
        texts[layout.SEARCH_VARIANCE_CSV] = search_variance_csv(found, claims.primary)
    if (directory / layout.CLASS_SUMS_CSV).is_file():
        class_scores = read_class_sums(directory / layout.CLASS_SUMS_CSV)
        bootstraps = [judged_bootstrap(class_scores, results, claims, record.protocol.class_bootstrap, endpoint)
                      for endpoint in bootstrap_endpoints(claims)]
        if any(isinstance(bootstrap, ClassBootstrap) for bootstrap in bootstraps):
            texts[layout.CLASS_BOOTSTRAP_CSV] = class_bootstrap_csv([b for b in bootstraps if isinstance(b, ClassBootstrap)])
    return texts


def check_complete(directory: Path, table: SearchTable, methods: list[str]) -> None:
    """Refuse, in one line, a ``runs.csv`` that holds fewer scores than the study it was committed with: fewer
    first-search reproductions of an endpoint than ``results.csv`` counts (``n``; without that file, a method of
    ``benchmark.json`` without scores), or a reproduction that lacks an endpoint its method's others have.
    A file cut short (a partial copy, an interrupted download) would otherwise re-judge as a smaller study."""
    runs = directory / layout.RUNS_CSV
    remedy = f"{runs} looks cut short or partial: restore it (git checkout {runs}) before re-judging"
    results = directory / layout.RESULTS_CSV
    scored = {method for methods_of in table.values() for method in methods_of}
    # Without results.csv every method of benchmark.json must have scores; with it, the methods it lists (a method
    # whose every reproduction failed has none, in either file).
    missing = [method for method in methods if method not in scored] if not results.is_file() else []
    if missing:
        raise UserInputError(f"{runs} holds no scores of method {missing[0]!r} of {layout.BENCHMARK_FILE}; {remedy}")
    for (method, mode, metric), n in (read_result_counts(results) if results.is_file() else {}).items():
        counted = len(table.get((mode, metric), {}).get(method, {}).get(0, {}))
        if counted != n:
            raise UserInputError(f"{runs} holds {counted} of the {n} reproductions {layout.RESULTS_CSV} counts for "
                                 f"{method} {mode} {metric}; {remedy}")
    endpoints: dict[str, set[tuple[str, str]]] = {}
    for endpoint, methods_of in table.items():
        for method in methods_of:
            endpoints.setdefault(method, set()).add(endpoint)
    for endpoint, methods_of in sorted(table.items()):
        for method, by_search in methods_of.items():
            for search, by_reproduction in by_search.items():
                others = {reproduction for other in endpoints[method] for reproduction in table[other][method].get(search, {})}
                lacking = sorted(others - set(by_reproduction))
                if lacking:
                    raise UserInputError(f"{runs}: reproduction {lacking[0]} of {method} (search {search}) has no "
                                         f"{endpoint[0]} {endpoint[1]} score though its others do; {remedy}")


def _reproductions(table: SearchTable, first_seed: int) -> dict[str, MethodReproductions]:
    """Each method's first search as the report's reproductions (seed ``first_seed + reproduction``)."""
    scores: dict[str, dict[int, dict[str, dict[str, float]]]] = {}
    for (mode, metric), methods in table.items():
        for method, by_search in methods.items():
            for reproduction, value in by_search.get(0, {}).items():
                scores.setdefault(method, {}).setdefault(reproduction, {}).setdefault(mode, {})[metric] = value
    return {method: MethodReproductions(method, {}, "", [
        ReproductionOutcome(reproduction, first_seed + reproduction, [], values) for reproduction, values in sorted(by_rep.items())])
        for method, by_rep in scores.items()}


def _repeat_means(directory: Path) -> SearchMeans:
    """The primary endpoint's search means from ``search_repeats.csv`` (studies whose ``runs.csv`` predates
    its ``search`` column); its last column is ``test_<mode>_<metric>``. A damaged file (cut short: it is
    always written whole, ending in a newline; a row without a search mean) is a one-line ``UserInputError``."""
    path = directory / layout.SEARCH_REPEATS_CSV
    if not path.is_file():
        return {}
    text = path.read_text()
    if not text.endswith("\n"):
        raise UserInputError(f"{path} is truncated (it does not end with a whole row); restore it from a copy")
    rows = list(csv.DictReader(text.splitlines()))
    column = [name for name in rows[0] if name.startswith("test_")][0] if rows else ""
    mode = next((m for m in sorted(ALL_MODES, key=len, reverse=True) if column.startswith(f"test_{m}_")), None)
    if mode is None:
        return {}
    means: dict[str, dict[int, float]] = {}
    for line, row in enumerate(rows, start=2):
        try:
            means.setdefault(row["method"], {})[int(row["search"])] = float(row[column])
        except (KeyError, TypeError, ValueError):
            raise UserInputError(f"{path} line {line} is not a row of method, search and {column}; "
                                 "restore the file from a copy") from None
    return {(mode, column[len(f"test_{mode}_"):]): means}



def search_variances(directory: Path, endpoint: tuple[str, str]) -> dict[str, VarianceComponents]:
    """Each repeated method's search and seed variances on ``endpoint``: the one-way ANOVA of ``runs.csv``'s
    searches, or, for a ``runs.csv`` without them, the variance of ``search_repeats.csv``'s search means
    less the seed variance of search 0 over its seeds (``search_luck.search_variance_from_means``)."""
    table = read_search_table(Path(directory) / layout.RUNS_CSV).get(endpoint, {})
    found = {method: variance_components(by_search) for method, by_search in table.items()
             if method not in layout.BASELINES and len(by_search) >= 2}
    if found:
        return found
    for method, by_search in _repeat_means(Path(directory)).get(endpoint, {}).items():
        seeds = list(table.get(method, {}).get(0, {}).values())
        if len(by_search) >= 2 and len(seeds) >= 2:
            seed_variance = float(np.var(seeds, ddof=1))
            found[method] = VarianceComponents(search_variance_from_means(by_search, seed_variance, len(seeds)),
                                               seed_variance, len(by_search), len(seeds))
    return found


def pilot_search_sd(directory: Path, endpoint: tuple[str, str],
                    methods: list[str]) -> tuple[dict[str, float], dict[str, float], str] | None:
    """Each of ``methods``' search SD in a pilot with repeated searches and its approximate upper bound
    (``search_luck.search_sd_upper_bound`` of that method alone), a method the pilot did not repeat at the SD
    pooled over those it did (``search_luck.pooled_search_sd``), and a note saying which were pooled and whether
    the pilot's searches shared their seeds (its search SDs then miss the seed effect every search shared:
    biased low); ``None`` when no method's search was repeated."""
    found = search_variances(directory, endpoint)
    if not found:
        return None
    pooled, pooled_bound = pooled_search_sd(found), search_sd_upper_bound(found)
    sds = {method: found[method].search_sd if method in found else pooled for method in methods}
    bounds = {method: search_sd_upper_bound({method: found[method]}) if method in found else pooled_bound for method in methods}
    notes = [f"measured in {directory} per method"]
    missing = [method for method in methods if method not in found]
    if missing:
        notes.append(f"pooled for {', '.join(missing)}, which it did not repeat")
    if read_benchmark(directory).protocol.search_seeds == SHARED_SEEDS:
        notes.append("its searches shared their seeds, so these SDs are biased low")
    return sds, bounds, "; ".join(notes)


def pilot_range_notes(directory: Path) -> list[str]:
    """What a committed pilot with repeated searches says about its search ranges (``search_ranges``): parameters
    chosen at one edge of their range in a share of a method's searches (``search_repeats.csv``'s best parameters),
    and, where the searches shared their seeds, searches whose chosen parameters differ but whose reproductions
    scored identically on every endpoint and seed (``runs.csv``): they trained the same models."""
    path = directory / layout.SEARCH_REPEATS_CSV
    if not path.is_file():
        return []
    chosen: dict[str, dict[int, dict[str, Any]]] = {}
    for row in csv.DictReader(path.read_text().splitlines()):
        params = dict(item.split("=", 1) for item in row["best_params"].split(";") if item)
        chosen.setdefault(row["method"], {})[int(row["search"])] = {key: _number(value) for key, value in params.items()}
    record = read_benchmark(directory)
    spaces = {method.name: method.search for method in record.spec.methods}
    notes = [edge_words(edge_counts(spaces, {method: list(by_search.values()) for method, by_search in chosen.items()}))]
    if record.protocol.search_seeds == SHARED_SEEDS:
        table = read_search_table(directory / layout.RUNS_CSV)
        scored = {method: {search: repr(sorted((endpoint, sorted(table[endpoint][method][search].items()))
                                               for endpoint in table if search in table[endpoint].get(method, {})))
                           for search in by_search} for method, by_search in chosen.items()}
        same = same_models({method: [(chosen[method][search], digest) for search, digest in by_search.items()]
                            for method, by_search in scored.items()})
        if same:
            notes.append("Searches whose chosen parameters differ but whose reproductions scored identically on every "
                         "endpoint and seed (the searches shared their seeds, so these are the same models): "
                         + same_model_groups(same, quoted=False) + ".")
    return [note for note in notes if note]


def _number(text: str) -> Any:
    """A parameter value as ``search_repeats.csv`` writes it (``repr``): a number where it is one."""
    try:
        return float(text) if any(mark in text for mark in ".e") else int(text)
    except ValueError:
        return text
