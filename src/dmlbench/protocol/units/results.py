"""A benchmark's results as tables: each method's reproductions, ``results.csv`` (mean and 95%
Student-t interval per method, mode and metric: ``method,mode,metric,mean,ci_low,ci_high,n``) and
``runs.csv`` (each reproduction's value: ``method,reproduction,mode,metric,value``), and paired
comparisons of methods by reproduction seed (seed 001 §3.3: average over runs with confidence intervals).
A reproduction whose training failed has no score: it is kept with its reason and left out of ``n``."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from dmlbench import files
from dmlbench.analysis.endpoints import (
    ALL_MODES,
    MODES,
    RERANKED_SUFFIX,
    RUNS_COLUMNS,
    ScoreTable,
    common_seeds,
    read_score_table,
    reranked_mode,
)
from dmlbench.analysis.statistics import (
    DEFAULT_EQUIVALENCE_MARGIN,
    PairedComparison,
    compare_methods,
    compare_pairs,
    mean_interval,
)
from dmlbench.errors import UserInputError
from dmlbench.protocol import layout
from dmlbench.protocol.queue import attempts

# A reproduction study's attribute, + slot: per-class test sums computed after its trial finished
# (``reproductions.complete_class_sums``), for reproductions scored by a version that stored none.
COMPLETED_CLASS_SUMS = "class_scores_completed/"
RESULTS_COLUMNS = ("method", "mode", "metric", "mean", "ci_low", "ci_high", "n")


@dataclass
class ReproductionOutcome:
    """One reproduction of one method: its seed, fold runs and test scores (``None`` if it failed)."""

    reproduction: int
    seed: int
    run_dirs: list[str]
    scores: dict[str, dict[str, float]] | None = None  # mode -> metric -> value
    reason: str | None = None
    # Per fold model: rho, pi_intra, pi_inter, pi_ratio on its training classes (``training_space``).
    embedding_space: list[dict[str, float]] = field(default_factory=list)


@dataclass
class MethodReproductions:
    method: str
    params: dict[str, Any]
    fold_layout_hash: str
    outcomes: list[ReproductionOutcome] = field(default_factory=list)


def scored_modes(results: Mapping[str, MethodReproductions]) -> list[str]:
    """``MODES``, then the cross-domain and re-ranked modes that some reproduction was scored in (``ALL_MODES`` order)."""
    found = {mode for reproductions in results.values() for outcome in reproductions.outcomes for mode in (outcome.scores or {})}
    return [mode for mode in ALL_MODES if mode in MODES or mode in found]


def compared_modes(results: Mapping[str, MethodReproductions]) -> list[str]:
    """The modes whose declared comparisons form Holm families: ``MODES`` and, where scored, their
    cross-domain versions (another retrieval task); a re-ranked mode is compared with its raw self
    (``compare_reranking``) instead."""
    return [mode for mode in scored_modes(results) if not mode.endswith(RERANKED_SUFFIX)]


def stored_class_sums(completed: Mapping[str, Any], trial: FrozenTrial) -> dict[str, Any] | None:
    """A finished reproduction's per-class test sums: those ``reproductions.complete_class_sums`` stored
    later among its study's attributes (``completed``), else the trial's own, else ``None``."""
    later = completed.get(f"{COMPLETED_CLASS_SUMS}{attempts.slot_of(trial)}")
    return later if later is not None else trial.user_attrs.get("class_scores")


def read_reproductions(study: optuna.Study, method: str, params: Mapping[str, Any], layout_hash: str,
                       output_dir: Path) -> MethodReproductions:
    """A method's reproductions as stored in its study: one outcome per done slot, in order."""
    result = MethodReproductions(method, dict(params), layout_hash)
    for trial in attempts.counted(study):
        attrs = trial.user_attrs
        run_dirs = [str(Path(output_dir) / run_dir) for run_dir in attrs.get("run_dirs", [])]
        scores = attrs.get("scores") if trial.state == TrialState.COMPLETE else None
        result.outcomes.append(ReproductionOutcome(int(attrs["slot"]), int(attrs["seed"]), run_dirs, scores,
                                                   None if scores is not None else attrs.get("fail_reason"),
                                                   list(attrs.get("embedding_space", []))))
    return result


def run_rows(results: Mapping[str, MethodReproductions],
             repeats: Mapping[str, Sequence[MethodReproductions]] | None = None) -> list[dict[str, Any]]:
    """One row per method, search, scored reproduction, mode and metric (the columns of ``runs.csv``): each
    method's first search (0), then the repeated searches of ``repeats`` (``method -> [search 1, 2, ...]``)."""
    rows = []
    for method, reproductions in results.items():
        for search, searched in enumerate([reproductions, *(repeats or {}).get(method, [])]):
            for outcome in searched.outcomes:
                for mode, metrics in (outcome.scores or {}).items():
                    for metric, value in metrics.items():
                        rows.append({"method": method, "reproduction": outcome.reproduction, "mode": mode,
                                     "metric": metric, "value": value, "search": search, "seed": outcome.seed})
    return rows


