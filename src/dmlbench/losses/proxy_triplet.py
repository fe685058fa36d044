"""Proxy triplet loss: the triplet hinge with class proxies as positives and negatives."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from dmlbench.distances import euclidean, squared_euclidean
from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.losses.proxies import check_class_batch, check_num_classes, init_proxies
from dmlbench.validation import check_flag, check_seed
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_non_negative, check_positive_int


@LOSSES.register("proxy_triplet")
class ProxyTripletLoss(MetricLoss):
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
        super().__init__()
        self.num_classes = check_num_classes(num_classes)
        self.embedding_dim = check_positive_int("embedding_dim", embedding_dim)
        self.margin = check_non_negative("margin", margin)
        self.squared = check_flag("squared", squared)
        self.proxies = init_proxies((num_classes, embedding_dim), check_seed(seed))

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_class_batch(embeddings, labels, self.num_classes, self.embedding_dim)
        if len(labels) == 0:
            return zero_loss(embeddings)
        points = F.normalize(embeddings, dim=1)
        proxies = F.normalize(self.proxies.to(points.dtype), dim=1)
        distances = squared_euclidean(points, proxies) if self.squared else euclidean(points, proxies)
        labels = labels.long()
        positive = distances.gather(1, labels.unsqueeze(1))
        hinge = F.relu(positive - distances + self.margin)
        negative = ~F.one_hot(labels, self.num_classes).bool()
        return hinge[negative].mean()
