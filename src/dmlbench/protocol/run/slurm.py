"""``dmlbench benchmark --slurm --jobs N``: the N workers of a benchmark as one SLURM job array.

Each array task is an ordinary worker (``jobs.WorkerTask``) on the shared storage: it prepares the
benchmark as the submitting process did and takes units until none is left; the first to find
everything done writes the report, as with any workers. The submitting process checks everything a
worker would (the config, the data, the storage), writes ``benchmark.json`` with the threads a task
trains with (``--cpus-per-worker`` where ``training.num_threads`` is ``auto``), submits, records the job in
``slurm.json`` and returns; ``follow`` waits for the tasks (``--wait``).

Stops: SLURM's SIGTERM (``scancel``, a preemption, ``scontrol requeue``) is a clean stop: the unit the
task held is marked interrupted and runs again from its start in whichever worker takes it up (a
requeued task, another task, the same command run again). The time-limit warning (SIGUSR2,
``TIME_LIMIT_WARNING_SECONDS`` before the limit) stops the same way and requeues the task itself. A task
killed outright (SIGKILL, a node that dies) leaves its unit running in the storage: PostgreSQL's
heartbeat frees it after three missed beats; a journal file frees it when a worker of the same node
starts (its process is gone) or, from another node, when the unit's own heartbeat is three beats old.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmlbench import files, provenance, slurm
from dmlbench.errors import UserInputError
from dmlbench.protocol.design.prepare import Prepared
from dmlbench.protocol.layout import REPORT_FILE, SLURM_DIR, SLURM_FILE
from dmlbench.protocol.queue.storage import password, redact
from dmlbench.protocol.run.jobs import STOPPED_EXIT_CODES, WorkerTask
from dmlbench.protocol.run.record import ReportWriter, write_benchmark_file
from dmlbench.protocol.run.rounds import RoundBudget
from dmlbench.training.placement import STANDALONE, Placement


@dataclass(frozen=True)
class Submission:
    """A job array of a benchmark's workers: its SLURM ``job_id`` and ``tasks``."""

    job_id: str
    tasks: int


def submit_workers(prepared: Prepared, config_path: Path | None, overrides: list[str], options: slurm.SlurmOptions, *,
                   report: ReportWriter | None, budget: RoundBudget = RoundBudget()) -> Submission:
    """Submit ``prepared.jobs`` workers as one array job (``budget``: a sequential study's, shared by every task);
    the job, also recorded in ``slurm.json``."""
    job = _executor(prepared, options)
    job.folder.mkdir(parents=True, exist_ok=True)
    write_benchmark_file(prepared, Placement(), threads_per_worker=options.cpus_per_task)
    secret = password(prepared.storage)
    if secret is not None:  # the tasks connect with the redacted URL; libpq takes the password from here
        os.environ["PGPASSWORD"] = secret
    task = WorkerTask.of(prepared, config_path, overrides, progress=False, report=report, storage=redact(prepared.storage),
                         budget=budget)
    with slurm.refusal_in_one_line(), job.batch():
        submitted = [job.submit(SlurmWorker(task)) for _ in range(prepared.jobs)]
    submission = Submission(str(submitted[0].job_id).split("_", 1)[0], prepared.jobs)
    _record(prepared.output_dir, submission, options)
    return submission


def submission_script(prepared: Prepared, options: slurm.SlurmOptions) -> str:
    """The sbatch script ``submit_workers`` would submit (``--dry-run``); submits nothing."""
    return slurm.script(_executor(prepared, options), array=prepared.jobs if prepared.jobs > 1 else None)


def _executor(prepared: Prepared, options: slurm.SlurmOptions) -> Any:
    return slurm.executor(prepared.output_dir.resolve() / SLURM_DIR, options, name=f"dmlbench-{prepared.output_dir.name}")


class SlurmWorker:
    """One array task: a worker of the benchmark (``WorkerTask``) that requeues itself when SLURM warns
    of its time limit (SIGUSR2) after stopping its unit cleanly."""

    def __init__(self, task: WorkerTask) -> None:
        self.task = task

    def __call__(self) -> None:
        warned = []

        def time_limit_near(signum: int, frame: object) -> None:
            warned.append(signum)
            os.kill(os.getpid(), signal.SIGTERM)  # the clean stop of every worker: the unit is marked interrupted

        signal.signal(signal.SIGUSR2, time_limit_near)
        try:
            self.task.run(STANDALONE)
        except SystemExit as stop:
            if warned and stop.code in STOPPED_EXIT_CODES:
                import submitit

                print("dmlbench: the time limit is near: unit stopped, task requeued", file=sys.stderr, flush=True)
                slurm.requeue(submitit.JobEnvironment().job_id)
            raise


def _record(output_dir: Path, submission: Submission, options: slurm.SlurmOptions) -> None:
    """Add ``submission`` to ``slurm.json`` (every job ever submitted for this directory, the last one last)."""
    stored = _read_jobs(output_dir)
    stored["jobs"].append({"job_id": submission.job_id, "tasks": submission.tasks, "partition": options.partition,
                           "time_minutes": options.time_minutes, "cpus_per_task": options.cpus_per_task,
                           "gpus_per_node": options.gpus_per_node, "sbatch": options.sbatch,
                           "submitted": provenance.now()})
    files.write_json(output_dir / SLURM_FILE, stored)


def recorded_jobs(output_dir: Path) -> list[Submission]:
    """The jobs ``slurm.json`` records for ``output_dir`` (none without ``--slurm``)."""
    return [Submission(str(entry["job_id"]), int(entry["tasks"])) for entry in _read_jobs(output_dir)["jobs"]]


def _read_jobs(output_dir: Path) -> dict[str, Any]:
    """``slurm.json`` as stored (``{"jobs": []}`` without one); a damaged one is a one-line ``UserInputError``
    (it is never overwritten: it names jobs that may still run)."""
    path = output_dir / SLURM_FILE
    if not path.is_file():
        return {"jobs": []}
    try:
        stored = files.read_json(path)
        jobs = stored["jobs"]
        if not all(str(entry["job_id"]) and int(entry["tasks"]) >= 1 for entry in jobs):
            raise ValueError("a job without its id or tasks")
    except (OSError, ValueError, TypeError, KeyError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UserInputError(f"{path} is damaged ({error!r}); its jobs are listed by `squeue --me`; move the file "
                             "away to submit anew") from None
    return stored


def states(output_dir: Path, submission: Submission) -> list[slurm.TaskState]:
    """Each task of ``submission`` as SLURM reports it now."""
    return slurm.task_states(submission.job_id, submission.tasks, output_dir.resolve() / SLURM_DIR)


def describe(submission: Submission, tasks: list[slurm.TaskState]) -> str:
    """``SLURM job 12: task 0 RUNNING (vm), task 1 PENDING (Resources)``, with each task's requeues."""
    parts = []
    for task in tasks:
        details = ", ".join(filter(None, [task.reason, f"requeued {task.restarts}x" if task.restarts else ""]))
        parts.append(f"task {task.task} {task.state}" + (f" ({details})" if details else ""))
    return f"SLURM job {submission.job_id}: " + ", ".join(parts)


def follow(output_dir: Path, submission: Submission, *, progress: bool) -> bool:
    """Wait until no task of ``submission`` is queued or running, printing each change of their states
    (``progress``, ``describe``); whether the report was written."""
    slurm.follow_tasks(submission.job_id, submission.tasks, output_dir.resolve() / SLURM_DIR,
                       line=lambda tasks: describe(submission, tasks), progress=progress)
    return (output_dir / REPORT_FILE).is_file()
