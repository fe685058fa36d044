"""Proxy triplet loss: the triplet hinge with class proxies as positives and negatives."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from dmlbench.distances import euclidean, squared_euclidean
from dmlbench.losses.base import LOSSES
from dmlbench.losses.proxies import ClassLoss, unit_weights
from dmlbench.validation import check_flag, check_non_negative


@LOSSES.register("proxy_triplet")
class ProxyTripletLoss(ClassLoss):
    """Proxy triplet loss, Fehervari et al. 2019 eq. 1 with proxies (sec. 2.9; Movshovitz-Attias et al. 2017).

    Every sample is an anchor, its class proxy the positive and every other class proxy a negative:
    ``L = 1/(b (C-1)) sum_i sum_{c != y_i} [d(phi_i, psi_{y_i}) - d(phi_i, psi_c) + margin]_+``, the
    mean over all (sample, negative proxy) triplets, as in seed 000's reference code. ``d`` is the
    squared Euclidean distance between L2-normalised embeddings and proxies (as that code and the
    proxy paper); ``squared=False`` uses the plain distance. A scale on both would only multiply the
    loss and divide the margin, so there is none. Any embeddings are accepted (normalised here).
    """

    def __init__(
        self, num_classes: int, embedding_dim: int, margin: float = 1.0, squared: bool = True, seed: int = 0
    ) -> None:
        super().__init__(num_classes, embedding_dim)
        self.margin = check_non_negative("margin", margin)
        self.squared = check_flag("squared", squared)
        self.proxies = self.class_weights(seed)

    def class_loss(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        points = F.normalize(embeddings, dim=1)
        proxies = unit_weights(self.proxies, points.dtype)
        distances = squared_euclidean(points, proxies) if self.squared else euclidean(points, proxies)
        positive = distances.gather(1, labels.unsqueeze(1))
        hinge = F.relu(positive - distances + self.margin)
        negative = ~F.one_hot(labels, self.num_classes).bool()
        return hinge[negative].mean()
