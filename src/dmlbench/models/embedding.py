"""The embedding head and the full model: trunk -> [LayerNorm] -> linear -> [L2 normalisation].

``build`` options shared by every trunk: frozen BatchNorm, binarised evaluation output, and an
ensemble of several trunks (DREML with one network per learner, seed 000 §2.10).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from dmlbench.errors import UserInputError
from dmlbench.models.trunks import build_trunk
from dmlbench.validation import check_positive_int


class EmbeddingHead(nn.Module):
    """Linear projection to the embedding; LayerNorm without affine parameters before it and L2
    normalisation after it are optional. With both and ``bias=False`` it is seed 002's head
    (Zhai & Wu 2019 §3.2 and §4.1: pool5 -> LayerNorm without parameters -> fully connected -> L2)."""

    def __init__(
        self, in_features: int, embedding_dim: int, layer_norm: bool = True, normalize: bool = True, bias: bool = True
    ) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(in_features, elementwise_affine=False) if layer_norm else nn.Identity()
        self.linear = nn.Linear(in_features, embedding_dim, bias=bias)
        self.normalize = normalize

    def forward(self, features: Tensor) -> Tensor:
        embeddings = self.linear(self.norm(features))
        return nn.functional.normalize(embeddings, dim=1) if self.normalize else embeddings


def binarize(embeddings: Tensor) -> Tensor:
    """Sign of every coordinate, scaled by ``1/sqrt(d)`` (seed 002 §3.2 and §4.3, thresholding at 0):
    a unit vector, so Euclidean and cosine rankings are the Hamming ranking of the bits."""
    return torch.sign(embeddings) / math.sqrt(embeddings.shape[1])


def freeze_batchnorm(module: nn.Module) -> None:
    """Keep every BatchNorm of ``module`` in evaluation mode (running statistics frozen) and its
    affine parameters fixed (no gradient): the common DML fine-tuning setting (seeds 001 §4, 003)."""
    for child in module.modules():
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            child.eval()
            child.requires_grad_(False)


class EmbeddingModel(nn.Module):
    """A trunk followed by an ``EmbeddingHead``.

    ``freeze_bn``: the trunk's BatchNorm layers stay in evaluation mode whatever ``train()`` says, with
    their affine parameters fixed. ``binarize_output``: in evaluation mode the embedding is binarised
    (``binarize``); training uses the float embedding.
    """

    def __init__(
        self, trunk: nn.Module, head: EmbeddingHead, *, freeze_bn: bool = False, binarize_output: bool = False
    ) -> None:
        super().__init__()
        self.trunk = trunk
        self.head = head
        self.freeze_bn = freeze_bn
        self.binarize_output = binarize_output
        if freeze_bn:
            freeze_batchnorm(trunk)

    @property
    def embedding_dim(self) -> int:
        return self.head.linear.out_features

    def train(self, mode: bool = True) -> EmbeddingModel:
        super().train(mode)
        if self.freeze_bn:
            freeze_batchnorm(self.trunk)
        return self

    def trunk_modules(self) -> list[nn.Module]:
        return [self.trunk]

    def trunk_parameters(self) -> list[nn.Parameter]:
        return list(self.trunk.parameters())

    def head_parameters(self) -> list[nn.Parameter]:
        return list(self.head.parameters())

    def forward(self, images: Tensor) -> Tensor:
        embeddings = self.head(self.trunk(images))
        return binarize(embeddings) if self.binarize_output and not self.training else embeddings


class EnsembleModel(nn.Module):
    """``members`` embedding models (one trunk and head each) whose embeddings are concatenated:
    DREML's one network per learner (Xuan et al. 2018; seed 000 §2.10). Member ``k`` owns chunk
    ``k`` of the embedding, the chunk the ``dreml`` loss gives to learner ``k``."""

    def __init__(self, members: list[EmbeddingModel], *, binarize_output: bool = False) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)
        self.binarize_output = binarize_output

    @property
    def embedding_dim(self) -> int:
        return sum(member.embedding_dim for member in self.members)

    def trunk_modules(self) -> list[nn.Module]:
        return [member.trunk for member in self.members]

    def trunk_parameters(self) -> list[nn.Parameter]:
        return [parameter for member in self.members for parameter in member.trunk_parameters()]

    def head_parameters(self) -> list[nn.Parameter]:
        return [parameter for member in self.members for parameter in member.head_parameters()]

    def forward(self, images: Tensor) -> Tensor:
        embeddings = torch.cat([member(images) for member in self.members], dim=1)
        return binarize(embeddings) if self.binarize_output and not self.training else embeddings


def build(
    trunk: str = "small_cnn",
    *,
    embedding_dim: int = 128,
    layer_norm: bool = True,
    normalize: bool = True,
    bias: bool = True,
    freeze_bn: bool = False,
    binarize_output: bool = False,
    ensemble: int = 1,
    seed: int | None = None,
    **trunk_options: Any,
) -> EmbeddingModel | EnsembleModel:
    """Build ``trunk`` with a head; with ``seed``, initialisation is reproducible and leaves the
    global random state as it was. ``ensemble`` > 1 builds that many independently initialised
    trunk + head pairs with ``embedding_dim / ensemble`` dimensions each, concatenated."""
    check_positive_int("embedding_dim", embedding_dim)
    check_positive_int("ensemble", ensemble)
    if embedding_dim % ensemble:
        raise UserInputError(f"model.embedding_dim={embedding_dim} is not divisible by model.ensemble={ensemble}")

    def member(dim: int) -> EmbeddingModel:
        network, feature_dim = build_trunk(trunk, **trunk_options)
        head = EmbeddingHead(feature_dim, dim, layer_norm, normalize, bias)
        return EmbeddingModel(network, head, freeze_bn=freeze_bn, binarize_output=binarize_output and ensemble == 1)

    def construct() -> EmbeddingModel | EnsembleModel:
        if ensemble == 1:
            return member(embedding_dim)
        return EnsembleModel([member(embedding_dim // ensemble) for _ in range(ensemble)], binarize_output=binarize_output)

    if seed is None:
        return construct()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return construct()
