"""``dmlbench status``: how far a benchmark is, read from its storage while workers run.

Per method: search trials done / running / failed / left, reproductions done, then the workers seen
in the last ``RECENT_SECONDS`` (each claim and each heartbeat records one) and an estimate of the
time left: the mean wall time of the finished units times the units left, shared by the workers seen.
The units left include the reproductions of methods still searching (the benchmark's
``protocol.reproductions``; with ``--storage`` alone, the number the started stages stored).
"""

from __future__ import annotations

import time
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from dmlbench.errors import UserInputError
from dmlbench.protocol.design.benchmark_file import BenchmarkRecord, read_benchmark
from dmlbench.protocol.layout import BASELINES, SLURM_FILE, fold_study, reproduction_study
from dmlbench.protocol.queue import attempts
from dmlbench.protocol.queue import storage as storage_module
from dmlbench.protocol.run import rounds

RECENT_SECONDS = 300
PREFIX = reproduction_study("")
FOLDS_PREFIX = fold_study("")  # a method's fold units (protocol.fold_units): counted with its trials


def status_lines(directory: Path | None, storage: str | None) -> list[str]:
    """The report of ``dmlbench status DIR`` or ``dmlbench status --storage URL``."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    planned: int | None = None  # reproductions per method, counted before a method's stage starts
    if storage is None and directory is None:
        raise UserInputError("status_lines needs a benchmark directory or a storage URL")
    record = read_benchmark(Path(directory)) if directory is not None and storage is None else None
    if record is not None:
        storage, planned = record.storage, record.spec.protocol.get("reproductions")
    storage_module.storage_for(storage).check(default=False)
    names = storage_module.study_names(storage)
    if not names:
        return _nothing_stored(storage, directory)
    backend = storage_module.open_storage(storage)
    studies = {name: optuna.load_study(study_name=name, storage=backend) for name in names}
    lines = [f"storage {storage_module.redact(storage)}"]
    now = time.time()
    workers: dict[str, float] = {}
    durations: list[float] = []
    left_units = 0
    lines.append(f"{'method':<28} {'done':>5} {'running':>7} {'failed':>6} {'left':>5} {'reproductions':>13}")
    for name, study in studies.items():
        for key, value in study.user_attrs.items():
            if key.startswith("worker:"):
                workers[key[len("worker:"):]] = max(workers.get(key[len("worker:"):], 0.0), float(value["last_seen"]))
        trials = study.get_trials(deepcopy=False)
        for trial in trials:
            owner = trial.user_attrs.get("worker")
            if trial.state == TrialState.RUNNING and owner and "heartbeat" in trial.user_attrs:
                workers[owner["id"]] = max(workers.get(owner["id"], 0.0), float(trial.user_attrs["heartbeat"]))
        if not name.startswith(FOLDS_PREFIX):  # a trial's cost holds its folds'
            durations += [t.user_attrs["cost"]["wall_seconds"] for t in attempts.counted(study) if t.user_attrs.get("cost")]
    if planned is None:  # --storage alone: the stages already started say how many every method gets
        started = [int(study.user_attrs["reproductions"]) for name, study in studies.items()
                   if name.startswith(PREFIX) and name[len(PREFIX):] not in BASELINES and "reproductions" in study.user_attrs]
        planned = max(started, default=None)
    unplanned = 0  # methods whose reproductions no estimate can count yet
    unscored = 0  # reproductions and baseline scorings that failed
    for name, study in studies.items():
        if name.startswith((PREFIX, FOLDS_PREFIX)):
            continue
        counted = attempts.counted(study)
        budget = int(study.user_attrs.get("trials", len(counted)))
        running = len(_running_trials(study, studies.get(fold_study(name))))
        failed = _failed(counted)
        left = max(budget - len(counted), 0)
        reproductions = studies.get(reproduction_study(name))
        # A search done without one completed trial has no parameters to reproduce: nothing of it is left
        # (until benchmark --retry-failed enqueues its trials again).
        search_failed = left == 0 and not running and bool(counted) and all(t.state == TrialState.FAIL for t in counted)
        wanted = 0 if search_failed else int((reproductions.user_attrs.get("reproductions") if reproductions else planned) or 0)
        reproduced = attempts.counted(reproductions) if reproductions is not None else []
        done_reproductions, failed_reproductions = len(reproduced), _failed(reproduced)
        unplanned += reproductions is None and planned is None and not search_failed
        left_units += left + max(wanted - done_reproductions, 0)
        shown = ("search failed" if search_failed else
                 f"{done_reproductions}/{wanted}" if reproductions is not None or planned else "not started")
        shown += f" ({failed_reproductions} failed)" if failed_reproductions else ""  # finished, without a score
        unscored += failed_reproductions
        lines.append(f"{name:<28} {len(counted):>5} {running:>7} {failed:>6} {left:>5} {shown:>13}")
    for name in BASELINES:
        if (baseline := studies.get(reproduction_study(name))) is not None:
            line, left, failed = _baseline_line(name, baseline)
            lines.append(line)
            left_units, unscored = left_units + left, unscored + failed
    recent = sorted(worker for worker, seen in workers.items() if now - seen <= RECENT_SECONDS)
    lines.append(f"workers seen in the last {RECENT_SECONDS // 60} minutes: {len(recent)}"
                 + (f" ({', '.join(recent)})" if recent else ""))
    uncounted = f"; the reproductions of {unplanned} method(s) not counted: their number is not stored yet" if unplanned else ""
    if left_units == 0 and not unplanned:
        lines.append("time left: none, every search trial and reproduction is done" + (
            f"; {unscored} reproduction(s) failed: once the cause is fixed, `dmlbench benchmark --retry-failed` runs "
            "them again" if unscored else ""))
    elif durations:
        seconds = sum(durations) / len(durations) * left_units / max(len(recent), 1)
        lines.append(f"time left: about {_clock(seconds)} (estimate: {left_units} units left x mean "
                     f"{sum(durations) / len(durations):.1f} s per finished unit / {max(len(recent), 1)} worker(s){uncounted})")
    else:
        lines.append(f"time left: unknown until a unit finishes ({left_units} units left{uncounted})")
    return lines + _sequential_lines(record, studies) + (slurm_lines(Path(directory)) if directory is not None else [])


def _sequential_lines(record: BenchmarkRecord | None, studies: dict[str, optuna.Study]) -> list[str]:
    """A sequential study's round and comparisons so far (``protocol.run.rounds``); nothing for another."""
    if record is None or not record.protocol.sequential:
        return []
    return rounds.status_lines(record.protocol, record.analysis_spec(), [m.name for m in record.spec.methods], studies)


