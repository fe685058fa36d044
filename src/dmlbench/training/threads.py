"""The cores a process may use and ``auto``'s share of them for each of a machine's worker processes
(``training.num_threads: auto``); ``placement.Placement.threads`` applies them to one worker."""

from __future__ import annotations

import math
import os
from pathlib import Path

AUTO = "auto"

def auto_threads(processes: int) -> int:
    """What ``auto`` gives each of ``processes`` workers of this machine: ``OMP_NUM_THREADS``, else their share."""
    return pinned_threads() or max(1, available_cores() // max(1, processes))


def available_cores() -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup CPU quota (containers, SLURM)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        cores = os.cpu_count() or 1
    quota = cgroup_quota(CGROUP_ROOT)
    return max(1, min(cores, quota) if quota else cores)


CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_quota(root: Path) -> int | None:
    """Whole cores allowed by the cgroup under ``root`` (v2 ``cpu.max``, else v1 ``cfs_quota_us``),
    rounded up; ``None`` if unlimited or unknown."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return max(1, math.ceil(quota_us / period_us)) if quota_us > 0 and period_us > 0 else None


def pinned_threads() -> int | None:
    """``OMP_NUM_THREADS`` when the environment sets it to a positive number, else ``None``."""
    pinned = os.environ.get("OMP_NUM_THREADS", "")
    return int(pinned) if pinned.isdigit() and int(pinned) >= 1 else None
