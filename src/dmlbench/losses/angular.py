"""Angular loss combined with the N-pair loss."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dmlbench.distances import check_batch
from dmlbench.errors import UserInputError
from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.losses.npairs import npair_term
from dmlbench.losses.pair_masks import log1p_exp, masked_logsumexp, pair_masks
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_non_negative


@LOSSES.register("angular")
class AngularLoss(MetricLoss):
    """N-pair + angular loss, Roth et al. 2020 supp. eq. 5 with f_apn of Wang et al. 2017 (Fehervari et al. 2019 eq. 5).

    ``L = L_npair(phi*) + angular_weight/b sum_{(a,p)} log(1 + sum_{n: y_n != y_a} exp(f_apn))`` with
    ``f_apn = 4 tan^2(alpha) (x_a + x_p)^T x_n - 2 (1 + tan^2(alpha)) x_a^T x_p``. Eq. 5 as printed puts
    the parenthesis of tan^2 around the whole product and ends with x_a^T x_n; this is Wang et al.'s
    form instead. The N-pair term (``npairs``: 1/b, embedding regulariser) uses the unnormalised
    embeddings phi* as given; the angular term uses their L2-normalised version x. ``alpha`` is in
    radians. With mined tuples, both terms use the listed positive pairs and each anchor's listed negatives.
    """

    uses_tuples = True

    def __init__(self, alpha: float = math.pi / 4, angular_weight: float = 2.0, regularization: float = 0.005) -> None:
        super().__init__()
        if not (isinstance(alpha, (int, float)) and 0.0 < alpha < math.pi / 2):
            raise UserInputError(f"alpha must be an angle in radians in (0, pi/2), got {alpha!r}")
        self.alpha = float(alpha)
        self.angular_weight = check_non_negative("angular_weight", angular_weight)
        self.regularization = check_non_negative("regularization", regularization)

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_batch(embeddings, labels)
        positive, negative = pair_masks(labels, tuples)
        anchors, positives = positive.nonzero(as_tuple=True)
        if len(anchors) == 0:
            return zero_loss(embeddings)
        batch_size = len(labels)
        # The N-pair term with its embedding regulariser, and the Gram matrix it is computed from.
        npair, dot_products = npair_term(embeddings, anchors, positives, negative, 1.0, self.regularization)

        # The cosines of the L2-normalised embeddings come from the same Gram matrix (one product
        # fewer); norms are clamped at F.normalize's eps, and vector_norm's gradient stays 0 at 0.
        inverse_norms = 1.0 / torch.linalg.vector_norm(embeddings, dim=1).clamp_min(1e-12)
        cosine = dot_products * inverse_norms.unsqueeze(1) * inverse_norms.unsqueeze(0)
        tan_squared = math.tan(self.alpha) ** 2
        # f_apn = 4 tan^2 (x_a + x_p)^T x_n - 2 (1 + tan^2) x_a^T x_p: the first part is a sum of two
        # (pre-scaled) cosine rows, the second is constant over n and leaves the log-sum-exp, so only
        # one [pairs, b] sum is built.
        scaled = (4 * tan_squared) * cosine
        anchor_positive = (2 * (1 + tan_squared)) * cosine[anchors, positives]
        over_negatives = masked_logsumexp(scaled[anchors] + scaled[positives], negative[anchors], dim=1)
        angular = log1p_exp(over_negatives - anchor_positive).sum() / batch_size
        return npair + self.angular_weight * angular
