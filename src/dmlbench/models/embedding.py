"""The embedding head and the full model: trunk -> [LayerNorm] -> linear -> [L2 normalisation]."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from dmlbench.models.trunks import TRUNKS
from dmlbench.validation import check_positive_int


class EmbeddingHead(nn.Module):
    """Linear projection to the embedding; LayerNorm without affine parameters before it (Zhai & Wu
    2019, seed 002 §3.2) and L2 normalisation after it are both optional."""

    def __init__(self, in_features: int, embedding_dim: int, layer_norm: bool = True, normalize: bool = True) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(in_features, elementwise_affine=False) if layer_norm else nn.Identity()
        self.linear = nn.Linear(in_features, embedding_dim)
        self.normalize = normalize

    def forward(self, features: Tensor) -> Tensor:
        embeddings = self.linear(self.norm(features))
        return nn.functional.normalize(embeddings, dim=1) if self.normalize else embeddings


class EmbeddingModel(nn.Module):
    """A trunk followed by an ``EmbeddingHead``."""

    def __init__(self, trunk: nn.Module, head: EmbeddingHead) -> None:
        super().__init__()
        self.trunk = trunk
        self.head = head

    @property
    def embedding_dim(self) -> int:
        return self.head.linear.out_features

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.trunk(images))


def build(
    trunk: str = "small_cnn",
    *,
    embedding_dim: int = 128,
    layer_norm: bool = True,
    normalize: bool = True,
    seed: int | None = None,
    **trunk_options: Any,
) -> EmbeddingModel:
    """Build ``trunk`` with a head; with ``seed``, initialisation is reproducible and leaves the
    global random state as it was."""
    check_positive_int("embedding_dim", embedding_dim)

    def construct() -> EmbeddingModel:
        network, feature_dim = TRUNKS.build(trunk, **trunk_options)
        return EmbeddingModel(network, EmbeddingHead(feature_dim, embedding_dim, layer_norm, normalize))

    if seed is None:
        return construct()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return construct()