def result_rows(results: Mapping[str, MethodReproductions]) -> list[dict[str, Any]]:
    """Mean and 95% Student-t interval over reproductions per method, mode and metric (``results.csv``)."""
    grouped: dict[tuple[str, str, str], list[float]] = {}
    for row in run_rows(results):
        grouped.setdefault((row["method"], row["mode"], row["metric"]), []).append(row["value"])
    rows = []
    for (method, mode, metric), values in grouped.items():
        interval = mean_interval(values)
        rows.append({"method": method, "mode": mode, "metric": metric, "mean": interval.mean,
                     "ci_low": interval.low, "ci_high": interval.high, "n": interval.n})
    return rows


def compare_reproductions(
    results: Mapping[str, MethodReproductions], mode: str = "concatenated", metric: str = "map_at_r",
    margin: float = DEFAULT_EQUIVALENCE_MARGIN,
) -> list[PairedComparison]:
    """Every pair of methods on one mode and metric, reproductions paired by seed (``statistics.compare_methods``:
    paired t-test, Wilcoxon signed-rank, TOST within ``±margin``, Holm across the pairs, Cohen's d_z).
    Only seeds that every method scored are compared, so a failed reproduction removes its seed from all methods."""
    return compare_methods(seed_scores(results, mode, metric), margin)


def seed_scores(results: Mapping[str, MethodReproductions], mode: str, metric: str) -> dict[str, dict[int, float]]:
    """``method -> seed -> score`` on one mode and metric, for the seeds that every method scored
    (a failed reproduction removes its seed from all methods, so every comparison stays paired)."""
    if mode not in ALL_MODES:
        raise UserInputError(f"mode must be one of {', '.join(ALL_MODES)}, got {mode!r}")
    scores: dict[str, dict[int, float]] = {}
    for method, reproductions in results.items():
        scores[method] = {}
        for outcome in reproductions.outcomes:
            if outcome.scores is None:
                continue
            if mode not in outcome.scores:
                needs = "evaluation.rerank" if mode.endswith(RERANKED_SUFFIX) else "evaluation.cross_domain: true"
                raise UserInputError(f"mode {mode!r} was not scored (it needs {needs})")
            if metric not in outcome.scores[mode]:
                raise UserInputError(f"metric {metric!r} was not computed; computed: {', '.join(outcome.scores[mode])}")
            scores[method][outcome.seed] = outcome.scores[mode][metric]
    return common_seeds(scores)


def compare_reranking(
    results: Mapping[str, MethodReproductions], mode: str = "concatenated", metric: str = "map_at_r",
    margin: float = DEFAULT_EQUIVALENCE_MARGIN,
) -> list[PairedComparison]:
    """Each method re-ranked against itself raw on one mode and metric, paired by reproduction (the same
    fold models scored both ways), ``a = "METHOD re-ranked"``, ``b = "METHOD"``; the statistics of
    ``statistics.compare_pairs`` with Holm across the methods. Methods without the re-ranked mode are left out."""
    scores: dict[str, dict[int, float]] = {}
    pairs = []
    for method, reproductions in results.items():
        scored = [outcome.scores for outcome in reproductions.outcomes if outcome.scores]
        if not scored or reranked_mode(mode) not in scored[0]:
            continue
        seeds = [outcome.seed for outcome in reproductions.outcomes if outcome.scores]
        for name, which in ((f"{method} re-ranked", reranked_mode(mode)), (method, mode)):
            scores[name] = {seed: values[which][metric] for seed, values in zip(seeds, scored) if metric in values[which]}
        pairs.append((f"{method} re-ranked", method))
    return compare_pairs(scores, pairs, margin)


def write_results(results: Mapping[str, MethodReproductions], output_dir: Path,
                  repeats: Mapping[str, Sequence[MethodReproductions]] | None = None) -> tuple[Path, Path]:
    """Write ``results.csv`` (each method's first search) and ``runs.csv`` (every search: ``repeats``, as for
    ``run_rows``) atomically (an undefined interval, n = 1, is written ``nan``)."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = output_dir / layout.RESULTS_CSV, output_dir / layout.RUNS_CSV
    for path, columns, rows in ((paths[0], RESULTS_COLUMNS, result_rows(results)), (paths[1], RUNS_COLUMNS, run_rows(results, repeats))):
        stream = io.StringIO()
        writer = csv.DictWriter(stream, fieldnames=list(columns), lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({key: _cell(value) for key, value in row.items()})
        files.atomic_write_text(path, stream.getvalue())
    return paths


def read_runs(output_dir: str | Path, role: str | None = None) -> ScoreTable:
    """Every score of a stored benchmark's ``runs.csv`` (baselines included), in the file's order:
    ``(mode, metric) -> method -> reproduction -> value``."""
    path = Path(output_dir) / layout.RUNS_CSV
    if not path.is_file():
        named = output_dir if role is None else f"{role} {output_dir}"
        raise UserInputError(f"{named} holds no {layout.RUNS_CSV} (a finished benchmark directory)")
    return read_score_table(path)


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)
    return value
