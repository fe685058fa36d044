"""Proxy-Anchor loss (Kim et al. 2020): proxies as anchors, all batch samples as their neighbours."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.losses.proxies import check_class_batch, check_num_classes, init_proxies
from dmlbench.validation import check_seed
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_non_negative, check_positive, check_positive_int


def log_one_plus_sum_exp(logits: Tensor, keep: Tensor, dim: int) -> Tensor:
    """``log(1 + sum_{keep} exp(logits))`` along ``dim``; 0 where nothing is kept, finite gradients."""
    masked = logits.masked_fill(~keep, float("-inf"))
    # The appended 0 is the "1 +": it keeps every slice finite, so empty slices give log 1 = 0.
    return torch.logsumexp(torch.cat([torch.zeros_like(masked.narrow(dim, 0, 1)), masked], dim=dim), dim=dim)


@LOSSES.register("proxy_anchor")
class ProxyAnchorLoss(MetricLoss):
    """Proxy-Anchor loss, Kim et al. 2020 (CVPR) sec. 3 (an extra: no seed defines it).

    ``L = 1/|P+| sum_{p in P+} log(1 + sum_{x in X_p+} exp(-alpha (s(x,p) - delta)))
    + 1/|P| sum_{p in P} log(1 + sum_{x in X_p-} exp(alpha (s(x,p) + delta)))`` with cosine
    similarity ``s``, ``P+`` the proxies with a positive in the batch and ``P`` all proxies;
    alpha = 32, delta (``margin``) = 0.1 as in the paper. Any embeddings are accepted (normalised here).
    """

    def __init__(
        self, num_classes: int, embedding_dim: int, alpha: float = 32.0, margin: float = 0.1, seed: int = 0
    ) -> None:
        super().__init__()
        self.num_classes = check_num_classes(num_classes)
        self.embedding_dim = check_positive_int("embedding_dim", embedding_dim)
        self.alpha = check_positive("alpha", alpha)
        self.margin = check_non_negative("margin", margin)
        self.proxies = init_proxies((num_classes, embedding_dim), check_seed(seed))

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_class_batch(embeddings, labels, self.num_classes, self.embedding_dim)
        if len(labels) == 0:
            return zero_loss(embeddings)
        points = F.normalize(embeddings, dim=1)
        cosine = points @ F.normalize(self.proxies.to(points.dtype), dim=1).T
        positive = F.one_hot(labels.long(), self.num_classes).bool()
        pull = log_one_plus_sum_exp(-self.alpha * (cosine - self.margin), positive, dim=0)
        push = log_one_plus_sum_exp(self.alpha * (cosine + self.margin), ~positive, dim=0)
        proxies_with_positives = positive.any(dim=0).sum()
        return pull.sum() / proxies_with_positives + push.sum() / self.num_classes
