"""The whole protocol of seed 001 §3 over the methods of a benchmark YAML, resumable, in one call.

``prepare`` checks everything a user can get wrong before anything is written (the methods' configs
and search spaces, the shared budget, the folds against the development classes, the seeds, the
storage) and builds each method's plan once; ``run_benchmark`` then runs, per method, the Optuna
search (``protocol.search``: the same number of trials and epochs for every method), the
reproductions with the best parameters on new seeds (``protocol.reproductions``: test scored
concatenated and separated) and the untrained baseline row (``protocol.baseline``), all through one
scheduler (``Schedule``; ``run_search_stage`` stops it after the search), and hands the finished
benchmark to the caller's report writer. Every stage keeps what it finished, so running the same
command again after an interruption (Ctrl-C, SIGTERM or ``kill -9``) continues where it stopped.
The files it writes are listed in ``protocol.layout``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dmlbench import config as config_module
from dmlbench import files, ownership, plugins, provenance
from dmlbench.errors import RunInterrupted, StorageFailed, UserInputError
from dmlbench.protocol import layout as output_layout
from dmlbench.protocol import storage as storage_module
from dmlbench.protocol import work
from dmlbench.protocol.baseline import UntrainedBaseline
from dmlbench.protocol.benchmark import LATER_PROTOCOL_DEFAULTS, BenchmarkSpec, analysis_in_force, apply_spec_overrides
from dmlbench.protocol.feature_cache import FeatureCache
from dmlbench.protocol.folds import FoldLayout, fold_layout
from dmlbench.protocol.plan import Context, MethodPlan, ReproductionSettings, SearchSettings, search_repeats
from dmlbench.protocol.reproductions import MethodReproduction
from dmlbench.protocol.results import MethodReproductions
from dmlbench.protocol.search import MethodSearch, SearchResult, best_trial
from dmlbench.training import records, threads, tracking
from dmlbench.training.setup import load_dataset

# How often a worker whose remaining work is running elsewhere looks again (seconds).
POLL_SECONDS = 1.0

# A lost database server is waited for storage.DEFAULT_RETRY_SECONDS per outage (``--db-retry``),
# doubling the pause between tries up to MAX_RETRY_DELAY; an attempt that worked this long ends an outage.
MAX_RETRY_DELAY = 30.0
RETRY_RESET_SECONDS = 60.0


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
    def repeats(self) -> dict[str, tuple[MethodPlan, SearchSettings]]:
        """The repeated searches (``protocol.search_repeats``), ``METHOD@searchK -> (plan, settings)``."""
        return search_repeats(self.plans, self.spec.protocol, self.search)

    def study_names(self) -> list[str]:
        searched = [*self.plans, *self.repeats]
        return [*searched, *(output_layout.reproduction_study(name) for name in [*searched, output_layout.UNTRAINED])]

    def description(self) -> dict[str, Any]:
        """What ``benchmark.json`` records; a resumed benchmark must describe itself identically.
        The ``analysis`` is the declared one; the ``tracking`` settings (a view of the runs, not
        part of them) are left out, and so are an unset ``startup_trials``, an empty ``plugins``
        list and, for a benchmark started before the analysis was fixed, the analysis, so that
        benchmarks started before those keys existed keep their description and config hash."""
        unset = {"startup_trials"} if self.spec.protocol.startup_trials is None else set()
        unset |= {key for key, default in LATER_PROTOCOL_DEFAULTS.items() if getattr(self.spec.protocol, key) == default}
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
            **({"analysis": self.declared_analysis or self.spec.analysis.model_dump(mode="json")} if self.analysis_in_hash else {}),
        }


@dataclass
class BenchmarkOutcome:
    output_dir: Path
    results: dict[str, MethodReproductions]
    failed: dict[str, str] = field(default_factory=dict)


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
    spec, overrides = apply_spec_overrides(spec, list(overrides or []))
    output_dir = Path(output_dir)
    if jobs != AUTO_JOBS and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise UserInputError(f"--jobs must be a positive integer or auto, got {jobs!r}")
    if isinstance(heartbeat, bool) or not isinstance(heartbeat, int) or heartbeat < 1:
        raise UserInputError(f"--heartbeat must be a positive number of seconds, got {heartbeat!r}")
    if isinstance(retry_seconds, bool) or not isinstance(retry_seconds, int) or retry_seconds < 0:
        raise UserInputError(f"--db-retry must be a number of seconds >= 0, got {retry_seconds!r}")
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
    _check_shared(spec, plans)
    first = next(iter(plans.values())).config
    if spec.analysis.primary.metric not in first.evaluation.metrics:
        raise UserInputError(f"analysis.primary.metric {spec.analysis.primary.metric!r} is not computed; "
                             f"evaluation.metrics: {', '.join(first.evaluation.metrics)}")
    dataset = load_dataset(first)
    layout = fold_layout(dataset, k=spec.protocol.folds, mode=spec.protocol.fold_mode)
    _check_samplers(plans, dataset.labels, layout)
    storage_module.storage_for(url).check(default=storage is None, jobs=jobs)
    prepared = Prepared(spec, overrides, output_dir, SearchSettings.of(spec.protocol, url),
                        ReproductionSettings.of(spec.protocol, url), plans, layout, dataset.content_hash, url,
                        jobs, heartbeat, retry_seconds, _plugin_identity(spec, plans))
    stored_path = output_dir / output_layout.BENCHMARK_FILE
    if stored_path.exists():
        stored = files.read_json(stored_path)
        _check_plugins(prepared, stored.get("plugins", []), accept_plugin_changes)
        _check_analysis_change(prepared, stored, accept_analysis_change)
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


def _plugin_identity(spec: BenchmarkSpec, plans: Mapping[str, MethodPlan]) -> list[dict[str, Any]]:
    """The plugins this benchmark uses (its config's, the command line's, the installed ones), as its hash covers them."""
    return plugins.identity(plugins.used([*spec.plugins, *(name for plan in plans.values() for name in plan.config.plugins)]))


def _check_plugins(prepared: Prepared, recorded: list[dict[str, Any]], accept: bool) -> None:
    """Plugin code must be what the benchmark started with: its results would mix two methods.
    Accepted on purpose, the benchmark keeps its recorded identity and ``_start`` records the change."""
    changes = plugins.changed(recorded, prepared.plugins)
    if not changes:
        return
    if not accept:
        raise UserInputError(f"{prepared.output_dir}: {changes[0]}; restore it, or continue with the new code on purpose "
                             f"with --accept-plugin-changes (recorded in {output_layout.BENCHMARK_FILE})")
    prepared.plugins, prepared.plugin_changes = list(recorded), changes


def _check_analysis_change(prepared: Prepared, stored: Mapping[str, Any], accept: bool) -> None:
    """The analysis must be the one declared before the runs (or the last change accepted on purpose);
    accepted, the benchmark keeps its declared analysis and hash and ``_start`` records the change."""
    if not stored.get("analysis_in_hash"):
        prepared.analysis_in_hash = False  # started before the analysis was fixed: report-only, as it was then
        return
    prepared.declared_analysis = dict(stored.get("analysis", {}))
    current, wanted = analysis_in_force(stored), prepared.spec.analysis.model_dump(mode="json")
    if current == wanted:
        return
    changed = sorted(key for key in {*current, *wanted} if current.get(key) != wanted.get(key))
    if not accept:
        raise UserInputError(f"{prepared.output_dir}: the analysis was fixed before the runs and this config changes "
                             f"analysis.{', analysis.'.join(changed)}; restore it, or change it on purpose with "
                             f"--accept-analysis-change (recorded in {output_layout.BENCHMARK_FILE} and the report)")
    prepared.analysis_change = {"changed": changed, "analysis": wanted}


def _check_shared(spec: BenchmarkSpec, plans: Mapping[str, MethodPlan]) -> None:
    """What the protocol shares between methods: epochs, data, metrics, seeds (and with a frozen
    trunk, the trunk itself)."""
    epochs = {name: plan.config.training.epochs for name, plan in plans.items()}
    if len(set(epochs.values())) > 1:
        raise UserInputError(f"methods train for different numbers of epochs {epochs}: set protocol.epochs")
    (first_name, first), *others = plans.items()
    for name, plan in others:
        if plan.config.data != first.config.data:
            raise UserInputError(f"method {name!r} uses other data than {first_name!r}: every method must use the same data")
        if plan.config.evaluation.metrics != first.config.evaluation.metrics:
            raise UserInputError(f"method {name!r} computes other metrics than {first_name!r}")
        if plan.config.evaluation.rerank.kind != first.config.evaluation.rerank.kind:
            raise UserInputError(f"method {name!r} re-ranks with another evaluation.rerank.kind than {first_name!r}: "
                                 "the re-ranked modes compare methods re-ranked alike (search only its params)")
    for name, plan in plans.items():
        if {"evaluation.rerank", "evaluation.rerank.kind"} & set(plan.space.keys()):
            raise UserInputError(f"method {name!r}: evaluation.rerank.kind is fixed for the benchmark; search "
                                 "evaluation.rerank.params.* instead")
    protocol = spec.protocol
    search_seeds = {plan.config.seed for plan in plans.values()}
    reproduction_seeds = set(range(protocol.first_seed, protocol.first_seed + protocol.reproductions))
    if search_seeds & reproduction_seeds:
        raise UserInputError(
            f"reproduction seeds {protocol.first_seed}..{protocol.first_seed + protocol.reproductions - 1} include "
            f"the search's training seed {min(search_seeds & reproduction_seeds)}: set protocol.first_seed"
        )
    if protocol.frozen_trunk:
        _check_one_trunk(plans)


def _check_one_trunk(plans: Mapping[str, MethodPlan]) -> None:
    """With a frozen trunk every method trains its head on the same trunk: their trunk settings must agree."""
    def trunk_of(plan: MethodPlan) -> tuple[Any, ...]:
        model = plan.config.model
        return model.trunk, model.options, model.pretrained, model.pooling, model.freeze_bn
    (first, first_plan), *others = plans.items()
    for name, plan in plans.items():
        if plan.config.model.ensemble != 1:
            raise UserInputError(f"method {name!r}: protocol.frozen_trunk needs a single trunk (model.ensemble=1)")
    for name, plan in others:
        if trunk_of(plan) != trunk_of(first_plan):
            raise UserInputError(f"protocol.frozen_trunk: method {name!r} uses another trunk than {first!r} "
                                 "(model.trunk, options, pretrained, pooling and freeze_bn must agree)")


def _check_samplers(plans: Mapping[str, MethodPlan], labels: Any, layout: FoldLayout) -> None:
    """Every method's batch sampler can fill its batches from a fold's training classes (the check
    ``train`` makes), before anything trains: a batch size the sampler cannot fill is exit 2 now,
    not a failed trial in storage an hour later."""
    import numpy as np

    from dmlbench.training.setup import build_sampler

    fold = layout.folds[0]
    train_labels = np.asarray(labels)[np.isin(np.asarray(labels), list(fold.train_classes))]
    for name, plan in plans.items():
        try:
            build_sampler(plan.config, train_labels)
        except UserInputError as error:
            raise UserInputError(f"method {name!r}: {error}") from None


AUTO_JOBS = "auto"


def auto_jobs(spec: BenchmarkSpec, plans: dict[str, MethodPlan]) -> int:
    """``--jobs auto``: as many worker processes as this process's cores hold at the methods' torch
    thread count (one each when ``training.num_threads`` is ``auto`` and ``OMP_NUM_THREADS`` unset),
    at most the units of work the search can run at once (methods x folds x ``parallel_trials``).

    One process per core because on the built-in benchmark two one-thread workers took 200 s where
    one two-thread worker took 269 s (``python benchmarks/jobs.py src/dmlbench/configs/benchmark.yaml``
    on a quiet 2-core machine): the small CNN's steps do not keep two threads busy."""
    fixed = [int(plan.config.training.num_threads) for plan in plans.values() if plan.config.training.num_threads != threads.AUTO]
    per_process = max(fixed, default=threads.pinned_threads() or 1)
    concurrent_units = len(plans) * spec.protocol.folds * spec.protocol.parallel_trials
    return max(1, min(threads.available_cores() // per_process, concurrent_units))


def resolve_storage(output_dir: Path, storage: str | None, jobs: int) -> str:
    """``--storage``, else the storage an existing benchmark in ``output_dir`` records, else the
    default for ``jobs`` workers (``storage.default_url``)."""
    if storage:
        storage_module.storage_for(storage)  # a supported kind, or one line
        return storage
    stored = Path(output_dir) / output_layout.BENCHMARK_FILE
    if stored.is_file():
        recorded = files.read_json(stored).get("storage")
        if recorded:
            return str(recorded)
    return storage_module.default_url(output_dir, jobs)


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


class Progress:
    """Plain progress lines: method, stage, trial or reproduction, fold, elapsed and estimated time left."""

    def __init__(self, total_runs: int, done_runs: int, enabled: bool) -> None:
        self.total, self.done_before, self.enabled = total_runs, done_runs, enabled
        self.started = 0
        self.start = time.monotonic()

    def __call__(self, event: Mapping[str, Any]) -> None:
        self.started += 1
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        finished_here = self.started - 1
        remaining = max(self.total - self.done_before - finished_here, 0)
        left = _clock(elapsed / finished_here * remaining) if finished_here else "?"
        step = f"search trial {event['trial']}" if "trial" in event else f"reproduction {event['reproduction']}"
        print(
            f"== {event['method']}: {step} fold {event['fold']} "
            f"(run {min(self.done_before + self.started, self.total)}/{self.total}, elapsed {_clock(elapsed)}, left ~{left})",
            file=sys.stderr, flush=True,
        )


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _completed_runs(output_dir: Path) -> int:
    count = 0
    for path in output_dir.glob("*/*/fold_*/" + records.RUN_FILE):
        try:
            count += files.read_json(path).get("status") == "completed"
        except (OSError, ValueError):
            continue
    return count


def _start(prepared: Prepared) -> None:
    prepared.output_dir.mkdir(parents=True, exist_ok=True)
    path = prepared.output_dir / output_layout.BENCHMARK_FILE
    analysis = prepared.spec.analysis.model_dump(mode="json")
    if not path.exists():
        files.write_json(path, {**prepared.description(), "analysis": analysis, "analysis_in_hash": True,
                                  "storage": prepared.redacted, "config_hash": prepared.config_hash,
                                  "git_commit": provenance.git_commit(), "created": provenance.now(),
                                  # the machine of the worker that started it (each run.json has its own)
                                  "environment": provenance.environment()})
        return
    stored = files.read_json(path)
    if not prepared.analysis_in_hash and stored.get("analysis") != analysis:  # started before the analysis was fixed
        stored = {**stored, "analysis": analysis}
        files.write_json(path, stored)
    if prepared.analysis_change and analysis_in_force(stored) != prepared.analysis_change["analysis"]:
        accepted = {"time": provenance.now(), **prepared.analysis_change}
        stored = {**stored, "analysis_changes_accepted": [*stored.get("analysis_changes_accepted", []), accepted]}
        files.write_json(path, stored)
    if prepared.plugin_changes:
        accepted = {"time": provenance.now(), "changes": prepared.plugin_changes,
                    "plugins": _plugin_identity(prepared.spec, prepared.plans)}
        if accepted["plugins"] not in [entry["plugins"] for entry in stored.get("plugin_changes_accepted", [])]:
            files.write_json(path, {**stored, "plugin_changes_accepted": [*stored.get("plugin_changes_accepted", []), accepted]})


class Unit(Protocol):
    """A stream of units of work (a method's search, its reproductions, the baseline): ``step()``
    runs one unit this worker took, or says ``work.WAIT`` or ``work.DONE``; ``done`` once it said DONE."""

    done: bool

    def step(self) -> str: ...


def drive(units: Callable[[], Iterable[Unit]]) -> None:
    """The one scheduling loop: step the first unit that has work, from the start of ``units()``
    again after each, until every unit is ``work.DONE``; while the only work left runs in other
    workers, look again every ``POLL_SECONDS`` (a stale one may come back to this worker)."""
    while True:
        states = []
        for unit in units():
            state = unit.step()
            states.append(state)
            if state not in (work.WAIT, work.DONE):
                break
        else:
            if all(state == work.DONE for state in states):
                return
            time.sleep(POLL_SECONDS)


class Schedule:
    """The units of one worker in the order they are taken: every method's search; a method's
    reproductions once its search is done (with its best trial's parameters); the untrained
    baseline once every search is done (the first method with reproductions is its reference)."""

    def __init__(self, prepared: Prepared, context: Context, *, search_only: bool = False) -> None:
        self.prepared, self.context, self.search_only = prepared, context, search_only
        plans = prepared.plans
        # The search's trunks, one per fold, shared by every method: the first method's config.
        features = (FeatureCache(next(iter(plans.values())).budgeted, prepared.output_dir, prepared.dataset_hash,
                                 context.progress) if prepared.search.frozen_trunk else None)
        self.searches = {name: MethodSearch(plan, prepared.search, context, features) for name, plan in plans.items()}
        # The repeated searches after every method's first, each with its own seed and reproductions.
        self.searches.update({name: MethodSearch(plan, settings, context, features)
                              for name, (plan, settings) in prepared.repeats.items()})
        self.reproductions: dict[str, MethodReproduction] = {}
        self.baseline: UntrainedBaseline | None = None

    def units(self) -> Iterator[Unit]:
        for name, search in self.searches.items():
            yield search
            if (not self.search_only and search.done and name not in self.reproductions
                    and (best := best_trial(search.study)) is not None):
                self.reproductions[name] = MethodReproduction(search.plan, dict(best.params),
                                                              self.prepared.reproduction, self.context)
        if self.search_only:
            return
        if self.baseline is None and self.reproductions and all(search.done for search in self.searches.values()):
            reference = next(name for name in self.prepared.plans if name in self.reproductions)
            self.baseline = UntrainedBaseline(self.prepared.plans[reference], self.reproductions[reference].params,
                                              self.prepared.reproduction, self.context)
        yield from self.reproductions.values()
        if self.baseline is not None:
            yield self.baseline


@contextmanager
def owned_output(prepared: Prepared) -> Iterator[None]:
    """This worker's hold on the output directory while it writes there: alone with SQLite (one
    process at a time), shared with the other workers of a journal or PostgreSQL storage, never
    beside a SQLite owner; another process is refused with one line naming the owner."""
    shared = storage_module.storage_for(prepared.storage).concurrent
    with ownership.owned(prepared.output_dir, output_layout.LOCK_FILE, what="benchmark directory", shared=shared):
        yield


def run_search_stage(prepared: Prepared, *, progress: bool = True) -> dict[str, SearchResult]:
    """The search stage alone (``dmlbench search``): every method's study, then ``search.json``."""
    with owned_output(prepared):
        return _with_retries(prepared, lambda: _search_only(prepared, progress))


def _search_only(prepared: Prepared, progress: bool) -> dict[str, SearchResult]:
    _start(prepared)
    protocol = prepared.spec.protocol
    searches = len(prepared.plans) + len(prepared.repeats)
    context = context_of(prepared, Progress(searches * protocol.trials * protocol.folds, 0, progress), progress)
    schedule = Schedule(prepared, context, search_only=True)
    try:
        drive(schedule.units)
    except (RunInterrupted, KeyboardInterrupt):
        raise RunInterrupted(f"search {prepared.output_dir} stopped; re-run the same command to continue") from None
    return _write_search_summary(prepared, schedule)


def run_benchmark(
    prepared: Prepared, *, progress: bool = True, report: Callable[[Path, str], Any] | None = None,
) -> BenchmarkOutcome | None:
    """Work on the benchmark until every unit is done (search trials, reproductions, the untrained
    baseline), with any number of other workers on the same storage; then the first worker to find
    everything done writes the summaries and calls ``report(output_dir, storage)`` (the caller's
    report writer, ``dmlbench.report.write_report``) and gets the outcome. ``None``: another worker
    wrote the report. Resumable; see the module docstring.

    A database server that goes away (a restart, a fail-over) is waited for: the worker retries
    with a doubling back-off for up to ``prepared.retry_seconds`` per outage, then stops with a
    ``StorageFailed`` (the same command continues later). A unit whose result could not be stored is
    taken up again through the heartbeat, its finished fold runs kept. The worker holds the output
    directory meanwhile (``owned_output``)."""
    with owned_output(prepared):
        return _with_retries(prepared, lambda: _work_on_benchmark(prepared, progress, report))


def _with_retries(prepared: Prepared, attempt: Callable[[], Any]) -> Any:
    """``attempt()``, again after a lost database connection (see ``run_benchmark``)."""
    delay, outage_started = 1.0, None
    while True:
        attempt_started = time.monotonic()
        try:
            return attempt()
        except Exception as error:
            lost = storage_module.storage_for(prepared.storage).connection_lost(error)
            if lost is None:
                raise
            now = time.monotonic()
            if outage_started is None or now - attempt_started > RETRY_RESET_SECONDS:
                delay, outage_started = 1.0, now  # a new outage: the last one was followed by work
            if now - outage_started >= prepared.retry_seconds:
                raise StorageFailed(
                    f"storage {prepared.redacted} unreachable for {prepared.retry_seconds} s ({lost}); "
                    "the work done is stored: run the same command again to continue") from error
            print(f"dmlbench: warning: storage {prepared.redacted} unreachable ({lost}); retrying in {delay:.0f} s",
                  file=sys.stderr, flush=True)
            time.sleep(delay)
            delay = min(2 * delay, MAX_RETRY_DELAY)


def context_of(prepared: Prepared, reporter: Progress | None = None, progress: bool = False) -> Context:
    """What this worker's units share (a new ``work.Worker`` on the benchmark's storage)."""
    return Context(prepared.output_dir, prepared.layout, work.Worker(prepared.storage, heartbeat=prepared.heartbeat),
                   prepared.config_hash, progress, reporter)


def _work_on_benchmark(prepared: Prepared, progress: bool,
                       report: Callable[[Path, str], Any] | None) -> BenchmarkOutcome | None:
    _start(prepared)
    output_dir = prepared.output_dir
    protocol = prepared.spec.protocol
    total = (len(prepared.plans) + len(prepared.repeats)) * (protocol.trials + protocol.reproductions) * protocol.folds
    context = context_of(prepared, Progress(total, _completed_runs(output_dir), progress), progress)
    try:
        schedule = Schedule(prepared, context)
        drive(schedule.units)
        with context.worker.lock.held():
            marker = next(iter(schedule.searches.values())).study
            reported = marker.user_attrs.get("report")
            if reported is not None and (output_dir / output_layout.REPORT_FILE).exists():
                # Not a failure: this worker's share is done and a sibling (a --jobs process or another
                # machine on the same storage) took the report; say so in those words.
                print(f"dmlbench: done: every trial and reproduction of this benchmark is finished, and worker "
                      f"{reported['worker']}, which shares it, wrote the report", file=sys.stderr, flush=True)
                return None
            outcome = _write_summaries(prepared, schedule)
            if report is not None:
                written = report(output_dir, prepared.storage)
                _track_report(prepared, written)
            marker.set_user_attr("report", {"worker": context.worker.id, "time": provenance.now()})
    except (RunInterrupted, KeyboardInterrupt):
        raise RunInterrupted(f"benchmark {output_dir} stopped; re-run the same command to continue") from None
    return outcome


def _track_report(prepared: Prepared, written: Any) -> None:
    """With MLflow tracking, the report files as artifacts of the benchmark's parent run: every file the
    report writer returned (``{name: path}``: report.md, report.html, the PNGs report.md links to, the
    tables) and ``benchmark.json``."""
    settings = next(iter(prepared.plans.values())).config.tracking
    if settings.backend != "mlflow":
        return
    reported = list(written.values()) if isinstance(written, Mapping) else []
    paths = [Path(path) for path in dict.fromkeys([*reported, prepared.output_dir / output_layout.BENCHMARK_FILE])
             if Path(path).is_file()]
    benchmark = files.read_json(prepared.output_dir / output_layout.BENCHMARK_FILE)
    tracking.MLflowTracker(settings).report(prepared.output_dir, paths, benchmark)


def _write_search_summary(prepared: Prepared, schedule: Schedule) -> dict[str, SearchResult]:
    """``search.json``: the settings and, per method, the best value and parameters, trial counts (the
    repeated searches, if any, under ``search_repeats``)."""
    searched = {name: search.result() for name, search in schedule.searches.items()}

    def summary(names: Iterable[str]) -> dict[str, Any]:
        return {name: {"best_value": r.best_value, "best_params": r.best_params, "completed": r.completed,
                       "failed": r.failed, "pruned": r.pruned, "fold_layout_hash": r.fold_layout_hash,
                       "storage": r.storage} for name, r in searched.items() if name in names}

    repeats = prepared.repeats
    files.write_json(prepared.output_dir / output_layout.SEARCH_FILE, {
        "settings": {**asdict(prepared.search), "storage": prepared.redacted}, "methods": summary(prepared.plans),
        **({"search_repeats": summary(repeats)} if repeats else {}),
    })
    return {name: result for name, result in searched.items() if name in prepared.plans}


def _write_summaries(prepared: Prepared, schedule: Schedule) -> BenchmarkOutcome:
    """``search.json``, ``reproductions.json`` and ``results.json``, all from storage."""
    output_dir = prepared.output_dir
    failed = {name: f"no search trial completed ({result.failed} failed)"
              for name, result in _write_search_summary(prepared, schedule).items() if result.best_params is None}
    # The reproductions of repeated searches are the report's (read from storage), not the leaderboard's.
    results: dict[str, MethodReproductions] = {name: unit.result() for name, unit in schedule.reproductions.items()
                                               if name in prepared.plans}
    for name, result in results.items():
        reasons = [f"reproduction {o.reproduction}: {o.reason}" for o in result.outcomes if o.scores is None]
        if reasons:
            failed[name] = "; ".join(reasons)
    if results:
        files.write_json(output_dir / output_layout.REPRODUCTIONS_FILE, {
            "settings": {**asdict(prepared.reproduction), "storage": prepared.redacted},
            "methods": {name: {"params": r.params, "fold_layout_hash": r.fold_layout_hash,
                               "outcomes": [asdict(o) for o in r.outcomes]} for name, r in results.items()},
        })
    if schedule.baseline is not None:
        results[output_layout.UNTRAINED] = schedule.baseline.result()
    files.write_json(output_dir / output_layout.RESULTS_FILE, {
        "methods": {name: {"params": result.params, "fold_layout_hash": result.fold_layout_hash,
                           "outcomes": [asdict(outcome) for outcome in result.outcomes]}
                    for name, result in results.items()},
        "failed": failed,
    })
    return BenchmarkOutcome(output_dir, results, failed)
