"""Where a worker process trains: its device and its torch threads (``Placement``), a value created once
per worker and passed to what trains, embeds or records the machine; nothing here is module state.

``training.device: auto`` is CUDA when present, else the CPU. Worker k of ``benchmark --jobs`` trains on
``cuda:(k mod GPUs)`` where the device is ``auto`` or ``cuda`` (``cuda:N`` stays); a process that is no
such worker (``train``, a benchmark of one process, a torchrun rank) keeps ``cuda`` without an index.
``training.num_threads: auto`` is the count a benchmark recorded when it started (a run's last digits
depend on its thread count, so a resumed benchmark keeps it), else ``OMP_NUM_THREADS``, else the
worker's share of the cores (``threads.auto_threads``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from dmlbench.errors import UserInputError
from dmlbench.training.threads import AUTO, auto_threads


@dataclass(frozen=True)
class Placement:
    """One worker process's place on its machine: ``worker``, its index among the local workers of
    ``benchmark --jobs`` (``None``: no such worker; 0: the process the user started); ``workers``, how many
    of them share the cores; ``recorded_threads``, the threads a benchmark recorded for ``auto`` (``None``:
    not recorded)."""

    worker: int | None = None
    workers: int = 1
    recorded_threads: int | None = None

    @property
    def spawned(self) -> bool:
        """Whether this is a worker the command started beside the process the user started (worker 0)."""
        return bool(self.worker)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")

    def device(self, setting: str) -> torch.device:
        """The device ``training.device`` ``setting`` is for this worker (``resolve_device``)."""
        return resolve_device(setting, self.worker)

    def threads(self, setting: int | str) -> int:
        """The torch threads ``training.num_threads`` ``setting`` is for this worker."""
        if setting != AUTO:
            return int(setting)
        return self.recorded_threads or auto_threads(self.workers)

    def with_recorded_threads(self, count: int | None) -> Placement:
        """This placement with ``auto`` pinned to ``count`` threads (a benchmark's recorded count)."""
        return replace(self, recorded_threads=count)


STANDALONE = Placement()  # a process that is no benchmark worker: ``train``, ``evaluate``, the Python API


def resolve_device(device: str, worker: int | None = None) -> torch.device:
    """``auto`` is CUDA when present, else the CPU; a device this machine lacks is a user error. A CUDA
    device is set up for repeatable IEEE float32 first (``reproducible_cuda``). For local worker
    ``worker`` ``auto`` or ``cuda`` is ``cuda:(worker mod GPUs)``; ``cuda:N`` stays."""
    resolved = _unassigned(device)
    if resolved.type == "cuda":
        reproducible_cuda()
        if resolved.index is None and worker is not None:
            resolved = _spread(worker)
            # torch's current device too: what names no index (the bf16 check, a library's "cuda") and the
            # process's CUDA context then stay on this worker's GPU instead of piling onto cuda:0.
            torch.cuda.set_device(resolved)
    return resolved


def worker_devices(device: str, workers: int) -> list[torch.device]:
    """The device each of ``workers`` local workers (worker 0 first) trains on for ``training.device`` ``device``."""
    resolved = _unassigned(device)
    spread = resolved.type == "cuda" and resolved.index is None
    return [_spread(index) if spread else resolved for index in range(workers)]


def worker_gpus(device: str) -> int:
    """The GPUs local workers of ``training.device`` ``device`` spread over: the visible ones for ``auto`` or
    ``cuda``, one for ``cuda:N``, none off CUDA."""
    resolved = _unassigned(device)
    if resolved.type != "cuda":
        return 0
    return 1 if resolved.index is not None else torch.cuda.device_count()


def _spread(worker: int) -> torch.device:
    """Worker ``worker``'s GPU: the workers take the visible GPUs in turn."""
    return torch.device("cuda", worker % torch.cuda.device_count())


def _unassigned(device: str) -> torch.device:
    """``device`` on this machine, before any worker's share of the GPUs: ``cuda`` without an index for ``auto``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else _available(device)


def _available(device: str) -> torch.device:
    """The named device, when this machine has it (else a one-line ``UserInputError``)."""
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise UserInputError(f"training.device={device!r} is not a device (auto, cpu, cuda, cuda:N or mps)") from None
    if resolved.type == "cuda":
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if available == 0:
            raise UserInputError(f"training.device={device!r}, but this machine has no CUDA device (use cpu or auto)")
        if resolved.index is not None and resolved.index >= available:
            raise UserInputError(f"training.device={device!r}, but this machine has {available} CUDA device(s)")
    elif resolved.type == "mps" and not torch.backends.mps.is_available():
        raise UserInputError(f"training.device={device!r}, but this machine has no MPS device (use cpu or auto)")
    elif resolved.type not in ("cpu", "mps"):
        raise UserInputError(f"training.device={device!r} is not supported (auto, cpu, cuda, cuda:N or mps)")
    return resolved


def reproducible_cuda() -> None:
    """Make this process's CUDA work repeatable and its float32 IEEE float32, as on the CPU: torch's
    deterministic algorithms (an operation without one warns, in one line), cuBLAS with the fixed
    workspace they need (read when cuBLAS first starts, so set before any CUDA work), cuDNN without
    benchmarking, and no TF32: torch's default lets cuDNN round float32 convolution inputs to 10-bit
    mantissas, which moved embeddings by 1e-4 on an H200. ``training.precision=bf16`` is the fast path."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
