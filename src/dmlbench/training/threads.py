"""How many torch threads a run uses: ``training.num_threads: auto`` gives each worker process its
share of the cores this process may run on, or, in a benchmark, the count the benchmark started with
(``pinned_auto_threads``): a run's last digits depend on its thread count, so a benchmark resumed with
another ``--jobs`` must not change it."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

AUTO = "auto"

_processes = 1
_benchmark_threads: int | None = None


def share_cores(processes: int) -> None:
    """Record that ``processes`` worker processes of this machine (``benchmark --jobs``) share its cores."""
    global _processes
    _processes = max(1, processes)


def auto_threads(processes: int) -> int:
    """What ``auto`` gives each of ``processes`` workers of this machine: ``OMP_NUM_THREADS``, else their share."""
    return pinned_threads() or max(1, available_cores() // max(1, processes))


@contextmanager
def pinned_auto_threads(count: int | None) -> Iterator[None]:
    """Within the block, ``auto`` is ``count`` threads (``None``: not pinned): the threads a benchmark
    recorded when it started, whatever ``--jobs`` or ``OMP_NUM_THREADS`` a resumed worker has."""
    global _benchmark_threads
    previous, _benchmark_threads = _benchmark_threads, count
    try:
        yield
    finally:
        _benchmark_threads = previous


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


def resolve_threads(setting: int | str) -> int:
    """Threads for ``training.num_threads``: a number as given; ``auto`` is the benchmark's recorded count
    inside ``pinned_auto_threads``, else ``OMP_NUM_THREADS`` when the environment sets it (the usual way a
    scheduler or a user pins threads), else this worker's share of the available cores."""
    if setting != AUTO:
        return int(setting)
    return _benchmark_threads or auto_threads(_processes)


def pinned_threads() -> int | None:
    """``OMP_NUM_THREADS`` when the environment sets it to a positive number, else ``None``."""
    pinned = os.environ.get("OMP_NUM_THREADS", "")
    return int(pinned) if pinned.isdigit() and int(pinned) >= 1 else None
