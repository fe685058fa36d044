"""Data-parallel training over processes started by ``torchrun`` (DistributedDataParallel).

The configured batch is the *global* batch: each rank embeds its contiguous slice of it (see
``sampling.base``), the slices are all-gathered so that the miner and the loss see exactly the batch
one process would see, and each rank back-propagates into its own slice only. Every rank computes
the same loss from the same gathered batch, so the gradient of rank ``r``'s slice is
``dL/de_r``; DistributedDataParallel *averages* parameter gradients over the ranks, so the gather's
backward multiplies the local slice's gradient by ``world_size`` and the average becomes the sum
``sum_r dL/de_r * de_r/dtheta``, the single-process gradient. The loss's own parameters (proxies)
see the whole gathered batch on every rank and get the full gradient there without communication.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from dmlbench.data.base import ImageDataset
from dmlbench.errors import UserInputError


@dataclass(frozen=True)
class ProcessGroup:
    """This process's place in the job: ``world_size`` 1 is plain single-process training."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def current() -> ProcessGroup:
    """The process group ``torch.distributed`` was initialised with, or the single process."""
    if not (dist.is_available() and dist.is_initialized()):
        return ProcessGroup()
    return ProcessGroup(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", dist.get_rank())))


def launch_record(group: ProcessGroup) -> dict[str, Any]:
    """How this run's processes were started, for ``run.json``: the collective ``backend`` (``nccl``,
    ``gloo``; ``None`` for one process), the ``world_size`` and, in a SLURM job, its ``slurm_job_id``."""
    record: dict[str, Any] = {"backend": str(dist.get_backend()) if group.enabled else None, "world_size": group.world_size}
    if "SLURM_JOB_ID" in os.environ:
        record["slurm_job_id"] = os.environ["SLURM_JOB_ID"]
    return record


def init_from_environment(device: str) -> bool:
    """Join the job ``torchrun`` describes in the environment (``WORLD_SIZE`` > 1): NCCL when the run
    trains on CUDA, gloo otherwise. Returns whether a process group was created here."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1 or dist.is_initialized():
        return False
    cuda = (device == "auto" and torch.cuda.is_available()) or device.startswith("cuda")
    if cuda:
        local_rank, available = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
        if local_rank >= available:  # each process trains on the GPU of its local rank
            raise UserInputError(
                f"training.device={device}: this node runs {os.environ.get('LOCAL_WORLD_SIZE', local_rank + 1)} "
                f"processes but has {available} CUDA device(s); start at most {available} per node "
                f"(torchrun --nproc_per_node={available}) or train on the CPU (training.device=cpu)")
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    return True


class _GatherWithLocalGradient(torch.autograd.Function):
    """All-gather equal-sized slices along dim 0; the backward keeps the local slice's gradient,
    times ``world_size`` (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, local: Tensor, rank: int, world_size: int) -> Tensor:
        ctx.rank, ctx.world_size, ctx.size = rank, world_size, local.shape[0]
        parts = [torch.empty_like(local) for _ in range(world_size)]
        dist.all_gather(parts, local.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        start = ctx.rank * ctx.size
        return grad[start : start + ctx.size] * ctx.world_size, None, None


def gather(local: Tensor, group: ProcessGroup) -> Tensor:
    """The global batch from every rank's equal-sized slice, in rank order; differentiable for the local slice."""
    if not group.enabled:
        return local
    if local.requires_grad:
        return _GatherWithLocalGradient.apply(local, group.rank, group.world_size)
    parts = [torch.empty_like(local) for _ in range(group.world_size)]
    dist.all_gather(parts, local.contiguous())
    return torch.cat(parts)


def _communication_device() -> torch.device:
    """NCCL moves CUDA tensors only; gloo moves CPU tensors."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_uneven(local: Tensor, group: ProcessGroup) -> Tensor:
    """Concatenate slices of different lengths in rank order (no padding rows remain); on ``local``'s device."""
    if not group.enabled:
        return local
    device = _communication_device()
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(group.world_size)]
    dist.all_gather(sizes, torch.tensor([local.shape[0]], dtype=torch.int64, device=device))
    longest = int(max(size.item() for size in sizes))
    padded = torch.zeros((longest, *local.shape[1:]), dtype=local.dtype, device=device)
    padded[: local.shape[0]] = local.to(device)
    parts = [torch.empty_like(padded) for _ in range(group.world_size)]
    dist.all_gather(parts, padded)
    return torch.cat([part[: int(size.item())] for part, size in zip(parts, sizes)]).to(local.device)


def shard_range(length: int, group: ProcessGroup) -> range:
    """This rank's contiguous share of ``range(length)``; shares differ in size by at most one."""
    start = length * group.rank // group.world_size
    return range(start, length * (group.rank + 1) // group.world_size)


def embed_sharded(
    embed: Callable[..., tuple[Tensor, Tensor]], model: torch.nn.Module, dataset: ImageDataset,
    batch_size: int, device: torch.device, group: ProcessGroup,
) -> tuple[Tensor, Tensor]:
    """Every item's embedding and label, each rank embedding its share once (CPU tensors on every rank)."""
    if not group.enabled:
        return embed(model, dataset, batch_size, device)
    embeddings, labels = embed(model, dataset.subset(list(shard_range(len(dataset), group))), batch_size, device)
    return gather_uneven(embeddings, group), gather_uneven(labels, group)


def broadcast(value: Any, group: ProcessGroup) -> Any:
    """Rank 0's ``value`` on every rank (a picklable object, pickled as ``broadcast_object_list`` does).

    Written out rather than ``broadcast_object_list`` so that its tensors stay here until the
    collective's worker lets go of them (``_released``): this is the last collective a run's ranks
    make, just before a rank's interpreter exits."""
    if not group.enabled:
        return value
    device = _communication_device()
    payload = pickle.dumps(value) if group.is_main else b""
    size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    data = (torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device) if group.is_main
            else torch.empty(int(size.item()), dtype=torch.uint8, device=device))
    dist.broadcast(data, src=0)
    _released([size, data])
    return value if group.is_main else pickle.loads(data.cpu().numpy().tobytes())


def _released(tensors: list[Tensor], patience: float = 5.0) -> None:
    """Wait (at most ``patience`` seconds) until gloo's worker thread has dropped its references to
    ``tensors``. It drops them just after the collective completes; were this thread's references gone
    first, the worker would free the tensors' Python objects, which needs the GIL, and a thread that
    asks for the GIL while the interpreter exits ends the process with SIGABRT ("terminate called
    without an active exception"; 4 of 95 two-rank trainings on the CPU). Freed here, they never are
    there. NCCL's work objects are kept by its watchdog thread: not waited for (unmeasured)."""
    if dist.get_backend() != "gloo":
        return
    deadline = time.monotonic() + patience
    while any(tensor._use_count() > 1 for tensor in tensors) and time.monotonic() < deadline:
        time.sleep(0)  # lets the worker take the GIL if it waits for it


def check_batch(batch_size: int, group: ProcessGroup) -> None:
    """The global batch must split into equal slices of at least one image per rank."""
    if group.enabled and (batch_size < group.world_size or batch_size % group.world_size):
        raise UserInputError(
            f"training.batch_size={batch_size} cannot be split evenly over {group.world_size} processes "
            f"(--nproc_per_node): use a batch size divisible by {group.world_size} or fewer processes"
        )
