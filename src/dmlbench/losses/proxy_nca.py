"""ProxyNCA (Movshovitz-Attias et al. 2017)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dmlbench.distances import euclidean, squared_euclidean
from dmlbench.losses.base import LOSSES
from dmlbench.losses.proxies import ClassLoss, unit_weights
from dmlbench.validation import check_flag, check_positive


@LOSSES.register("proxy_nca")
class ProxyNCALoss(ClassLoss):
    """ProxyNCA, Roth et al. 2020 supp. eq. 13 (Movshovitz-Attias et al. 2017; Fehervari et al. 2019 eq. 14).

    ``L = 1/b sum_i [ d(s phi_i, s psi_{y_i}) + log sum_{c != y_i} exp(-d(s phi_i, s psi_c)) ]``: the
    denominator excludes the positive proxy, as printed. ``d`` is the *squared* Euclidean distance,
    as in the original paper (and in the reference code of seeds 000 and 004); ``squared=False`` gives
    the plain ``d_e`` of 004's notation. Embeddings and proxies are L2-normalised here (any embeddings
    are accepted) and multiplied by ``scale`` (default 3, the value of Roth et al.'s reference code;
    seed 000 sec. 4.2 notes that without such a scale proxy losses stall). Mean over the batch.
    """

    def __init__(
        self, num_classes: int, embedding_dim: int, scale: float = 3.0, squared: bool = True, seed: int = 0
    ) -> None:
        super().__init__(num_classes, embedding_dim)
        self.scale = check_positive("scale", scale)
        self.squared = check_flag("squared", squared)
        self.proxies = self.class_weights(seed)

    def class_loss(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        points = self.scale * F.normalize(embeddings, dim=1)
        proxies = self.scale * unit_weights(self.proxies, points.dtype)
        distances = squared_euclidean(points, proxies) if self.squared else euclidean(points, proxies)
        own_class = F.one_hot(labels, self.num_classes).bool()
        positive = distances.gather(1, labels.unsqueeze(1)).squeeze(1)
        # num_classes >= 2, so every row keeps at least one finite negative logit.
        negatives = torch.logsumexp((-distances).masked_fill(own_class, float("-inf")), dim=1)
        return (positive + negatives).mean()
