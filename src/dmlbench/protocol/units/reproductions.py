"""Reproductions with the best hyper-parameters, scored once on the test classes (Musgrave et al. 2020 §3.3).

Seed 001 §3.3: "For the best hyperparameters, the highest-accuracy checkpoint for each training set
partition is loaded, and its embeddings for the test set are computed and L2 normalized. Then we
compute accuracy using two methods: Concatenated [...] Separated [...]. We do 10 training runs using
the best hyperparameters, and report the average across these runs, as well as confidence intervals."

Here reproduction ``r`` of every method uses seed ``first_seed + r`` (so reproductions pair across
methods by seed, ``analysis.statistics.compare_methods``) and trains one run per fold of the same
class-disjoint layout as the search. Once all its folds are trained, the fold models' best checkpoints
embed the standard test split and ``evaluation.evaluate_many`` scores them ``concatenated`` and
``separated``; the scores are stored in ``METHOD/reproduction_RR/test_metrics.json`` and read from there
afterwards, so the test classes are embedded once per reproduction. ``protocol.units.results`` makes the
tables; a reproduction whose training fails has no score and keeps its reason.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from torch import Tensor

from dmlbench import files, provenance
from dmlbench.analysis.class_bootstrap import class_sums
from dmlbench.analysis.endpoints import MODES, cross_domain_mode
from dmlbench.evaluation import embedding_space
from dmlbench.evaluation.per_query import PER_QUERY_METRICS
from dmlbench.protocol import layout
from dmlbench.protocol.design.plan import Context, MethodPlan, ReproductionSettings
from dmlbench.protocol.queue import attempts, work
from dmlbench.protocol.units.results import COMPLETED_CLASS_SUMS, MethodReproductions, read_reproductions, stored_class_sums
from dmlbench.protocol.units.scoring import objective, record_test_access, score_modes
from dmlbench.protocol.units.unit import Attempt, Unit, claim_reproduction, open_unit_study, run_samples, validation_curves
from dmlbench.training import records, tracking, train_or_resume
from dmlbench.training.placement import Placement
from dmlbench.training.runs import Run, embed_run, embed_test_split, run_test_domains, test_query_mask


class MethodReproduction(Unit):
    """One method's reproductions as units of work (slot ``r``: reproduction ``r``, seed
    ``first_seed + r``, all folds, then its test scores), shared by any number of workers."""

    def __init__(self, plan: MethodPlan, params: Mapping[str, Any], settings: ReproductionSettings,
                 context: Context) -> None:
        self.plan, self.params, self.settings, self.context = plan, dict(params), settings, context
        self.done = False
        self.study = open_unit_study(context.worker, layout.reproduction_study(plan.name), {
            "method": plan.name, "params": self.params, "reproductions": settings.reproductions,
            "first_seed": settings.first_seed, "fold_layout_hash": context.layout.hash,
            "config_hash": context.config_hash,
        })

    @property
    def method(self) -> str:
        return self.plan.name

    def claim(self) -> work.Claim | str:
        return claim_reproduction(self.study, self.context.worker, self.settings)

    def attempt(self, claimed: work.Claim) -> Attempt:
        reproduction, output_dir = claimed.slot, self.context.output_dir
        seed = self.settings.first_seed + reproduction
        directory = layout.reproduction_dir(output_dir, self.method, reproduction)
        folds = self.context.layout.folds
        run_dirs = [layout.fold_dir(directory, fold.index) for fold in folds]

        def body(attributes: dict[str, Any]) -> float:
            attributes.update(seed=seed, params=self.params,
                              run_dirs=[str(run_dir.relative_to(output_dir)) for run_dir in run_dirs])
            curves = []
            for fold, run_dir in zip(folds, run_dirs):
                record = {"method": self.method, "stage": layout.REPRODUCTION_STAGE, "reproduction": reproduction,
                          "fold": fold.index, "config_hash": self.context.config_hash}
                self.context.report({**record, "run_dir": str(run_dir)})
                train_or_resume(self.plan.run_config(self.params, fold, seed), run_dir, progress=self.context.progress,
                                record={**record, "fold_layout_hash": self.context.layout.hash,
                                        "params": dict(self.params), "test_classes": list(self.context.layout.test_classes)},
                                placement=self.context.placement, tracker_failures=self.context.tracker_failures)
                curves.append(validation_curves(run_dir))
            attributes["curves"] = curves
            runs = [Run.open(run_dir, self.context.placement) for run_dir in run_dirs]  # each opened once, for both uses
            attributes["embedding_space"] = [training_space(run) for run in runs]
            scores, per_class = _test_scores(output_dir, directory, runs, seed, self.plan.config.evaluation.metrics)
            for run_dir in run_dirs:
                tracking.log_test_scores(run_dir, self.plan.config.tracking, scores, self.context.tracker_failures)
            attributes["scores"] = scores
            if per_class is not None:  # for the report's bootstrap over test classes (``analysis.class_bootstrap``)
                attributes["class_scores"] = per_class
            return objective(scores)

        return Attempt(body, lambda: sum(run_samples(run_dir) for run_dir in run_dirs))

    def announce(self, claimed: work.Claim, outcome: str | None, value: float | None) -> None:
        if outcome is not None and outcome.startswith("failed"):
            work.announce_failure(f"{self.method} reproduction {claimed.slot}", outcome)
        elif outcome is not None and self.context.progress:
            print(f"== {self.method} reproduction {claimed.slot}: {outcome}", flush=True)

    def result(self) -> MethodReproductions:
        return read_reproductions(self.study, self.method, self.params, self.context.layout.hash, self.context.output_dir)


def training_space(run: Run) -> dict[str, float]:
    """rho and the pi ratios of a fold model's best checkpoint on its own training classes (Roth et
    al. 2020 §5 compute them on the embedded training data, not the test data; ``drop=1``, no centring)."""
    embeddings, labels = embed_run(run, "train")
    space = embedding_space.analyze(embeddings, labels)
    return {key: float(space[key]) for key in ("rho", "pi_intra", "pi_inter", "pi_ratio")}


def fold_test_embeddings(runs: Sequence[Run]) -> tuple[dict[str, Tensor], Tensor]:
    """The test split embedded by each fold model of one reproduction (``runs``, opened, in fold order),
    keyed by run directory name, and the labels the folds share (seed 001 §3.3 combines these models)."""
    embeddings, labels = {}, None
    for run in runs:
        fold_embeddings, fold_labels = embed_test_split(run)
        if labels is not None and not bool((fold_labels == labels).all()):
            raise RuntimeError(f"{run.run_dir}: test labels differ between the folds of one reproduction")
        embeddings[run.run_dir.name], labels = fold_embeddings, fold_labels
    if labels is None:
        raise ValueError("fold_test_embeddings needs at least one fold run")
    return embeddings, labels


def complete_class_sums(output_dir: Path, reproductions: Mapping[str, MethodReproduction], placement: Placement) -> int:
    """Per-class test sums for the finished reproductions scored by a version of dmlbench that stored
    none, or none for the cross-domain modes it scored: computed from the fold models' best checkpoints
    as ``_test_scores`` computes them and stored in the storage (an attribute of the method's
    reproduction study, ``results.COMPLETED_CLASS_SUMS`` + slot; the finished trial cannot take them),
    where the report reads them; so a benchmark that finished before can resample its test classes.
    Reproductions whose checkpoints are not on this machine are left (another worker's machine).
    Returns how many were completed; each opening of the test data goes to ``test_access.jsonl`` first."""
    pending = [(unit, trial) for unit in reproductions.values() for trial in _lacking_class_sums(unit.study)
               if all((Path(output_dir) / run_dir).is_dir() for run_dir in trial.user_attrs["run_dirs"])]
    if pending:
        print(f"dmlbench: {len(pending)} reproduction(s) were scored by a version that stored no per-class test "
              "sums (or none cross-domain): computing them from their checkpoints", file=sys.stderr, flush=True)
    for unit, trial in pending:
        runs = [Run.open(Path(output_dir) / run_dir, placement) for run_dir in trial.user_attrs["run_dirs"]]
        embeddings, labels = _embedded_test_split(output_dir, runs, purpose="per-class sums")
        per_class = class_sums(embeddings, labels, unit.plan.config.evaluation.metrics, test_query_mask(runs[0]),
                               run_test_domains(runs[0]))
        unit.study.set_user_attr(f"{COMPLETED_CLASS_SUMS}{attempts.slot_of(trial)}", per_class)
    return len(pending)


def _lacking_class_sums(study: optuna.Study) -> list[FrozenTrial]:
    """The finished reproductions of ``study`` without per-class sums where ``class_sums`` gives some:
    none at all though a metric is a mean over queries, or none cross-domain though it scored those."""
    completed = study.user_attrs
    lacking = []
    for trial in attempts.counted(study):
        scores = trial.user_attrs.get("scores", {}) if trial.state.name == "COMPLETE" else {}
        if not any(name in PER_QUERY_METRICS for values in scores.values() for name in values):
            continue
        record = stored_class_sums(completed, trial)
        crossed = any(cross_domain_mode(mode) in scores for mode in MODES)
        if record is None or (crossed and "queries_by_mode" not in record):
            lacking.append(trial)
    return lacking


def _embedded_test_split(output_dir: Path, runs: list[Run], **note: str) -> tuple[dict[str, Tensor], Tensor]:
    """``fold_test_embeddings(runs)`` of one reproduction, its opening of the test data appended to
    ``test_access.jsonl`` first (with ``note``'s fields, e.g. why it was opened again)."""
    directory = runs[0].run_dir.parent
    record_test_access(output_dir, {
        "stage": layout.REPRODUCTION_STAGE, "method": directory.parent.name, "reproduction": directory.name,
        "model": "best_checkpoint", **note,
        "runs": [str(run.run_dir.resolve().relative_to(Path(output_dir).resolve())) for run in runs],
    })
    return fold_test_embeddings(runs)


def _test_scores(
    output_dir: Path, directory: Path, runs: list[Run], seed: int, metrics: list[str]
) -> tuple[dict[str, dict[str, float]], dict[str, Any] | None]:
    """Concatenated and separated test metrics of the fold models (``runs``, opened) and their per-class
    sums (``class_bootstrap.class_sums``; ``None`` for scores stored before those were), computed once
    and stored; every opening of the test data is appended to ``test_access.jsonl`` first."""
    stored_path = directory / records.TEST_METRICS_FILE
    key = {"seed": seed, "run_dirs": [run.run_dir.name for run in runs], "metrics": list(metrics)}
    domains = run_test_domains(runs[0])
    if domains is not None:  # only then, so that stored scores of other benchmarks keep their key
        key["cross_domain"] = True
    rerank = runs[0].config.evaluation.rerank  # the best parameters' (searched or fixed)
    if rerank.kind != "none":  # likewise
        key["rerank"] = rerank.model_dump(mode="json")
    if stored_path.exists():
        stored = files.read_json(stored_path)
        if stored.get("key") == key:
            return stored["scores"], stored.get("class_scores")
    directory.mkdir(parents=True, exist_ok=True)
    embeddings, labels = _embedded_test_split(output_dir, runs)
    # queries against the gallery for a dataset with roles
    query_mask = test_query_mask(runs[0])
    scores = score_modes(embeddings, labels, metrics, seed, query_mask, domains, rerank.method(), runs[0].device)
    per_class = class_sums(embeddings, labels, metrics, query_mask, domains)
    files.write_json(stored_path, {"evaluated": provenance.now(), "key": key, "scores": scores,
                                   **({"class_scores": per_class} if per_class is not None else {})})
    return scores, per_class
