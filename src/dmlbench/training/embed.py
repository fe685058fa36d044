"""Embedding a dataset in evaluation mode, and the device a process trains on (``resolve_device``)."""

from __future__ import annotations

import os

import torch
from torch import Tensor, nn

from dmlbench.data.base import ImageDataset
from dmlbench.errors import UserInputError

_worker: int | None = None  # this process's index among a benchmark's local workers (``set_worker``)


def set_worker(index: int | None) -> None:
    """Make this process worker ``index`` of ``benchmark --jobs`` (``None``: none of them), for ``resolve_device``."""
    global _worker
    _worker = index


def resolve_device(device: str) -> torch.device:
    """``auto`` is CUDA when present, else the CPU; a device this machine lacks is a user error. A CUDA
    device is set up for repeatable IEEE float32 first (``reproducible_cuda``). In worker k of
    ``benchmark --jobs`` (``set_worker``) ``auto`` or ``cuda`` is ``cuda:(k mod GPUs)``; ``cuda:N`` stays."""
    resolved = _unassigned(device)
    if resolved.type == "cuda":
        reproducible_cuda()
        if resolved.index is None and _worker is not None:
            resolved = _spread(_worker)
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


@torch.no_grad()
def embed(model: nn.Module, dataset: ImageDataset, batch_size: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Embeddings (float32, CPU) and labels of every item of ``dataset`` in order; restores the model's mode."""
    was_training = model.training
    model.eval()
    embeddings, labels = [], []
    for start in range(0, len(dataset), batch_size):
        images, batch_labels, _ = dataset.batch(range(start, min(start + batch_size, len(dataset))))
        embeddings.append(model(images.to(device)).float().cpu())
        labels.append(batch_labels)
    model.train(was_training)
    return torch.cat(embeddings), torch.cat(labels)
