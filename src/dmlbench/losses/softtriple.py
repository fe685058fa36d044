"""SoftTriple loss (Qian et al. 2019): several normalised centres per class, softly assigned."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dmlbench.losses.base import LOSSES
from dmlbench.losses.proxies import ClassLoss, unit_weights
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_non_negative, check_positive, check_positive_int


@LOSSES.register("softtriple")
class SoftTripleLoss(ClassLoss):
    """SoftTriple, Roth et al. 2020 supp. eq. 16-18 (Qian et al. 2019).

    ``S_i^c = sum_k softmax_k(phi_i^T psi_c^k / gamma) phi_i^T psi_c^k`` (eq. 16; the printed
    version drops the factor ``phi_i^T psi``, without which S would always be 1),
    ``L_base = -1/b sum_i log softmax_c(scale * (S_i^c - margin [c = y_i]))_{y_i}`` (eq. 17) and
    ``L = L_base + tau * sum_c sum_{k < l} ||psi_c^k - psi_c^l|| / (C K (K - 1))`` (eq. 18; each
    unordered pair once, as in Qian et al. and Roth et al.'s code; ``||psi - psi'|| = sqrt(2 - 2 psi^T psi')``
    for unit centres). Defaults from 004: ``tau`` = 0.2, ``scale`` (lambda) = 8, ``margin`` (delta)
    = 0.01, ``gamma`` = 0.1, ``centers_per_class`` (K) = 2. Embeddings and centres are normalised here.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        centers_per_class: int = 2,
        scale: float = 8.0,
        gamma: float = 0.1,
        margin: float = 0.01,
        tau: float = 0.2,
        seed: int = 0,
    ) -> None:
        super().__init__(num_classes, embedding_dim)
        self.centers_per_class = check_positive_int("centers_per_class", centers_per_class)
        self.scale = check_positive("scale", scale)
        self.gamma = check_positive("gamma", gamma)
        self.margin = check_non_negative("margin", margin)
        self.tau = check_non_negative("tau", tau)
        self.centers = self.class_weights(seed, per_class=centers_per_class)

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        loss = super().forward(embeddings, labels, tuples)
        if len(labels) == 0:
            # Eq. 18's regulariser does not depend on the batch: an empty batch gives it alone.
            loss = loss + self.tau * self.center_spread(unit_weights(self.centers, embeddings.dtype))
        return loss

    def class_loss(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """``L_base`` of eq. 17 plus eq. 18's regulariser, sharing the normalised centres."""
        centers = unit_weights(self.centers, embeddings.dtype)
        # One [b, C*K] product viewed as [b, C, K] (what einsum would dispatch to, minus its overhead).
        cosine = (F.normalize(embeddings, dim=1) @ centers.flatten(0, 1).T).view(len(labels), *centers.shape[:2])
        assignment = torch.softmax(cosine * (1.0 / self.gamma), dim=2)
        similarity = (assignment * cosine).sum(dim=2)
        own = labels.unsqueeze(1)
        logits = similarity.scatter(1, own, similarity.gather(1, own) - self.margin)
        loss = F.cross_entropy(self.scale * logits, labels)
        # tau = 0 is SoftTriple as Qian et al.'s eq. without the regulariser: no pass over the centres.
        return loss + self.tau * self.center_spread(centers) if self.tau else loss

    def center_spread(self, centers: Tensor) -> Tensor:
        """``sum_c sum_{k<l} ||psi_c^k - psi_c^l|| / (C K (K-1))`` for unit centres ``[C, K, D]``."""
        per_class = self.centers_per_class
        if per_class == 1:
            return centers.sum() * 0.0
        # All ordered pairs at once (each unordered pair twice, k = l adds 0) instead of gathering the
        # k < l pairs: fewer ops on these small tensors. vector_norm's gradient at a zero difference
        # (k = l, or coinciding centres) is 0, not sqrt's infinity.
        distances = torch.linalg.vector_norm(centers.unsqueeze(2) - centers.unsqueeze(1), dim=3)
        return distances.sum() / (2 * self.num_classes * per_class * (per_class - 1))
