"""Embedding a dataset in evaluation mode."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dmlbench.data.base import ImageDataset

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
