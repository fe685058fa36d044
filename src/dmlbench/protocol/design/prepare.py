"""A benchmark checked before anything is written: ``prepare`` takes the benchmark YAML, the
command-line overrides and the storage, checks everything a user can get wrong (the methods' configs
and search spaces, the shared budget, the folds against the development classes, the seeds, the
storage, an existing ``benchmark.json`` and the studies already stored) and builds each method's plan
once, as a ``Prepared`` that every later stage (``protocol.run.schedule``, ``protocol.run.record``) works from.
``auto_jobs`` chooses ``--jobs auto``'s number of workers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dmlbench import config as config_module
from dmlbench import plugins
from dmlbench.analysis.spec import AnalysisSpec
from dmlbench.data.base import ImageDataset
from dmlbench.errors import UserInputError
from dmlbench.models.trunks import pretrained_weights
from dmlbench.protocol import layout as output_layout
from dmlbench.protocol.design.benchmark import (
    LATER_ANALYSIS_DEFAULTS,
    LATER_PROTOCOL_DEFAULTS,
    BenchmarkSpec,
    apply_spec_overrides,
)
from dmlbench.protocol.design.benchmark_file import BenchmarkRecord, read_benchmark_if_any
from dmlbench.protocol.design.folds import FoldLayout, fold_layout
from dmlbench.protocol.design.method_checks import check_against_data, check_shared
from dmlbench.protocol.design.plan import MethodPlan, RepeatedSearch, ReproductionSettings, SearchSettings, search_repeats
from dmlbench.protocol.design.workers import AUTO_JOBS, auto_jobs, resolve_storage
from dmlbench.protocol.queue import storage as storage_module
from dmlbench.training import records
from dmlbench.training.setup import load_dataset


@dataclass
class Prepared:
    """A checked benchmark, ready to run: nothing has been written yet. The single source of what
    the units work from: each method's plan, the settings, the fold layout."""

    spec: BenchmarkSpec
    overrides: list[str]
    output_dir: Path
    search: SearchSettings
    reproduction: ReproductionSettings
    plans: dict[str, MethodPlan]
    layout: FoldLayout
    dataset_hash: str
    storage: str  # as given (it may hold a password): never stored or printed, see ``redacted``
    jobs: int = 1
    heartbeat: int = 30
    retry_seconds: int = storage_module.DEFAULT_RETRY_SECONDS
    plugins: list[dict[str, Any]] = field(default_factory=list)  # the benchmark's (``plugins.identity``)
    plugin_changes: list[str] = field(default_factory=list)  # accepted on purpose by this worker
    # The analysis enters the hash, as declared when the benchmark started (``None``: this spec's); a benchmark
    # started before it was fixed (no ``analysis_in_hash`` in its benchmark.json) keeps its old hash.
    declared_analysis: dict[str, Any] | None = None
    analysis_in_hash: bool = True
    analysis_change: dict[str, Any] | None = None  # accepted on purpose by this worker (--accept-analysis-change)
    # Where the images come from, for benchmark.json and the report's set-up (outside the config hash).
    data_source: dict[str, Any] = field(default_factory=dict)
    # The pretrained weight files the trunks start from (``trunks.pretrained_weights``; outside the config hash).
    weights: list[dict[str, Any]] = field(default_factory=list)
    # Every override as given (the benchmark's own and the runs'), for the commands a report prints.
    given_overrides: list[str] = field(default_factory=list)
    # The searches each method runs so far (a sequential study's rounds; ``None``: ``protocol.search_repeats``).
    search_limits: dict[str, int] | None = None

    @property
    def redacted(self) -> str:
        return storage_module.redact(self.storage)

    @property
    def configs(self) -> dict[str, config_module.Config]:
        """Every method's budgeted config (before any search assignment or fold)."""
        return {name: plan.config for name, plan in self.plans.items()}

    @property
    def config_hash(self) -> str:
        """Identifies the benchmark in a shared storage: two workers with different configs never mix."""
        text = json.dumps(self.description(), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def repeats(self) -> dict[str, RepeatedSearch]:
        """The repeated searches (``protocol.search_repeats``, within ``search_limits``), ``METHOD@searchK -> RepeatedSearch``."""
        return search_repeats(self.plans, self.spec.protocol, self.search, self.reproduction, self.layout, self.search_limits)

    def study_names(self) -> list[str]:
        searched = [*self.plans, *self.repeats]
        folds = [output_layout.fold_study(name) for name in searched] if self.search.fold_units else []
        return [*searched, *folds, *(output_layout.reproduction_study(name) for name in [*searched, *output_layout.BASELINES])]

    def description(self) -> dict[str, Any]:
        """What ``benchmark.json`` records; a resumed benchmark must describe itself identically.
        The ``analysis`` is the declared one; the ``tracking`` settings (a view of the runs, not
        part of them) are left out, and so are an unset ``startup_trials``, an empty ``plugins``
        list and, for a benchmark started before the analysis was fixed, the analysis, so that
        benchmarks started before those keys existed keep their description and config hash."""
        unset = {"startup_trials"} if self.spec.protocol.startup_trials is None else set()
        unset.add("budget")  # how long one command may spend on a sequential study, not what the study is
        unset |= {key for key, default in LATER_PROTOCOL_DEFAULTS.items() if getattr(self.spec.protocol, key) == default}
        if not self.spec.protocol.fresh_draws:  # one search, or searches on search 0's seeds and folds: as before the keys
            unset |= {"search_seeds", "resplit_per_search"}
        first = next(iter(self.plans.values())).config
        return {
            "spec": _without_tracking(self.spec.model_dump(
                mode="json", exclude={"analysis": True, "protocol": unset, **({} if self.spec.plugins else {"plugins": True})})),
            "overrides": [item for item in self.overrides if not item.startswith("tracking.")],
            "protocol": self.spec.protocol.model_dump(mode="json", exclude=unset),
            "methods": [method.name for method in self.spec.methods],
            "metrics": list(first.evaluation.metrics),
            "fold_layout": self.layout.as_dict(),
            "fold_layout_hash": self.layout.hash,
            "dataset": {"name": first.data.name, "content_hash": self.dataset_hash},
            # Only when there are plugins, so that benchmarks without any keep their config hash.
            **({"plugins": self.plugins} if self.plugins else {}),
            **({"analysis": hashed_analysis(self.declared_analysis or self.spec.analysis.model_dump(mode="json"))}
               if self.analysis_in_hash else {}),
        }


def hashed_analysis(analysis: dict[str, Any]) -> dict[str, Any]:
    """The analysis as the description holds it: keys added later left out at their defaults."""
    return {key: value for key, value in analysis.items() if key not in LATER_ANALYSIS_DEFAULTS or value != LATER_ANALYSIS_DEFAULTS[key]}


def data_source(dataset: ImageDataset, layout: FoldLayout) -> dict[str, Any]:
    """What ``benchmark.json`` records about the data beside its content hash: the images of the test
    classes, and where the dataset has them, its images per domain and the licences its reader states."""
    test = int(torch.isin(dataset.labels, torch.as_tensor(list(layout.test_classes), dtype=torch.int64)).sum())
    found = {"test_images": test, "images_per_domain": dataset.images_per_domain(), "licences": dataset.licences()}
    return {key: value for key, value in found.items() if value is not None}


def prepare(
    spec: BenchmarkSpec, output_dir: Path, overrides: list[str] | None = None, storage: str | None = None,
    *, jobs: int | str = 1, heartbeat: int = 30, retry_seconds: int = storage_module.DEFAULT_RETRY_SECONDS,
    accept_plugin_changes: bool = False, accept_analysis_change: bool = False,
) -> Prepared:
    """Check the whole benchmark; a ``UserInputError`` (one line) names the first problem. Writes nothing.

    ``jobs``: local worker processes (more than one needs a storage for concurrent writers), or
    ``auto`` (``auto_jobs``; one where the benchmark is already stored in SQLite);
    ``heartbeat``: seconds between a PostgreSQL worker's heartbeats (stale after three missed);
    ``retry_seconds``: how long a worker waits for a lost database server before it stops;
    ``accept_plugin_changes``: continue a benchmark whose plugin code changed (recorded in ``benchmark.json``);
    ``accept_analysis_change``: continue with another ``analysis`` than the declared one (recorded there too)."""
    given_overrides = list(overrides or [])
    spec, overrides = apply_spec_overrides(spec, given_overrides)
    output_dir = Path(output_dir)
    if jobs != AUTO_JOBS and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise UserInputError(f"jobs must be a positive integer or {AUTO_JOBS!r}, got {jobs!r}")
    if isinstance(heartbeat, bool) or not isinstance(heartbeat, int) or heartbeat < 1:
        raise UserInputError(f"heartbeat must be a positive number of seconds, got {heartbeat!r}")
    if isinstance(retry_seconds, bool) or not isinstance(retry_seconds, int) or retry_seconds < 0:
        raise UserInputError(f"retry_seconds must be a number of seconds >= 0, got {retry_seconds!r}")
    if output_dir.exists() and not output_dir.is_dir():
        raise UserInputError(f"output {output_dir} is a file, not a directory")
    if records.is_run_dir(output_dir):  # the mirror of ``train -o`` refusing a benchmark's directory
        raise UserInputError(f"output {output_dir} is a training run directory, not a benchmark's: "
                             "use a new output directory")
    plans = {method.name: MethodPlan.build(spec, method.name, overrides) for method in spec.methods}
    automatic = jobs == AUTO_JOBS
    if automatic:
        jobs = auto_jobs(spec, plans)
    url = resolve_storage(output_dir, storage, jobs)
    if automatic and not storage_module.storage_for(url).concurrent:
        jobs = 1  # SQLite (given, or one worker's default for a stored benchmark) takes one worker
    check_shared(spec, plans)
    first = next(iter(plans.values())).config  # every method's data is the same (check_shared)
    dataset = load_dataset(first)
    layout = fold_layout(dataset, k=spec.protocol.folds, mode=spec.protocol.fold_mode)
    check_against_data(plans, dataset, layout)
    storage_module.storage_for(url).check(default=storage is None, jobs=jobs)
    prepared = Prepared(spec, overrides, output_dir, SearchSettings.of(spec.protocol, url),
                        ReproductionSettings.of(spec.protocol, url), plans, layout, dataset.content_hash, url,
                        jobs, heartbeat, retry_seconds, plugin_identity(spec, plans), data_source=data_source(dataset, layout),
                        weights=used_weights(plans), given_overrides=given_overrides)
    record = read_benchmark_if_any(output_dir)
    if record is not None:
        _check_plugins(prepared, record.plugins, accept_plugin_changes)
        _check_weights(prepared, record.pretrained_weights)
        _check_analysis_change(prepared, record, accept_analysis_change)
        stored = record.stored()  # compared key by key with the description, as the file holds it
        found = [line for key, value in prepared.description().items() for line in _differences(stored.get(key), value, key)]
        # The description repeats some values (``protocol`` is also in ``spec``): each difference is named once.
        differences = [line for line in found if not any(other.endswith(f".{line}") for other in found)]
        if differences:
            shown = ", ".join(differences[:SHOWN_DIFFERENCES])
            more = f" and {len(differences) - SHOWN_DIFFERENCES} more" if len(differences) > SHOWN_DIFFERENCES else ""
            raise UserInputError(f"{output_dir} holds a benchmark with other settings ({shown}{more}): "
                                 "re-run the command that started it, or use a new output directory")
    _check_studies(prepared)
    return prepared


SHOWN_DIFFERENCES = 3  # in the refusal to continue another benchmark; the rest are counted


def _differences(stored: Any, current: Any, key: str) -> list[str]:
    """``key.sub.key: stored -> current`` for every value that differs between two descriptions;
    list items are named by their ``name`` (a method) where both have the same one, else by index."""
    if isinstance(stored, dict) and isinstance(current, dict):
        return [line for sub in [*stored, *(name for name in current if name not in stored)]
                for line in _differences(stored.get(sub, _UNSET), current.get(sub, _UNSET), f"{key}.{sub}")]
    if isinstance(stored, list) and isinstance(current, list) and len(stored) == len(current) and stored != current:
        lines = []
        for index, (old, new) in enumerate(zip(stored, current)):
            same_name = isinstance(old, dict) and isinstance(new, dict) and old.get("name", _UNSET) == new.get("name")
            lines += _differences(old, new, f"{key}[{old['name'] if same_name else index}]")
        return lines
    return [] if stored == current else [f"{key}: {_shown(stored)} -> {_shown(current)}"]


_UNSET = object()


def _shown(value: Any) -> str:
    """A described value in a one-line message: JSON, cut to 40 characters."""
    if value is _UNSET:
        return "unset"
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _without_tracking(spec: dict[str, Any]) -> dict[str, Any]:
    base = {key: value for key, value in spec["base"].items() if key != "tracking"}
    methods = [{**method, "overrides": {key: value for key, value in method["overrides"].items()
                                        if not key.startswith("tracking")}} for method in spec["methods"]]
    return {**spec, "base": base, "methods": methods}


def plugin_identity(spec: BenchmarkSpec, plans: Mapping[str, MethodPlan]) -> list[dict[str, Any]]:
    """The plugins this benchmark uses (its config's, the command line's, the installed ones), as its hash covers them."""
    return plugins.identity(plugins.used([*spec.plugins, *(name for plan in plans.values() for name in plan.config.plugins)]))


def _check_plugins(prepared: Prepared, recorded: list[dict[str, Any]], accept: bool) -> None:
    """Plugin code must be what the benchmark started with: its results would mix two methods.
    Accepted on purpose, the benchmark keeps its recorded identity and ``record.write_benchmark_file`` records the change."""
    changes = plugins.changed(recorded, prepared.plugins)
    if not changes:
        return
    if not accept:
        raise UserInputError(f"{prepared.output_dir}: {changes[0]}; restore it, or continue with the new code on purpose "
                             f"with `accept_plugin_changes` (recorded in {output_layout.BENCHMARK_FILE})")
    prepared.plugins, prepared.plugin_changes = list(recorded), changes


def used_weights(plans: Mapping[str, MethodPlan]) -> list[dict[str, Any]]:
    """The distinct pretrained weight files of the methods' trunks (each fetched when absent), in method order."""
    found: list[dict[str, Any]] = []
    for plan in plans.values():
        weights = pretrained_weights(plan.config.model.trunk, plan.config.model.pretrained)
        if weights is not None and weights not in found:
            found.append(weights)
    return found


def _check_weights(prepared: Prepared, recorded: list[dict[str, Any]] | None) -> None:
    """The runs of one benchmark start from the same weights: other ones would mix two starting points."""
    if recorded is None or recorded == prepared.weights:
        return

    def shown(weights: list[dict[str, Any]]) -> str:
        return ", ".join(f"{entry['file']} (sha256 {entry['sha256'][:12]})" for entry in weights) or "random weights"
    raise UserInputError(f"{prepared.output_dir}: its runs started from {shown(recorded)}, this one from "
                         f"{shown(prepared.weights)}; restore those weights or use a new output directory")


def _check_analysis_change(prepared: Prepared, record: BenchmarkRecord, accept: bool) -> None:
    """The analysis must be the one declared before the runs (or the last change accepted on purpose);
    accepted, the benchmark keeps its declared analysis and hash and ``record.write_benchmark_file`` records the change."""
    if not record.analysis_in_hash:
        prepared.analysis_in_hash = False  # started before the analysis was fixed: report-only, as it was then
        return
    prepared.declared_analysis = record.declared_analysis()
    # A key added to the analysis after the benchmark started reads as its default (``StoredAnalysis``).
    current = {**AnalysisSpec().model_dump(mode="json"), **record.analysis_in_force()}
    wanted = prepared.spec.analysis.model_dump(mode="json")
    if current == wanted:
        return
    changed = sorted(key for key in {*current, *wanted} if current.get(key) != wanted.get(key))
    if not accept:
        raise UserInputError(f"{prepared.output_dir}: the analysis was fixed before the runs and this config changes "
                             f"analysis.{', analysis.'.join(changed)}; restore it, or change it on purpose with "
                             f"`accept_analysis_change` (recorded in {output_layout.BENCHMARK_FILE} and the report)")
    prepared.analysis_change = {"changed": changed, "analysis": wanted}


def _check_studies(prepared: Prepared) -> None:
    """Refuse a storage whose studies of the same names belong to another benchmark config."""
    import optuna

    names = set(storage_module.study_names(prepared.storage)) & set(prepared.study_names())
    if not names:
        return
    storage = storage_module.open_storage(prepared.storage)
    for name in sorted(names):
        stored = optuna.load_study(study_name=name, storage=storage).user_attrs.get("config_hash")
        if stored is not None and stored != prepared.config_hash:
            raise UserInputError(
                f"storage {prepared.redacted}: study {name!r} belongs to a benchmark with another config "
                f"(hash {stored}, this one {prepared.config_hash}); start every worker with the same config and "
                "overrides, or use another storage"
            )