def _nothing_stored(storage: str, directory: Path | None) -> list[str]:
    """A storage without a study: a benchmark submitted to SLURM whose tasks have not started (its tasks'
    states), else no benchmark (a one-line ``UserInputError``)."""
    if directory is not None and (Path(directory) / SLURM_FILE).is_file():
        return [f"storage {storage_module.redact(storage)}: no unit started yet", *slurm_lines(Path(directory))]
    raise UserInputError(f"storage {storage_module.redact(storage)} holds no study")


def slurm_lines(directory: Path) -> list[str]:
    """The SLURM jobs of ``benchmark --slurm`` (``slurm.json``): the last one, and any earlier one with
    a task still queued or running, each task's state as SLURM reports it now."""
    if not (directory / SLURM_FILE).is_file():
        return []
    from dmlbench.protocol.run import slurm

    jobs = slurm.recorded_jobs(directory)
    lines = []
    for index, job in enumerate(jobs):
        tasks = slurm.states(directory, job)
        if index == len(jobs) - 1 or any(task.live for task in tasks):
            lines.append(slurm.describe(job, tasks))
    return lines


def _baseline_line(name: str, study: optuna.Study) -> tuple[str, int, int]:
    """A baseline's line (its scorings done of those planned, and failed), its scorings left and failed."""
    counted = attempts.counted(study)
    done, failed, planned = len(counted), _failed(counted), study.user_attrs.get("reproductions")
    line = f"{name} baseline: {done - failed}/{planned} scored" + (f", {failed} failed" if failed else "")
    return line, max(int(planned or 0) - done, 0), failed


def _failed(counted: list[FrozenTrial]) -> int:
    """How many of a study's counted units (``attempts.counted``: a retried one once, as its retry) failed."""
    return sum(trial.state == TrialState.FAIL for trial in counted)


def _running_trials(study: optuna.Study, folds: optuna.Study | None) -> set[int]:
    """The slots of a method's trials running now: their own unit, or one of their fold units."""
    running = {attempts.slot_of(t) for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    if folds is not None:
        per_trial = int(folds.user_attrs["folds"])
        running |= {int(t.user_attrs["slot"]) // per_trial for t in folds.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    return {slot for slot in running if slot is not None}


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
