"""Embedding a dataset in evaluation mode."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dmlbench.data.base import ImageDataset
from dmlbench.errors import UserInputError


def resolve_device(device: str) -> torch.device:
    """``auto`` is CUDA when present, else the CPU; a device this machine lacks is a user error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
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
