"""Units of work shared by any number of workers through Optuna studies.

Every unit is an Optuna trial with a ``slot`` user attribute: slot ``k`` of a method's search study is
its ``k``-th budgeted trial, slot ``r`` of a reproduction study its reproduction ``r``. A slot is

* *done* when one of its trials is COMPLETE, PRUNED or FAILED for a reason of its own
  (``fail_reason``): it used the budget and is never run again;
* *taken* while one of its trials is RUNNING or WAITING (enqueued);
* *interrupted* when all its trials FAILED without a reason of their own: a worker was stopped
  (Ctrl-C: ``interrupted``), killed (its heartbeat went stale, or, for a file storage on this machine,
  its process is gone). Such a slot is enqueued again with the same parameters (``retry_of``), once.

Workers decide what to take under ``storage.WorkLock`` (count, decide, enqueue, ``study.ask()``), so a
budget of ``n`` trials never gets trial ``n + 1`` while another worker's trial still runs, and a slot is
never taken twice. Only a retried slot is evaluated twice (same parameters and seed; one trial counts).
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from dmlbench import provenance
from dmlbench.errors import PluginFailed, RunInterrupted, UserInputError
from dmlbench.files import storage_error
from dmlbench.ownership import DirectoryInUse, process_exists
from dmlbench.protocol.queue import storage as storage_module
from dmlbench.protocol.queue.attempts import RETRY_OF_FAILED, done, done_trial, finished, fixed_params, slots

WAIT, DONE = "wait", "done"
# Seconds between a running unit's heartbeats when --heartbeat does not say; a worker that missed
# STALE_BEATS of them is taken for dead (Optuna's grace period for database servers is the same).
DEFAULT_BEAT_SECONDS = 30
STALE_BEATS = 3


class UnitFailed(RuntimeError):
    """A unit that fails with a reason already written out in full (a search trial whose fold unit
    failed, ``protocol.fold_units``): it is recorded as it is."""


@dataclass
class Worker:
    """This process as the studies record it: id, machine, process id; ``heartbeat`` seconds (or None).
    ``active``: the trial ids it runs now; a RUNNING trial of this process that is not among them was
    left by an earlier call that was stopped (an in-process Ctrl-C)."""

    url: str
    heartbeat: int | None = None
    id: str = field(default_factory=lambda: f"{storage_module.host_id()}:{os.getpid()}:{uuid.uuid4().hex[:6]}")
    host: str = field(default_factory=storage_module.host_id)
    pid: int = field(default_factory=os.getpid)
    active: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.kind = storage_module.storage_for(self.url)
        self.lock = storage_module.WorkLock(self.url)
        # Optuna's heartbeat is a database server's; a file storage's workers are this machine's processes.
        self.beats = self.heartbeat is not None and not self.kind.processes_of_one_machine
        self.storage = self.kind.open(heartbeat=self.heartbeat if self.beats else None)

    @property
    def beat_seconds(self) -> int:
        """Seconds between this worker's heartbeats (``heartbeat``, else ``DEFAULT_BEAT_SECONDS``)."""
        return self.heartbeat or DEFAULT_BEAT_SECONDS

    def stamp(self) -> dict[str, Any]:
        return {"id": self.id, "host": self.host, "pid": self.pid, "last_seen": time.time()}


def record_or_check(study: optuna.Study, recorded: Mapping[str, Any]) -> None:
    """Record what a study is for on a new study; refuse one that was made for other work.

    A record cut off part way (a lost connection, a stop signal: one attribute is written at a time)
    left some of the keys. Those present must match; the missing ones are written now, so that a
    study is never refused for work it did not do.
    """
    stored = study.user_attrs
    for key, value in recorded.items():
        if key not in stored:
            study.set_user_attr(key, value)
        elif stored[key] != value:
            raise UserInputError(f"study {study.study_name!r} was started with {key} = {stored[key]!r}, now {value!r}: "
                                 "use a new output directory or storage")


def announce_failure(unit: str, outcome: str) -> None:
    """A failed unit on stderr, also under --quiet: the method's own error (a plugin's exception) is
    what the user must fix before ``benchmark --retry-failed``."""
    print(f"dmlbench: error: {unit} {outcome}", file=sys.stderr, flush=True)


def retry_failed(study: optuna.Study, worker: Worker) -> int:
    """Enqueue a new attempt, with the same parameters, of every slot whose counted attempt FAILED for a
    reason of its own (a plugin that raised, a NaN loss): the user fixed its cause and asks for it
    again. The failed attempt stays in the storage, no longer counted; returns the slots retried."""
    retried = 0
    with worker.lock.held():
        for _, attempts in sorted(slots(study.get_trials(deepcopy=False)).items()):
            counted_attempt = done_trial(attempts)
            live = any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in attempts)
            if counted_attempt is None or counted_attempt.state != TrialState.FAIL or live:
                continue
            attributes = {key: value for key, value in counted_attempt.user_attrs.items() if key in ("slot", "params")}
            study.enqueue_trial(fixed_params(counted_attempt), user_attrs={**attributes, RETRY_OF_FAILED: counted_attempt.number})
            retried += 1
    return retried


