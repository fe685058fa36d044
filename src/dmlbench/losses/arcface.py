"""ArcFace (Deng et al. 2019): an additive angular margin on the target class."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dmlbench.errors import UserInputError
from dmlbench.losses.base import LOSSES
from dmlbench.losses.normalized_softmax import CosineSoftmaxLoss
from dmlbench.validation import check_non_negative, check_positive


@LOSSES.register("arcface")
class ArcFaceLoss(CosineSoftmaxLoss):
    """ArcFace, Roth et al. 2020 supp. eq. 6 (Deng et al. 2019), with the authors' fallback beyond pi - m.

    ``L = -1/b sum_i log(e^{s f(t_{y_i})} / (e^{s f(t_{y_i})} + sum_{c != y_i} e^{s cos t_c}))``
    with ``t_c`` the angle between the normalised embedding and class centre ``W_c``; s = 16,
    m = 0.5 (004's values). 004 prints the negative sum over the batch's other samples' classes;
    the original sum over all other classes is used. The target logit is ``f(t) = cos(t + m)`` for
    ``t < pi - m``, computed as ``cos t cos m - sin t sin m`` with ``sin t = sqrt(max(1 - cos^2 t,
    eps))`` so value and gradient stay finite at cos = +-1 (no acos). Beyond, where ``cos(t + m)``
    would increase again, ``f(t) = cos t - m sin m``: the fallback of the ArcFace authors' code
    (insightface, ``easy_margin=False``: ``cos t > cos(pi - m) ? cos(t + m) : cos t - sin(pi - m) m``;
    also PML's), not in eq. 6. ``f`` is then strictly decreasing on each side of ``pi - m``, but not
    continuous there: it drops from -1 to ``-cos m - m sin m`` (by 0.117 at m = 0.5). The drop is
    downward, so ``f`` is non-increasing on all of [0, pi], for m up to 2.331 rad (``cos m + m sin
    m = 1``); for larger margins it jumps up. ``class_subsample_ratio``: see ``CosineSoftmaxLoss``.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        scale: float = 16.0,
        margin: float = 0.5,
        class_subsample_ratio: float = 1.0,
        seed: int = 0,
    ) -> None:
        check_positive("scale", scale)
        check_non_negative("margin", margin)
        if margin >= math.pi:
            raise UserInputError(f"margin is an angle in radians and must be < pi, got {margin!r}")
        super().__init__(num_classes, embedding_dim, scale, class_subsample_ratio, seed)
        self.margin = margin

    def target_cosine(self, cosine: Tensor) -> Tensor:
        eps = torch.finfo(cosine.dtype).eps
        sine = (1.0 - cosine * cosine).clamp_min(eps).sqrt()
        with_margin = cosine * math.cos(self.margin) - sine * math.sin(self.margin)
        # The authors' fallback where t >= pi - m, i.e. cos t <= cos(pi - m) (insightface's strict test).
        fallback = cosine - self.margin * math.sin(self.margin)
        return torch.where(cosine > math.cos(math.pi - self.margin), with_margin, fallback)
