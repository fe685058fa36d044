"""The protocol of seed 001 §3 run over a prepared benchmark (``protocol.design.prepare``), resumable, by
any number of workers on one storage. ``Schedule`` yields one worker's units in the order they are
taken: per method, the Optuna search (``protocol.search``: the same number of trials and epochs for
every method), the reproductions with the best parameters on new seeds (``protocol.reproductions``:
test scored concatenated and separated) and the baseline rows (``protocol.baselines``);
``drive`` is the one scheduling loop. ``run_benchmark`` runs them all and hands the finished benchmark
to the caller's report writer; ``run_search_stage`` stops after the search. Every stage keeps what it
finished, so running the same command again after an interruption (Ctrl-C, SIGTERM or ``kill -9``)
continues where it stopped. The files it writes are listed in ``protocol.layout``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna

from dmlbench import files, ownership, provenance
from dmlbench.errors import RunInterrupted, StorageFailed
from dmlbench.protocol import layout as output_layout
from dmlbench.protocol.design.plan import Context
from dmlbench.protocol.design.prepare import Prepared
from dmlbench.protocol.queue import storage as storage_module
from dmlbench.protocol.queue import work
from dmlbench.protocol.run.record import (
    BenchmarkOutcome, ReportWriter, track_report, write_benchmark_file, write_search_summary, write_summaries)
from dmlbench.protocol.run.rounds import RoundBudget, RoundsOutcome, run_rounds, say
from dmlbench.protocol.run.stages import BaselineStage, ReproductionStage, SearchStage, Stage
from dmlbench.protocol.units.baseline import Baseline
from dmlbench.protocol.units.reproductions import MethodReproduction, complete_class_sums
from dmlbench.protocol.units.search import MethodSearch, SearchResult
from dmlbench.protocol.units.unit import Unit
from dmlbench.training import records
from dmlbench.training.placement import STANDALONE, Placement

# How often a worker whose remaining work is running elsewhere looks again (seconds).
POLL_SECONDS = 1.0

# A lost database server is waited for storage.DEFAULT_RETRY_SECONDS per outage (``--db-retry``),
# doubling the pause between tries up to MAX_RETRY_DELAY; an attempt that worked this long ends an outage.
MAX_RETRY_DELAY = 30.0
RETRY_RESET_SECONDS = 60.0


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
    """The units of one worker in the order they are taken: the stages of ``protocol.run.stages`` in
    order (every method's search; a method's reproductions once its search is done, with its best
    trial's parameters; the baselines once every search is done), each making its units once they
    are ready. ``search_only``: the search stage alone. A new stage is a ``stages.Stage`` added to
    ``stages`` here."""

    def __init__(self, prepared: Prepared, context: Context, *, search_only: bool = False) -> None:
        self.search = SearchStage(prepared, context)
        self.reproduction = ReproductionStage(prepared, context, self.search)
        self.baseline = BaselineStage(prepared, context, self.search, self.reproduction)
        self.stages: list[Stage] = [self.search] if search_only else [self.search, self.reproduction, self.baseline]

    @property
    def searches(self) -> dict[str, MethodSearch]:
        return self.search.searches

    @property
    def reproductions(self) -> dict[str, MethodReproduction]:
        return self.reproduction.reproductions

    @property
    def baselines(self) -> list[Baseline]:
        return self.baseline.baselines

    def units(self) -> Iterator[Unit]:
        for stage in self.stages:
            for unit in stage.units():
                yield unit
                # The unit just stepped may have finished what another waits for: made now, it is
                # taken in this pass where its place in the order comes.
                for each in self.stages:
                    each.make_ready()


@contextmanager
def owned_output(prepared: Prepared) -> Iterator[None]:
    """This worker's hold on the output directory while it writes there: alone with SQLite (one
    process at a time), shared with the other workers of a journal or PostgreSQL storage, never
    beside a SQLite owner; another process is refused with one line naming the owner."""
    shared = storage_module.storage_for(prepared.storage).concurrent
    with ownership.owned(prepared.output_dir, output_layout.LOCK_FILE, what="benchmark directory", shared=shared):
        yield


def run_search_stage(prepared: Prepared, *, progress: bool = True, placement: Placement = STANDALONE) -> dict[str, SearchResult]:
    """The search stage alone (``dmlbench search``): every method's study, then ``search.json``."""
    with owned_output(prepared):
        placement = placement.with_recorded_threads(write_benchmark_file(prepared, placement).threads_per_worker)
        return _with_retries(prepared, lambda: _search_only(prepared, progress, placement))