def release_stale(study: optuna.Study, worker: Worker) -> None:
    """Fail the RUNNING trials whose worker is gone (under the work lock).

    Database servers: Optuna's heartbeat (``fail_stale_trials``; its callback enqueues the retry).
    File storages: a RUNNING trial of this machine whose process no longer exists, or one of this process
    that it is not running now; a journal file that the nodes of a cluster share (SLURM tasks): a RUNNING
    trial of another machine whose heartbeat attribute is ``STALE_BEATS`` beats old (the machines' clocks
    must agree to well within that). Any storage: a RUNNING trial that no worker stamped."""
    if worker.beats:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.user_attrs.get("worker")
        if owner is None:
            # Claims stamp their trial under this lock, so a RUNNING trial without a stamp is a claim
            # that broke off between ``ask`` and the stamp (a lost connection, a killed worker).
            _mark_interrupted(study, storage_module.trial_id(trial), "interrupted: the claim broke off")
            continue
        if owner.get("host") != worker.host:
            if worker.kind.processes_of_one_machine and _silent(trial, worker):
                _mark_interrupted(study, storage_module.trial_id(trial), "interrupted: its worker on another machine stopped beating")
            continue
        mine_but_idle = owner.get("pid") == worker.pid and storage_module.trial_id(trial) not in worker.active
        if mine_but_idle or (worker.kind.processes_of_one_machine and not process_exists(int(owner.get("pid", -1)))):
            _mark_interrupted(study, storage_module.trial_id(trial), "interrupted: the worker process stopped")


def _silent(trial: FrozenTrial, worker: Worker) -> bool:
    """Whether ``trial``'s worker missed ``STALE_BEATS`` heartbeats (``Beating`` writes one every interval)."""
    owner = trial.user_attrs["worker"]
    last = float(trial.user_attrs.get("heartbeat", owner.get("last_seen", time.time())))
    return time.time() - last > STALE_BEATS * worker.beat_seconds


