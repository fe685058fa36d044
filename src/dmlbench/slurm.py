"""SLURM through submitit (the ``slurm`` extra): what a job asks for (``SlurmOptions``), the checks made
before anything is submitted, the submission and its sbatch script, and the states of a job's tasks.

Nothing here knows what a task runs: ``protocol.run.slurm`` submits a benchmark's workers as one job
array, ``training.slurm`` one multi-process training run. The SLURM commands (``sbatch``, ``sinfo``,
``scontrol``, ``squeue``) are read from ``PATH`` and find their cluster as any user's would
(``SLURM_CONF`` or the installed ``slurm.conf``).

A job's state comes from ``scontrol show job`` while the controller still knows it (``MinJobAge``, 300 s
by default, after its end), from ``squeue`` otherwise, and once both have forgotten it from submitit's
result file of each task; accounting (``sacct``, slurmdbd) is not needed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dmlbench.errors import ParameterError, UserInputError

EXTRA_HINT = "pip install 'dmlbench[slurm]'"
# Seconds before a time limit at which SLURM warns a task with SIGUSR2 (``#SBATCH --signal=USR2@90``):
# the task stops its unit cleanly and is requeued.
TIME_LIMIT_WARNING_SECONDS = 90
# ``--wait`` asks the controller often while the tasks' states change and rarely while they run on.
FIRST_POLL_SECONDS = 0.5
MAX_POLL_SECONDS = 30.0
# What each task's state word means to a user following the job (SLURM's ``JobState`` words).
LIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD",
                         "REQUEUE_FED", "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"})
_TIME = re.compile(r"^(?:(?P<days>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$")
_SBATCH_OPTION = re.compile(r"^--(?P<key>[a-z][a-z0-9-]*)(?:=(?P<value>.*))?$")
# The options a ``dmlbench`` flag already sets: given again as pass-through they would contradict it.
_OWN_OPTIONS = frozenset({"partition", "time", "cpus-per-task", "gpus-per-node", "nodes", "ntasks-per-node",
                          "array", "output", "error", "signal", "job-name", "open-mode"})
# The parameters that set them, named when one is refused.
_OWN_PARAMETERS = ("partition", "time", "cpus_per_worker", "gpus_per_worker", "jobs")


@dataclass(frozen=True)
class SlurmOptions:
    """What each task of a job asks SLURM for: ``partition`` (``None``: the cluster's default),
    ``time_minutes`` (the time limit), ``cpus_per_task``, ``gpus_per_node`` (0: none asked) and
    ``sbatch``, further ``#SBATCH`` options as ``{name: value}`` (``True``: a flag)."""

    partition: str | None = None
    time_minutes: int = 60
    cpus_per_task: int = 1
    gpus_per_node: int = 0
    sbatch: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.time_minutes < 1:
            raise UserInputError(f"a SLURM time limit must be at least one minute, got {self.time_minutes} minute(s)")
        if self.cpus_per_task < 1:
            raise UserInputError(f"CPUs per SLURM task must be at least 1, got {self.cpus_per_task}")
        if self.gpus_per_node < 0:
            raise UserInputError(f"GPUs per SLURM task must be 0 or more, got {self.gpus_per_node}")

    def parameters(self) -> dict[str, Any]:
        """These options as submitit's ``SlurmExecutor.update_parameters`` takes them."""
        parameters: dict[str, Any] = {"time": self.time_minutes, "cpus_per_task": self.cpus_per_task,
                                      "signal_delay_s": TIME_LIMIT_WARNING_SECONDS}
        if self.partition is not None:
            parameters["partition"] = self.partition
        if self.gpus_per_node:
            parameters["gpus_per_node"] = self.gpus_per_node
        if self.sbatch:
            parameters["additional_parameters"] = dict(self.sbatch)
        return parameters


def parse_time(text: str) -> int:
    """A SLURM time limit (``MINUTES``, ``MINUTES:SECONDS``, ``HOURS:MINUTES:SECONDS``, ``DAYS-HOURS``,
    ``DAYS-HOURS:MINUTES[:SECONDS]``; sbatch's ``--time``) in whole minutes, seconds rounded up."""
    match = _TIME.match(text.strip())
    if match is None:
        raise ParameterError("time", f"{text!r} is no SLURM time limit (e.g. 90, 1:30:00 or 2-00:00:00)")
    days, parts = int(match["days"] or 0), [int(part) for part in (match["a"], match["b"], match["c"]) if part is not None]
    if match["days"] is not None:  # DAYS-HOURS[:MINUTES[:SECONDS]]
        hours, minutes, seconds = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    else:  # MINUTES[:SECONDS]
        hours, (minutes, seconds) = 0, (parts + [0])[:2]
    total_seconds = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return max(1, -(-total_seconds // 60))


def parse_sbatch_options(words: list[str]) -> dict[str, Any]:
    """``--sbatch`` pass-through words (``--qos=high``, ``--exclusive``) as ``{name: value}``; an option
    that a ``dmlbench`` flag sets is refused, naming the flag's job."""
    options: dict[str, Any] = {}
    for word in words:
        match = _SBATCH_OPTION.match(word)
        if match is None:
            raise ParameterError("sbatch", f"{word!r}: give one long sbatch option in each, as --NAME=VALUE or --FLAG")
        if match["key"] in _OWN_OPTIONS:
            raise ParameterError("sbatch", f"{word!r}: --{match['key']} is set by dmlbench itself "
                                 f"({', '.join(f'`{name}`' for name in _OWN_PARAMETERS)})")
        options[match["key"]] = True if match["value"] is None else match["value"]
    return options


def require_cluster(partition: str | None) -> None:
    """A one-line ``UserInputError`` unless this machine can submit to SLURM (submitit installed, the
    SLURM commands on ``PATH``, a controller that answers) and ``partition`` exists there."""
    if importlib.util.find_spec("submitit") is None:
        raise ParameterError("slurm", f"needs the slurm extra: {EXTRA_HINT}")
    missing = [command for command in ("sbatch", "sinfo", "scontrol", "srun") if shutil.which(command) is None]
    if missing:
        raise ParameterError("slurm", f"cannot be used: SLURM is not installed here ({', '.join(missing)} not on PATH); "
                             "run from a machine of the cluster, or leave out `slurm`")
    partitions = _partitions()
    if partition is not None and partition not in partitions:
        raise ParameterError("partition", f"{partition!r} does not exist on this cluster; its partitions: "
                             f"{', '.join(partitions) or 'none'}")


def _partitions() -> list[str]:
    """The cluster's partitions (``sinfo``; the default one's ``*`` dropped)."""
    completed = _run(["sinfo", "--noheader", "--format=%P"])
    return list(dict.fromkeys(line.strip().rstrip("*") for line in completed.splitlines() if line.strip()))


def _run(command: list[str]) -> str:
    """A SLURM command's output; a one-line ``UserInputError`` with its own first error line when it fails."""
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ParameterError("slurm", f"failed: {command[0]}: {error}") from None
    if completed.returncode != 0:
        reason = next((line.strip() for line in completed.stderr.splitlines() if line.strip()), f"exit {completed.returncode}")
        raise ParameterError("slurm", f"failed: {command[0]}: {reason}")
    return completed.stdout


def executor(folder: Path, options: SlurmOptions, *, name: str, nodes: int = 1, tasks_per_node: int = 1) -> Any:
    """A submitit ``SlurmExecutor`` writing its scripts, pickles and logs in ``folder`` (one every node
    reads; created when a job is submitted), running this Python."""
    import submitit

    job = submitit.SlurmExecutor(folder=folder)
    job.update_parameters(job_name=name, nodes=nodes, ntasks_per_node=tasks_per_node, **options.parameters())
    return job


@contextlib.contextmanager
def refusal_in_one_line() -> Iterator[None]:
    """sbatch's refusal of a job (a resource no node has, an account or QOS it does not know) as one
    ``UserInputError`` line, instead of submitit's echo of sbatch's output and its exception."""
    from submitit.core.utils import FailedJobError

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # submitit prints sbatch's errors before raising them
            yield
    except FailedJobError as error:
        reasons = [line.strip().removeprefix("sbatch: error: ") for line in str(error).splitlines() if line.strip()]
        raise UserInputError(f"sbatch refused the job: {'; '.join(reasons) or 'no reason given'}") from None


def script(job: Any, *, array: int | None = None) -> str:
    """The sbatch script ``job`` submits (with ``array`` tasks: a job array), as submitit writes it.
    submitit keeps this step private; ``tests/test_slurm.py`` checks it against a real submission."""
    from submitit.slurm.slurm import _make_sbatch_string

    return _make_sbatch_string(command=job._submitit_command_str, folder=job.folder, map_count=array, **job.parameters)


@dataclass(frozen=True)
class TaskState:
    """One task of a job as SLURM last reported it: ``state`` (``RUNNING``, ``PENDING``, ``COMPLETED``,
    ...; ``ENDED`` when only the task's result file is left), ``reason`` (why it waits, or the node it runs
    on), ``restarts`` (times it was requeued), ``exit_code`` (``code:signal``)."""

    task: int
    state: str
    reason: str = ""
    restarts: int = 0
    exit_code: str = ""

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


def task_states(job_id: str, tasks: int, folder: Path) -> list[TaskState]:
    """The state of each of the ``tasks`` tasks of array job ``job_id`` (a plain job: one task, 0)."""
    known = _scontrol_states(job_id) or _squeue_states(job_id)
    return [known.get(task) or _ended_state(job_id, task, tasks, folder) for task in range(tasks)]


def _scontrol_states(job_id: str) -> dict[int, TaskState]:
    try:
        text = _run(["scontrol", "--oneliner", "show", "job", job_id])
    except UserInputError:  # forgotten by the controller (MinJobAge): the next source tells
        return {}
    states = {}
    for line in text.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "JobState" not in fields:
            continue
        task = fields.get("ArrayTaskId", "0")
        reason = fields.get("NodeList") if fields["JobState"] == "RUNNING" else fields.get("Reason", "")
        entry = dict(state=fields["JobState"], reason="" if reason in (None, "None", "(null)") else reason,
                     restarts=int(fields.get("Restarts", "0") or 0), exit_code=fields.get("ExitCode", ""))
        for index in _task_ids(task):
            states[index] = TaskState(index, **entry)
    return states


def _squeue_states(job_id: str) -> dict[int, TaskState]:
    try:
        text = _run(["squeue", "--noheader", "--array", "--jobs", job_id, "--format=%K|%T|%R"])
    except UserInputError:
        return {}
    states = {}
    for line in text.splitlines():
        task, state, reason = (line.split("|") + ["", ""])[:3]
        for index in _task_ids(task.strip()):
            states[index] = TaskState(index, state.strip(), reason.strip())
    return states


def _task_ids(text: str) -> list[int]:
    """``3``, ``0-3`` or ``[0-1,4%2]`` (SLURM's array task lists) as the task numbers; ``N/A`` as task 0."""
    text = text.strip("[]").split("%", 1)[0]
    ids: list[int] = []
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        if low.isdigit():
            ids += list(range(int(low), int(high or low) + 1))
    return ids or [0]


def _ended_state(job_id: str, task: int, tasks: int, folder: Path) -> TaskState:
    """A task SLURM no longer reports: completed or failed by submitit's result file, else unknown."""
    from submitit.core.utils import pickle_load

    name = f"{job_id}_{task}" if tasks > 1 else job_id
    result = folder / f"{name}_0_result.pkl"
    if not result.is_file():
        return TaskState(task, "ENDED", "no result file: stopped or cancelled")
    try:
        outcome = pickle_load(result)[0]
    except Exception:  # noqa: BLE001  a damaged result file says no more than a missing one
        return TaskState(task, "ENDED", f"unreadable {result.name}")
    return TaskState(task, "COMPLETED" if outcome == "success" else "FAILED")


def poll_pauses(first: float = FIRST_POLL_SECONDS, longest: float = MAX_POLL_SECONDS) -> Iterator[float]:
    """The pauses between a follower's questions to the controller: ``first`` seconds, then twice as long
    each time, up to ``longest`` (a follower starts them again when a state changes)."""
    pause = first
    while True:
        yield pause
        pause = min(2 * pause, longest)


def follow_tasks(job_id: str, tasks: int, folder: Path, *, line: Callable[[list[TaskState]], str],
                 progress: bool) -> list[TaskState]:
    """Wait until no task of job ``job_id`` is queued or running, asking the controller as ``poll_pauses``
    says (again from the first pause after each change), and print ``line(states)`` each time it changes
    (``progress``); the tasks' last states."""
    last, pauses = "", poll_pauses()
    while True:
        states = task_states(job_id, tasks, folder)
        shown = line(states)
        if shown != last:
            if progress:
                print(shown, file=sys.stderr, flush=True)
            last, pauses = shown, poll_pauses()
        if not any(state.live for state in states):
            return states
        time.sleep(next(pauses))


def requeue(job_id: str) -> None:
    """Put this task back in the queue (``scontrol requeue``): it starts again as it was submitted."""
    _run(["scontrol", "requeue", job_id])
