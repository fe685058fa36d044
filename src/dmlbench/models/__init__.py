"""Trunks and the embedding head; ``build`` makes an ``EmbeddingModel`` (or an ``EnsembleModel``) from names."""

from dmlbench.models.embedding import EmbeddingHead, EmbeddingModel, EnsembleModel, build
from dmlbench.models.trunks import TRUNKS, build_trunk, trunk_constructor

__all__ = ["TRUNKS", "EmbeddingHead", "EmbeddingModel", "EnsembleModel", "build", "build_trunk", "trunk_constructor"]
