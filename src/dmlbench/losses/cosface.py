"""CosFace / large margin cosine loss (Wang et al. 2018): an additive margin on the target cosine."""

from __future__ import annotations

from torch import Tensor

from dmlbench.losses.base import LOSSES
from dmlbench.losses.normalized_softmax import CosineSoftmaxLoss
from dmlbench.validation import check_non_negative, check_positive


@LOSSES.register("cosface")
class CosFaceLoss(CosineSoftmaxLoss):
    """CosFace (LMCL), Wang et al. 2018 eq. 4; evaluated as a DML loss in Zhai & Wu 2019 sec. 4.6.

    ``L = -1/b sum_i log(e^{s (cos t_{y_i} - m)} / (e^{s (cos t_{y_i} - m)} + sum_{c != y_i} e^{s cos t_c}))``
    with ``t_c`` the angle between the normalised embedding and class weight ``c``. No seed gives
    values, so the original paper's s = 64 and m = 0.35 are the defaults. ``class_subsample_ratio``:
    see ``CosineSoftmaxLoss``.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        scale: float = 64.0,
        margin: float = 0.35,
        class_subsample_ratio: float = 1.0,
        seed: int = 0,
    ) -> None:
        check_positive("scale", scale)
        check_non_negative("margin", margin)
        super().__init__(num_classes, embedding_dim, scale, class_subsample_ratio, seed)
        self.margin = margin

    def target_cosine(self, cosine: Tensor) -> Tensor:
        return cosine - self.margin
