"""Trunks and the embedding head; ``build`` makes an ``EmbeddingModel`` from names."""

from dmlbench.models.embedding import EmbeddingHead, EmbeddingModel, build
from dmlbench.models.trunks import TRUNKS

__all__ = ["TRUNKS", "EmbeddingHead", "EmbeddingModel", "build"]