def _search_only(prepared: Prepared, progress: bool, placement: Placement) -> dict[str, SearchResult]:
    protocol = prepared.spec.protocol
    searches = len(prepared.plans) + len(prepared.repeats)
    context = context_of(prepared, Progress(searches * protocol.trials * protocol.folds, 0, progress), progress, placement)
    schedule = Schedule(prepared, context, search_only=True)
    try:
        drive(schedule.units)
    except (RunInterrupted, KeyboardInterrupt):
        raise RunInterrupted(f"search {prepared.output_dir} stopped; re-run the same command to continue") from None
    return write_search_summary(prepared, schedule.searches)


def run_benchmark(
    prepared: Prepared, *, progress: bool = True, report: ReportWriter | None = None, placement: Placement = STANDALONE,
    budget: RoundBudget = RoundBudget(),
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
    directory meanwhile (``owned_output``). ``placement``: this worker's device and threads; a run with
    ``training.num_threads: auto`` trains with the threads the benchmark started with
    (``benchmark.json``'s ``threads_per_worker``), whatever this worker's ``--jobs``: a thread count
    changes a run's last digits. A sequential study (``protocol.sequential``) runs in rounds within ``budget``
    (``rounds``)."""
    with owned_output(prepared):
        placement = placement.with_recorded_threads(write_benchmark_file(prepared, placement).threads_per_worker)
        return _with_retries(prepared, lambda: _work_on_benchmark(prepared, progress, report, placement, budget))


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


def retry_failed_units(prepared: Prepared) -> int:
    """``benchmark --retry-failed``: a new attempt of every failed unit in the benchmark's studies,
    enqueued before any worker starts (``work.retry_failed``); the report's marker is cleared so that
    the worker that finishes writes a new report. Returns the units retried."""
    worker = work.Worker(prepared.storage)
    studies = [optuna.load_study(study_name=name, storage=worker.storage)
               for name in storage_module.study_names(prepared.storage)]
    retried = sum(work.retry_failed(study, worker) for study in studies)
    for study in studies if retried else []:
        if study.user_attrs.get("report") is not None:
            study.set_user_attr("report", None)
    return retried


def context_of(prepared: Prepared, reporter: Progress | None = None, progress: bool = False,
               placement: Placement = STANDALONE) -> Context:
    """What this worker's units share (a new ``work.Worker`` on the benchmark's storage)."""
    return Context(prepared.output_dir, prepared.layout, work.Worker(prepared.storage, heartbeat=prepared.heartbeat),
                   prepared.config_hash, progress, reporter, placement)


def _driven(prepared: Prepared, context: Context) -> Schedule:
    """Every unit of ``prepared`` driven to its end; its schedule."""
    schedule = Schedule(prepared, context)
    drive(schedule.units)
    return schedule


def _work_on_benchmark(prepared: Prepared, progress: bool, report: ReportWriter | None,
                       placement: Placement, budget: RoundBudget) -> BenchmarkOutcome | None:
    output_dir = prepared.output_dir
    protocol = prepared.spec.protocol
    total = (len(prepared.plans) + len(prepared.repeats)) * (protocol.trials + protocol.reproductions) * protocol.folds
    context = context_of(prepared, Progress(total, _completed_runs(output_dir), progress), progress, placement)
    try:
        rounds: RoundsOutcome | None = None
        if protocol.sequential:
            schedule, rounds = run_rounds(prepared, context, budget, lambda limited: _driven(limited, context))
        else:
            schedule = _driven(prepared, context)
        with context.worker.lock.held():
            marker = next(iter(schedule.searches.values())).study
            reported = marker.user_attrs.get("report")
            # A benchmark scored by an older version gains the per-class sums it lacks, and a new report.
            completed = complete_class_sums(output_dir, schedule.reproductions, placement)
            if reported is not None and not completed and (output_dir / output_layout.REPORT_FILE).exists():
                # Not a failure: this worker's share is done and a sibling (a --jobs process or another
                # machine on the same storage) took the report; say so in those words, once per command: the
                # workers a command spawned leave it to the process the user started.
                if not placement.spawned:
                    print(f"dmlbench: done: every trial and reproduction of this benchmark is finished, and worker "
                          f"{reported['worker']} (an earlier run of this command, or a worker sharing it) wrote the report",
                          file=sys.stderr, flush=True)
                return None
            outcome = write_summaries(prepared, schedule.searches, schedule.reproductions, schedule.baselines)
            if rounds is not None and not placement.spawned:
                say(rounds)
            if report is not None:
                written = report(output_dir, prepared.storage)
                track_report(prepared, written)
            marker.set_user_attr("report", {"worker": context.worker.id, "time": provenance.now()})
    except (RunInterrupted, KeyboardInterrupt):
        raise RunInterrupted(f"benchmark {output_dir} stopped; re-run the same command to continue") from None
    return outcome


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
    for path in (run_dir / records.RUN_FILE for run_dir in output_layout.fold_run_dirs(output_dir)):
        try:
            count += files.read_json(path).get("status") == "completed"
        except (OSError, ValueError):
            continue
    return count
