"""What a run directory records; every file is written atomically (``dmlbench.files``)."""

from __future__ import annotations

import json
import platform
import re
import resource
import subprocess
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from dmlbench.errors import UserInputError
from dmlbench.files import atomic_write, signals_deferred

CONFIG_FILE = "config.yaml"
RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
LAST_CHECKPOINT = "checkpoint_last.pt"
BEST_CHECKPOINT = "checkpoint_best.pt"
TEST_METRICS_FILE = "test_metrics.json"

RECORDED_PACKAGES = ("dmlbench", "torch", "torchvision", "numpy", "scipy", "scikit-learn", "faiss-cpu")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def atomic_write_text(path: Path, text: str) -> None:
    data = text.encode()
    atomic_write(path, lambda stream: stream.write(data))


def write_json(path: Path, payload: Any) -> None:
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=False) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def atomic_torch_save(path: Path, payload: Any) -> None:
    atomic_write(path, lambda stream: torch.save(payload, stream))


def git_commit() -> str | None:
    """The commit of the dmlbench source tree, with ``+dirty`` if the package's own files have
    uncommitted changes (edits elsewhere in the checkout, e.g. committed reports, change no result)."""
    source = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "."],
            cwd=source, capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for package in RECORDED_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def environment(device: str | None = None) -> dict[str, Any]:
    """Where a number was computed, for what the same config reproduces to the digit only on: the
    device, the CPU model and the instruction-set level torch dispatches to, the torch build, its
    BLAS and oneDNN, and the thread count in use."""
    import torch.backends.cpu

    build = torch.__config__.show()
    return {
        "device": device or "cpu",
        "device_name": torch.cuda.get_device_name(torch.device(device)) if device and device.startswith("cuda") else None,
        "cpu_model": _cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
        "torch_build": {"version": torch.__version__, "git": torch.version.git_version, "cuda": torch.version.cuda,
                        "debug": torch.version.debug},
        "blas": _build_setting(build, "BLAS_INFO"),
        "onednn": next((line.strip(" -") for line in build.splitlines() if "MKL-DNN" in line or "oneDNN" in line), None),
        "num_threads": torch.get_num_threads(),
    }


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _build_setting(build: str, key: str) -> str | None:
    found = re.search(rf"\b{key}=([^,\s]+)", build)
    return found.group(1) if found else None


def create_run_dir(run_dir: Path) -> None:
    """Create a new run directory, or fail with one line naming it (read-only parent, a file in the way)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserInputError(f"cannot create run directory {run_dir}: {error.strerror or error}") from None


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


def require_run_dir(run_dir: Path) -> dict[str, Any]:
    """The run record of an existing run directory, or a one-line user error."""
    if not run_dir.is_dir():
        raise UserInputError(f"run directory {run_dir} does not exist")
    if not (run_dir / RUN_FILE).is_file() or not (run_dir / CONFIG_FILE).is_file():
        raise UserInputError(f"{run_dir} is not a dmlbench run directory (no {RUN_FILE} or {CONFIG_FILE})")
    return read_json(run_dir / RUN_FILE)


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
