"""Provenance of a number: when, from which source commit, with which packages, on which machine."""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

RECORDED_PACKAGES = ("dmlbench", "torch", "torchvision", "numpy", "scipy", "scikit-learn", "faiss-cpu")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def default_output(kind: str) -> Path:
    """Where a command writes without ``-o``: ``runs/<kind>-<local time>`` (``runs/benchmark-20261206-095409``)."""
    return Path("runs") / f"{kind}-{datetime.now():%Y%m%d-%H%M%S}"


@functools.cache
def git_commit() -> str | None:
    """The commit of the dmlbench source tree, with ``+dirty`` if the package's own files have
    uncommitted changes (edits elsewhere in the checkout, e.g. committed reports, change no result).

    Read once per process, at the first call (a benchmark's worker calls it as it starts): a worker
    that trains for hours while the checkout moves on (new commits, edits) runs the code it imported,
    so its records name that commit, not the checkout's later one."""
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
    """The versions of Python and of ``RECORDED_PACKAGES``, read once per process like ``git_commit``
    (an upgrade installed while a worker runs does not change the code it imported)."""
    return dict(_installed_versions())


@functools.cache
def _installed_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for package in RECORDED_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def environment(device: str) -> dict[str, Any]:
    """Where a number was computed, for what the same config reproduces to the digit only on: the
    device (as torch names it: ``cpu``, ``cuda``, ``cuda:1``), the CPU model and the instruction-set
    level torch dispatches to, the torch build, its BLAS and oneDNN, and the thread count in use."""
    import torch.backends.cpu

    build = torch.__config__.show()
    return {
        "device": device,
        "device_name": torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else None,
        "cpu_model": _cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
        "torch_build": {"version": torch.__version__, "git": torch.version.git_version, "cuda": torch.version.cuda,
                        "debug": torch.version.debug},
        "blas": _build_setting(build, "BLAS_INFO"),
        "onednn": next((line.strip(" -") for line in build.splitlines() if "MKL-DNN" in line or "oneDNN" in line), None),
        "num_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
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
