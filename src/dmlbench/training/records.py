"""What a run directory holds: the name of every file and folder in it (no other module spells them,
``tests/test_architecture.py`` checks), the epoch records, the run's cost; every file is written
atomically (``dmlbench.files``), provenance comes from ``dmlbench.provenance``::

    RUN_DIR/
      config.yaml                              the run's whole config
      run.json                                 status, provenance, classes, best epoch, cost
      metrics.jsonl                            one record per epoch
      checkpoint_last.pt, checkpoint_best.pt   the resumable last state and the validation-selected model
      test_metrics.json                        test scores (a finished run's, or a reproduction's beside its folds)
      error.log                                the traceback of a run that failed with an exception
      run.lock                                 held by the process training the run
      tensorboard/                             event files (``tracking.backend: tensorboard``)
"""

from __future__ import annotations

import hashlib
import json
import resource
import shutil
import time
import traceback
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from dmlbench.errors import UserInputError
from dmlbench.files import atomic_write_text, file_sha256, load_checkpoint, read_json, signals_deferred
from dmlbench.ownership import owned

CONFIG_FILE = "config.yaml"
RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
LAST_CHECKPOINT = "checkpoint_last.pt"
BEST_CHECKPOINT = "checkpoint_best.pt"
TEST_METRICS_FILE = "test_metrics.json"
ERROR_LOG = "error.log"  # the full traceback of a run that failed with an exception
TENSORBOARD_DIR = "tensorboard"  # the event files of ``training.tracking``'s TensorBoard tracker
# Held (flock) by the one process that trains the run; removed when it ends (``dmlbench.ownership``).
LOCK_FILE = "run.lock"
# A directory holding one of these is a training run's, finished or not (or one being started).
RUN_MARKERS = (RUN_FILE, CONFIG_FILE, LOCK_FILE)

def create_run_dir(run_dir: Path) -> None:
    """Create a new run directory, or fail with one line naming it (read-only parent, a file in the way)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserInputError(f"cannot create run directory {run_dir}: {error.strerror or error}") from None


def owned_run_dir(run_dir: Path) -> AbstractContextManager[None]:
    """This process's hold on ``run_dir`` (created if missing) while it writes the run: another
    process that trains or resumes it meanwhile is refused with one line naming this one."""
    return owned(run_dir, LOCK_FILE, what="run directory")


def is_run_dir(directory: Path) -> bool:
    """Whether ``directory`` belongs to a training run (finished, unfinished or being started)."""
    return any((Path(directory) / name).exists() for name in RUN_MARKERS)


def clear_run_dir(run_dir: Path) -> None:
    """Remove what an attempt left in ``run_dir``, all but the lock file of its present owner."""
    for entry in run_dir.iterdir():
        if entry.name == LOCK_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def append_metrics(run_dir: Path, record: dict[str, Any]) -> None:
    path = run_dir / METRICS_FILE
    with signals_deferred():
        try:
            with open(path, "a") as stream:
                stream.write(json.dumps(record) + "\n")
        except OSError as error:
            raise OSError(error.errno, error.strerror, str(path)) from None


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The epoch records; a last line without its newline (a write cut short by a full disk or a
    crash) is no record."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]
    return [json.loads(line) for line in lines if line.strip()]


def truncate_metrics(run_dir: Path, last_epoch: int) -> None:
    """Drop records of epochs after ``last_epoch`` (they were logged after the last checkpoint)."""
    kept = [record for record in read_metrics(run_dir) if record["epoch"] <= last_epoch]
    atomic_write_text(run_dir / METRICS_FILE, "".join(json.dumps(record) + "\n" for record in kept))


def write_error_log(run_dir: Path, error: BaseException) -> Path:
    """The full traceback of the exception a run failed with, in ``error.log`` (the one-line reason
    goes to ``run.json`` and the terminal)."""
    path = run_dir / ERROR_LOG
    atomic_write_text(path, "".join(traceback.format_exception(error)))
    return path


def run_hashes(run_dir: Path) -> dict[str, str]:
    """What identifies a trained model: sha256 of its validation-selected checkpoint and of its config file."""
    return {"model_sha256": file_sha256(run_dir / BEST_CHECKPOINT), "config_sha256": file_sha256(run_dir / CONFIG_FILE)}


def model_digest(run_dir: Path) -> str | None:
    """sha256 of the validation-selected model's weights (each tensor's name, dtype, shape and bytes, in the
    state's order), or ``None`` without that checkpoint: equal for two runs that trained the same model, whatever
    else the checkpoint records."""
    path = run_dir / BEST_CHECKPOINT
    if not path.is_file():
        return None
    import torch

    state = load_checkpoint(path, "train the run again or restore the file from a backup", map_location="cpu")["model"]
    digest = hashlib.sha256()
    for name, tensor in state.items():
        value = torch.as_tensor(tensor).detach().contiguous()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return digest.hexdigest()


def require_run_dir(run_dir: Path) -> dict[str, Any]:
    """The run record of an existing run directory, or a one-line user error."""
    if not run_dir.is_dir():
        raise UserInputError(f"run directory {run_dir} does not exist")
    if not (run_dir / RUN_FILE).is_file() or not (run_dir / CONFIG_FILE).is_file():
        raise UserInputError(f"{run_dir} is not a dmlbench run directory (no {RUN_FILE} or {CONFIG_FILE})")
    return read_run_record(run_dir)


def read_run_record(run_dir: Path) -> dict[str, Any]:
    """``run.json`` of ``run_dir``, or one line naming it when it is damaged (cut short, not JSON): it is
    written atomically, so only a damaged copy or disk gets there."""
    path = run_dir / RUN_FILE
    try:
        return read_json(path)
    except (UnicodeDecodeError, ValueError) as error:
        raise UserInputError(f"{path} is damaged ({error}); restore it from a copy, or delete {run_dir} to train "
                             "the run again") from None


class Clock:
    """A run's cost in this process: wall and CPU time since it started, added to what earlier
    (interrupted) sessions of the run recorded."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def cost(self, run_dir: Path, previous: dict[str, Any] | None = None) -> dict[str, Any]:
        """``wall_seconds``, ``cpu_seconds`` (``time.process_time``: every thread of this process),
        ``peak_memory_kib`` (``getrusage(RUSAGE_SELF).ru_maxrss``: the process's peak resident set,
        KiB on Linux) and ``samples_seen`` (training images of the epochs in ``metrics.jsonl``)."""
        previous = previous or {}
        return {
            "wall_seconds": round(previous.get("wall_seconds", 0.0) + time.perf_counter() - self.wall, 3),
            "cpu_seconds": round(previous.get("cpu_seconds", 0.0) + time.process_time() - self.cpu, 3),
            "peak_memory_kib": max(int(previous.get("peak_memory_kib", 0)), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss),
            "samples_seen": sum(int(entry.get("samples", 0)) for entry in read_metrics(run_dir)),
        }
