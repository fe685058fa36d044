"""DREML (Xuan et al. 2018): an ensemble of learners, each trained on a random meta-class partition."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dmlbench.errors import UserInputError
from dmlbench.losses.base import LOSSES, build
from dmlbench.losses.proxies import ClassLoss, check_num_classes
from dmlbench.registry import accepted_parameters
from dmlbench.validation import check_flag, check_positive_int, check_seed


def random_meta_class_partitions(num_classes: int, num_learners: int, num_meta_classes: int, seed: int) -> Tensor:
    """``[num_learners, num_classes]`` meta-class id of every class for every learner.

    Each learner shuffles the classes (from ``seed``) and deals them round-robin into the meta-classes,
    so meta-class sizes differ by at most one and none is empty.
    """
    generator = torch.Generator().manual_seed(seed)
    dealt = torch.arange(num_classes) % num_meta_classes
    partitions = torch.empty(num_learners, num_classes, dtype=torch.long)
    for learner in range(num_learners):
        partitions[learner, torch.randperm(num_classes, generator=generator)] = dealt
    return partitions


def normalize_each_chunk(embeddings: Tensor, num_learners: int) -> Tensor:
    """L2-normalise each learner's chunk of a concatenated ``[b, num_learners * d]`` embedding."""
    chunks = embeddings.reshape(len(embeddings), num_learners, -1)
    return F.normalize(chunks, dim=2).reshape(embeddings.shape)


@LOSSES.register("dreml")
class DREMLLoss(ClassLoss):
    """DREML ensemble, Fehervari et al. 2019 sec. 2.10 and 4.1 (Xuan et al. 2018).

    ``num_learners`` (L) learners, each with its own random partition of the ``num_classes``
    classes into ``num_meta_classes`` (D) meta-classes drawn from ``seed``. The model returns one
    concatenated embedding; learner k owns chunk k (``embedding_dim / num_learners`` dimensions),
    i.e. one head chunk per learner on a shared trunk instead of L separate networks. Chunk k,
    L2-normalised when ``normalize_chunks`` (each learner's embedding is a unit vector, as from its
    own head), is trained with its own ``base`` loss on its meta-class labels; the loss is the mean
    over learners. Defaults as seed 000: NCA loss (``proxy_nca``), L = 12, D = 12 (with
    ``embedding_dim`` 144). ``base_hparams`` go to every base loss; a base with a ``seed`` gets
    ``seed + 1 + k`` for learner k. Evaluate the concatenated embedding (``normalize_each_chunk`` gives
    the per-learner geometry the learners were trained in).
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        base: str = "proxy_nca",
        num_learners: int = 12,
        num_meta_classes: int = 12,
        seed: int = 0,
        base_hparams: dict[str, Any] | None = None,
        normalize_chunks: bool = True,
    ) -> None:
        super().__init__(num_classes, embedding_dim)
        self.num_learners = check_positive_int("num_learners", num_learners)
        check_num_classes(num_meta_classes, "num_meta_classes")
        if num_meta_classes > num_classes:
            raise UserInputError(
                f"num_meta_classes ({num_meta_classes}) must not exceed num_classes ({num_classes})"
            )
        self.num_meta_classes = num_meta_classes
        if embedding_dim % num_learners:
            raise UserInputError(
                f"embedding_dim ({embedding_dim}) must be divisible by num_learners ({num_learners})"
            )
        self.normalize_chunks = check_flag("normalize_chunks", normalize_chunks)
        check_seed(seed)
        if base == "dreml":
            raise UserInputError("base must be a loss other than 'dreml'")
        base_hparams = dict(base_hparams or {})
        if "seed" in base_hparams:
            raise UserInputError("base_hparams must not contain 'seed'; set DREML's seed instead")
        if {"num_classes", "embedding_dim"} & set(base_hparams):
            raise UserInputError("base_hparams must not contain num_classes or embedding_dim; DREML sets them")
        takes_seed = "seed" in (accepted_parameters(LOSSES.get(base)) or set())
        self.learners = nn.ModuleList(
            build(
                base,
                num_classes=num_meta_classes,
                embedding_dim=embedding_dim // num_learners,
                **base_hparams,
                **({"seed": seed + 1 + learner} if takes_seed else {}),
            )
            for learner in range(num_learners)
        )
        partitions = random_meta_class_partitions(num_classes, num_learners, num_meta_classes, seed)
        self.register_buffer("partitions", partitions)

    def class_loss(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        if self.normalize_chunks:
            embeddings = normalize_each_chunk(embeddings, self.num_learners)
        chunks = embeddings.chunk(self.num_learners, dim=1)
        meta_labels = self.partitions[:, labels]
        # Mined tuples refer to the original labels, not to a learner's meta-classes: not passed on.
        losses = [learner(chunk, meta) for learner, chunk, meta in zip(self.learners, chunks, meta_labels)]
        return torch.stack(losses).mean()
