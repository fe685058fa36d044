"""Normalised softmax (Zhai & Wu 2019) and the cosine-softmax core that CosFace and ArcFace share."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from dmlbench.errors import UserInputError
from dmlbench.losses.base import LOSSES
from dmlbench.losses.proxies import ClassLoss, unit_weights
from dmlbench.validation import check_positive


def check_subsample_ratio(ratio: float) -> float:
    check_positive("class_subsample_ratio", ratio)
    if ratio > 1:
        raise UserInputError(f"class_subsample_ratio must lie in (0, 1], got {ratio!r}")
    return ratio


class CosineSoftmaxLoss(ClassLoss):
    """Cross-entropy over ``scale * cos(phi_i, w_c)`` with L2-normalised class weights ``w_c``.

    Subclasses change the target logit (``target_cosine``): identity for the normalised softmax, an
    additive cosine margin for CosFace, an additive angular margin for ArcFace. Embeddings are
    normalised here (any embeddings are accepted). Mean over the batch.

    With ``class_subsample_ratio < 1`` (seed 002 sec. 4.5) each training forward puts only
    ``ceil(ratio * num_classes)`` classes in the softmax denominator (more if the batch has more):
    every class of the batch plus a uniform random subset of the others, drawn from the loss's own
    generator (seeded by ``seed``, saved in ``state_dict`` so a resumed run draws the same subsets).
    In eval mode all classes are used.
    """

    def __init__(
        self, num_classes: int, embedding_dim: int, scale: float, class_subsample_ratio: float, seed: int
    ) -> None:
        super().__init__(num_classes, embedding_dim)
        self.scale = scale
        self.class_subsample_ratio = check_subsample_ratio(class_subsample_ratio)
        self.weights = self.class_weights(seed)
        self.subsample_generator = torch.Generator().manual_seed(seed)

    def target_cosine(self, cosine: Tensor) -> Tensor:
        """The logit (before ``scale``) of each sample's own class, given its cosine."""
        return cosine

    def class_loss(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        weights, targets = self.weights, labels
        if self.training and self.class_subsample_ratio < 1:
            classes = self.sample_classes(labels)
            weights, targets = weights[classes], torch.searchsorted(classes, labels)
        cosine = F.normalize(embeddings, dim=1) @ unit_weights(weights, embeddings.dtype).T
        own = targets.unsqueeze(1)
        logits = cosine.scatter(1, own, self.target_cosine(cosine.gather(1, own)))
        return F.cross_entropy(self.scale * logits, targets)

    def sample_classes(self, labels: Tensor) -> Tensor:
        """Sorted class ids of the softmax denominator: the batch's classes plus random others."""
        in_batch = torch.zeros(self.num_classes, dtype=torch.bool)
        in_batch[labels.cpu()] = True
        others = (~in_batch).nonzero().squeeze(1)
        wanted = math.ceil(self.class_subsample_ratio * self.num_classes)
        extra = max(0, min(wanted - int(in_batch.sum()), len(others)))
        drawn = others[torch.randperm(len(others), generator=self.subsample_generator)[:extra]]
        in_batch[drawn] = True
        return in_batch.nonzero().squeeze(1).to(labels.device)

    def get_extra_state(self) -> dict[str, Any]:
        return {"subsample_generator": self.subsample_generator.get_state()}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.subsample_generator.set_state(state["subsample_generator"])


@LOSSES.register("normalized_softmax")
class NormalizedSoftmaxLoss(CosineSoftmaxLoss):
    """Normalised softmax, Zhai & Wu 2019 eq. 1 (Roth et al. 2020 supp. eq. 19).

    ``L = -1/b sum_i log(exp(phi_i^T w_{y_i} / T) / sum_{c in Z} exp(phi_i^T w_c / T))`` with
    normalised embeddings and class weights and temperature T = 0.05. The denominator includes the
    own class as in seed 002 eq. 1 (004 eq. 19 prints it without, and without the 1/b; the original
    paper's cross-entropy is followed). ``class_subsample_ratio``: seed 002 sec. 4.5, see
    ``CosineSoftmaxLoss``. The LayerNorm before the embedding layer belongs to the model head.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        temperature: float = 0.05,
        class_subsample_ratio: float = 1.0,
        seed: int = 0,
    ) -> None:
        check_positive("temperature", temperature)
        super().__init__(num_classes, embedding_dim, 1.0 / temperature, class_subsample_ratio, seed)
        self.temperature = temperature