def _mark_interrupted(study: optuna.Study, trial_id: int, reason: str) -> None:
    try:
        backend = storage_module.backend(study)
        backend.set_trial_user_attr(trial_id, "interrupted", True)
        backend.set_trial_user_attr(trial_id, "interrupted_reason", reason)
        backend.set_trial_state_values(trial_id, state=TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        pass  # another worker finished or failed it first


def repair_interrupted(study: optuna.Study) -> None:
    """Enqueue once, with the same parameters, every slot that only has interrupted attempts."""
    for slot, attempts in sorted(slots(study.get_trials(deepcopy=False)).items()):
        if any(done(t) or t.state in (TrialState.RUNNING, TrialState.WAITING) for t in attempts):
            continue
        last = max(attempts, key=lambda t: t.number)
        attributes = {key: value for key, value in last.user_attrs.items() if key in ("slot", "params")}
        # The parameters the slot was enqueued with: a retry enqueued without them would be sampled
        # afresh (seen in CI: another temperature, another best trial).
        study.enqueue_trial(fixed_params(last), user_attrs={**attributes, "retry_of": last.number})


@dataclass
class Claim:
    """A unit this worker took: the live trial and its slot."""

    trial: optuna.Trial
    slot: int


def claim(
    study: optuna.Study,
    worker: Worker,
    *,
    budget: int,
    ready: Callable[[int, dict[int, FrozenTrial]], bool],
    propose: Callable[[int, dict[int, FrozenTrial]], tuple[dict[str, Any], dict[str, Any]]],
) -> Claim | str:
    """Take one unit of ``study``, or say ``WAIT`` (all left is running elsewhere, or not ready yet)
    or ``DONE`` (every slot of the budget is done).

    ``ready(k, finished)``: may slot ``k`` start, given the done trial of every finished slot;
    ``propose(k, finished)``: the fixed parameters and user attributes of slot ``k``."""
    with worker.lock.held():
        release_stale(study, worker)
        repair_interrupted(study)
        trials = study.get_trials(deepcopy=False)
        grouped = slots(trials)
        done_slots = finished(grouped)
        waiting = [t for t in trials if t.state == TrialState.WAITING]
        if not waiting:
            slot = len(grouped)
            if slot >= budget or not ready(slot, done_slots):
                complete = len(done_slots) >= budget and slot >= budget
                return DONE if complete else WAIT
            params, attributes = propose(slot, done_slots)
            study.enqueue_trial(params, user_attrs={**attributes, "slot": slot})
        trial = study.ask()
        trial_id = storage_module.trial_id(trial)
        if worker.beats:
            # Beating from the claim on: a worker lost before its unit starts leaves a trial that goes stale.
            # (Lost between ``ask`` and this beat, a retry that Optuna's stale-trial callback enqueued
            # still carries the stamp of the worker it replaces: that one-call window stays open.)
            storage_module.backend(study).record_heartbeat(trial_id)
        stamp = worker.stamp()
        trial.set_user_attr("worker", stamp)
        trial.set_user_attr("started", provenance.now())
        study.set_user_attr(f"worker:{worker.id}", stamp)
        slot = trial.user_attrs.get("slot")
        assert slot is not None, "every enqueued unit carries its slot"
        # Active only once the claim is complete: one broken off (a lost connection) is idle, and released.
        worker.active.add(trial_id)
        return Claim(trial, int(slot))


class Beating:
    """While a unit runs: Optuna's heartbeat (database servers) and a ``heartbeat`` time in the
    trial's user attributes (what ``dmlbench status`` reads), every ``interval`` seconds."""

    def __init__(self, study: optuna.Study, trial: optuna.Trial, worker: Worker) -> None:
        self.study, self.trial, self.worker = study, trial, worker
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> "Beating":
        if self.worker.kind.concurrent:  # SQLite: one worker, and a second writer thread would lock it
            self.thread = threading.Thread(target=self._beat, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
        self.worker.active.discard(storage_module.trial_id(self.trial))

    def _beat(self) -> None:
        interval = self.worker.beat_seconds
        backend, trial_id = storage_module.backend(self.study), storage_module.trial_id(self.trial)
        while True:
            try:
                if self.worker.beats:
                    backend.record_heartbeat(trial_id)
                backend.set_trial_user_attr(trial_id, "heartbeat", time.time())
            except Exception:  # noqa: S110  a database restarting: beat again at the next interval
                pass
            if self.stop.wait(interval):
                return


@dataclass
class Cost:
    """Wall time, CPU time (``time.process_time``: this process, all threads), the worker's peak
    resident memory (``resource.getrusage(RUSAGE_SELF).ru_maxrss``, KiB on Linux: the process's peak
    so far, not the unit's own) and the training samples seen."""

    wall_seconds: float
    cpu_seconds: float
    peak_memory_kib: int
    samples_seen: int

    @staticmethod
    def start() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    @classmethod
    def since(cls, started: tuple[float, float], samples_seen: int) -> "Cost":
        return cls(round(time.perf_counter() - started[0], 3), round(time.process_time() - started[1], 3),
                   int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss), int(samples_seen))


def finish(study: optuna.Study, trial: optuna.Trial, *, value: float | None = None, state: TrialState = TrialState.COMPLETE,
           attributes: dict[str, Any] | None = None) -> bool:
    """Record and tell a unit's outcome; ``False`` (nothing counted) if another worker already
    failed it as stale: its retry computes the same result and counts instead."""
    try:
        for key, attribute in (attributes or {}).items():
            trial.set_user_attr(key, attribute)
        if state == TrialState.COMPLETE:
            study.tell(trial, value)
        else:
            study.tell(trial, state=state)
        return True
    except optuna.exceptions.UpdateFinishedTrialError:
        print(f"dmlbench: note: trial {trial.number} of {study.study_name} was taken over by another worker; "
              "its result is not counted twice", file=sys.stderr, flush=True)
        return False


def interrupt(study: optuna.Study, trial: optuna.Trial, worker: Worker) -> None:
    """Ctrl-C during a unit: fail it as interrupted so that the next claim re-enqueues its slot."""
    _mark_interrupted(study, storage_module.trial_id(trial), "interrupted: stopped by the user")
    worker.active.discard(storage_module.trial_id(trial))


def execute(study: optuna.Study, claimed: Claim, worker: Worker, body: Callable[[dict[str, Any]], float],
            cost: Callable[[], Cost]) -> str | None:
    """Run one claimed unit and tell its outcome: ``None`` when it completed with the value ``body``
    returns, else what happened (``"pruned (...)"``, ``"failed (...)"``).

    ``body`` fills the attributes it has as it goes (kept with a failure). A stop (Ctrl-C, SIGTERM),
    a failing disk, a lost connection to a database server, or a run directory another process still
    trains (a worker taken for dead that is not) is not the method's failure: the unit is marked
    interrupted, so that it is run again, and the exception goes on. Any other exception fails the
    unit with its reason."""
    attributes: dict[str, Any] = {}
    with Beating(study, claimed.trial, worker):
        try:
            value = body(attributes)
        except (RunInterrupted, KeyboardInterrupt):
            interrupt(study, claimed.trial, worker)
            raise
        except optuna.TrialPruned as pruned:
            finish(study, claimed.trial, state=TrialState.PRUNED,
                   attributes={"pruned": str(pruned), "cost": asdict(cost())})
            return f"pruned ({pruned})"
        except Exception as error:
            # A database server that went away may be back before the failure would be told: its error
            # is the storage's, never the method's (the worker's retry loop waits for the server).
            if (storage_error(error) is not None or worker.kind.connection_lost(error) is not None
                    or isinstance(error, DirectoryInUse)):
                interrupt(study, claimed.trial, worker)
                raise
            # A plugin's failure is already one line naming the plugin, its frame and the run's error.log.
            reason = (str(error) if isinstance(error, (PluginFailed, UnitFailed))
                      else f"{type(error).__name__}: {error}".strip())
            finish(study, claimed.trial, state=TrialState.FAIL,
                   attributes={**attributes, "fail_reason": reason, "cost": asdict(cost())})
            return f"failed ({reason})"
        finish(study, claimed.trial, value=value, attributes={**attributes, "cost": asdict(cost())})
    return None
