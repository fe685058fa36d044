"""Multi-class N-pair loss and its temperature-scaled cosine form NT-Xent / InfoNCE."""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.losses.pair_masks import gram, log1p_exp, pair_masks
from dmlbench.mining.base import check_batch
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_non_negative, check_positive


class _NPairSum(torch.autograd.Function):
    """Roth et al. 2020 supp. eq. 4's sum over the positive pairs of a similarity matrix, with its gradient
    written out: a few [b, b] passes for the backward instead of autograd's chain through the log-sum-exp."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, similarity: Tensor, positive: Tensor, negative: Tensor) -> Tensor:
        selected = torch.where(negative, similarity, float("-inf"))
        maximum = selected.amax(dim=1, keepdim=True)
        # exp(-inf) = 0 off the negatives; an anchor without negatives is shifted by a finite number and
        # its log-sum-exp is -inf, so its pairs add log(1 + 0) = 0 and get no gradient.
        exponentials = torch.exp(selected - maximum.clamp_min(torch.finfo(similarity.dtype).min))
        total = exponentials.sum(dim=1, keepdim=True).clamp_min(0.5)
        margins = (torch.log(total) + maximum) - similarity  # log sum_n exp(s_an) - s_ap
        ctx.save_for_backward(exponentials, total, margins, positive)
        # The positive pairs are a few per anchor: log(1 + exp(.)) (log1p_exp, exact for any value) only for them.
        return log1p_exp(margins.masked_select(positive)).sum()

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor, None, None]:
        exponentials, total, margins, positive = ctx.saved_tensors
        # d/dmargin of log(1 + exp(margin)) is sigmoid(margin); each anchor's log-sum-exp passes its
        # pairs' total on to its negatives in proportion to exp(s_an).
        weights = torch.where(positive, torch.sigmoid(margins), 0.0) * grad
        return exponentials * (weights.sum(dim=1, keepdim=True) / total) - weights, None, None


def npair_sum(similarity: Tensor, positive: Tensor, negative: Tensor) -> Tensor:
    """Roth et al. 2020 supp. eq. 4, the sum over the positive pairs ``(a, p)`` of ``positive``:
    ``sum_(a,p) log(1 + sum_{n in negative[a]} exp(s_an - s_ap))``."""
    return _NPairSum.apply(similarity, positive, negative)


@LOSSES.register("npairs")
class NPairsLoss(MetricLoss):
    """N-pair loss, Roth et al. 2020 supp. eq. 4 (Sohn 2016).

    ``L = 1/b sum_{(a,p): y_a = y_p, a != p} log(1 + sum_{n: y_n != y_a} exp((s_an - s_ap) / temperature))
    + regularization/b sum_i ||phi*_i||^2`` with ``s = phi*^T phi*`` the dot product of the *unnormalised*
    embeddings (eq. 4 prints phi_n without the star; all three factors are phi* here, as in Sohn 2016).
    Note the 1/b: the sum over ordered positive pairs is divided by the batch size, not by the number of
    pairs. ``normalize=True`` uses cosine similarity instead (NT-Xent); the regulariser always acts on
    the embeddings as given. With mined tuples, the pairs and each anchor's negatives are the listed ones.
    """

    uses_tuples = True

    def __init__(self, temperature: float = 1.0, regularization: float = 0.005, normalize: bool = False) -> None:
        super().__init__()
        self.temperature = check_positive("temperature", temperature)
        self.regularization = check_non_negative("regularization", regularization)
        self.normalize = bool(normalize)

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_batch(embeddings, labels)
        positive, negative = pair_masks(labels, tuples)
        # Without tuples, a positive pair is a repeated label: cheaper to see in the labels than in the mask.
        if not (len(torch.unique(labels)) < len(labels) if tuples is None else bool(positive.any())):
            return zero_loss(embeddings)
        vectors = torch.nn.functional.normalize(embeddings, dim=1) if self.normalize else embeddings
        # The temperature scales the [b, dim] factors rather than the [b, b] product.
        similarity = gram(vectors / self.temperature**0.5)
        ranking = npair_sum(similarity, positive, negative) / len(labels)
        return ranking + self.regularization * embeddings.pow(2).sum(dim=1).mean()


@LOSSES.register("nt_xent", "info_nce")
class NTXentLoss(NPairsLoss):
    """NT-Xent / InfoNCE, Roth et al. 2020 supp. eq. 4 on cosine similarity over a temperature (Musgrave et al. 2020 Table 7).

    The same loss as ``npairs`` with other defaults: cosine similarity, no embedding regulariser and
    temperature 0.07 (the seeds tune it rather than fix it; 0.07 is the usual InfoNCE value).
    """

    def __init__(self, temperature: float = 0.07, regularization: float = 0.0, normalize: bool = True) -> None:
        super().__init__(temperature=temperature, regularization=regularization, normalize=normalize)
