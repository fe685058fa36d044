"""Proxy-Anchor loss (Kim et al. 2020): proxies as anchors, all batch samples as their neighbours."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from dmlbench.losses.base import LOSSES
from dmlbench.losses.pair_masks import log1p_exp, masked_logsumexp
from dmlbench.losses.proxies import ClassLoss, unit_weights
from dmlbench.validation import check_non_negative, check_positive


@LOSSES.register("proxy_anchor")
class ProxyAnchorLoss(ClassLoss):
    """Proxy-Anchor loss, Kim et al. 2020 (CVPR) sec. 3 (an extra: no seed defines it).

    ``L = 1/|P+| sum_{p in P+} log(1 + sum_{x in X_p+} exp(-alpha (s(x,p) - delta)))
    + 1/|P| sum_{p in P} log(1 + sum_{x in X_p-} exp(alpha (s(x,p) + delta)))`` with cosine
    similarity ``s``, ``P+`` the proxies with a positive in the batch and ``P`` all proxies;
    alpha = 32, delta (``margin``) = 0.1 as in the paper. Any embeddings are accepted (normalised here).
    """

    def __init__(
        self, num_classes: int, embedding_dim: int, alpha: float = 32.0, margin: float = 0.1, seed: int = 0
    ) -> None:
        super().__init__(num_classes, embedding_dim)
        self.alpha = check_positive("alpha", alpha)
        self.margin = check_non_negative("margin", margin)
        self.proxies = self.class_weights(seed)

    def class_loss(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        points = F.normalize(embeddings, dim=1)
        cosine = points @ unit_weights(self.proxies, points.dtype).T
        positive = F.one_hot(labels, self.num_classes).bool()
        # log(1 + sum exp) per proxy; a proxy without positives (or negatives) in the batch gives 0.
        pull = log1p_exp(masked_logsumexp(-self.alpha * (cosine - self.margin), positive, dim=0))
        push = log1p_exp(masked_logsumexp(self.alpha * (cosine + self.margin), ~positive, dim=0))
        proxies_with_positives = positive.any(dim=0).sum()
        return pull.sum() / proxies_with_positives + push.sum() / self.num_classes
