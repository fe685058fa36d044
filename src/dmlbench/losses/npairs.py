"""Multi-class N-pair loss and its temperature-scaled cosine form NT-Xent / InfoNCE."""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.distances import check_batch
from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.losses.pair_masks import label_pairs, log1p_exp, pair_masks
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_non_negative, check_positive


class _NPairTerm(torch.autograd.Function):
    """Roth et al. 2020 supp. eq. 4 on the similarities ``s = x x^T / temperature``, returned with ``s``;
    the gradient is written out: a few [b, b] passes and one product for the backward instead of
    autograd's chain through the log-sum-exp, the Gram matrix's two products and the regulariser."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        vectors: Tensor,
        anchors: Tensor,
        positives: Tensor,
        negative: Tensor | None,
        temperature: float,
        regularization: float,
    ) -> tuple[Tensor, Tensor]:
        batch = len(vectors)
        similarity = vectors @ (vectors if temperature == 1 else vectors / temperature).T
        if negative is None:
            # Every pair but the positives and (a, a) is a negative: masking the few positives by index
            # is cheaper than a pass with a [b, b] boolean mask.
            selected = similarity.clone()
            selected[anchors, positives] = float("-inf")
            selected.fill_diagonal_(float("-inf"))
        else:
            selected = torch.where(negative, similarity, float("-inf"))
        # One fused softmax kernel instead of separate exp / sum / divide passes (torch.exp alone costs
        # more than the whole softmax on the CPU). Its largest entry is exp(0) / total, so the
        # log-sum-exp over the negatives is maximum - log(that entry), with no second exp pass.
        probabilities = torch.softmax(selected, dim=1)
        maximum = selected.amax(dim=1)
        log_sum_exp = maximum - torch.log(probabilities.amax(dim=1))
        no_negatives = maximum == float("-inf")
        if bool(no_negatives.any()):
            # Such an anchor's softmax is 0/0: its log-sum-exp is -inf instead, so its pairs add
            # log(1 + 0) = 0 and get no gradient.
            probabilities[no_negatives] = 0.0
            log_sum_exp = log_sum_exp.masked_fill(no_negatives, float("-inf"))
        margins = log_sum_exp[anchors] - similarity[anchors, positives]  # log sum_n exp(s_an) - s_ap
        ctx.save_for_backward(vectors, probabilities, margins, anchors, positives)
        ctx.temperature, ctx.regularization = temperature, regularization
        # A loss that does not use s gets no [b, b] zero gradient for it.
        ctx.set_materialize_grads(False)
        loss = (log1p_exp(margins).sum() + regularization * vectors.square().sum()) / batch
        return loss, similarity

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: Tensor | None, grad_similarity: Tensor | None
    ) -> tuple[Tensor | None, None, None, None, None, None]:
        vectors, probabilities, margins, anchors, positives = ctx.saved_tensors
        batch = len(vectors)
        gradient, similarity_gradient = None, grad_similarity
        if grad is not None:
            # d/dmargin of log(1 + exp(margin)) is sigmoid(margin); each anchor's log-sum-exp passes its
            # pairs' total on to its negatives in proportion to their softmax weight.
            weights = torch.sigmoid(margins) * (grad / batch)
            per_anchor = weights.new_zeros(batch).index_add_(0, anchors, weights)
            pairs_gradient = probabilities * per_anchor.to(probabilities.dtype).unsqueeze(1)
            # accumulate: with mined tuples a pair may be listed as positive and as negative.
            pairs_gradient.index_put_((anchors, positives), -weights.to(pairs_gradient.dtype), accumulate=True)
            similarity_gradient = pairs_gradient if grad_similarity is None else pairs_gradient + grad_similarity
            gradient = vectors * (2 * ctx.regularization / batch * grad)
        if similarity_gradient is not None:
            # d(x x^T) is (G + G^T) x, one product; the engine may hand a low-precision output a float32 gradient.
            symmetric = (similarity_gradient + similarity_gradient.T).to(vectors.dtype)
            if gradient is None:
                gradient = torch.mm(symmetric, vectors) / ctx.temperature
            else:
                gradient.addmm_(symmetric, vectors, alpha=1 / ctx.temperature)
        return gradient, None, None, None, None, None


def npair_term(
    vectors: Tensor,
    anchors: Tensor,
    positives: Tensor,
    negative: Tensor | None,
    temperature: float,
    regularization: float,
) -> tuple[Tensor, Tensor]:
    """Roth et al. 2020 supp. eq. 4, ``1/b sum_(a,p) log(1 + sum_n exp(s_an - s_ap)) + regularization/b
    sum_i ||x_i||^2`` with ``s = x x^T / temperature`` for the rows ``x`` of ``vectors``, over the positive
    pairs ``(anchors[i], positives[i])`` and the negatives ``negative[a]`` of each anchor (``None``: every
    pair that is neither positive nor (a, a)); returned with ``s`` (for a loss that reuses it; its
    gradient flows back too)."""
    return _NPairTerm.apply(vectors, anchors, positives, negative, temperature, regularization)


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
        if tuples is None:
            # The pairs from the sorted labels, the negatives implied: no [b, b] boolean masks.
            anchors, positives = label_pairs(labels)
            negative = None
        else:
            positive, negative = pair_masks(labels, tuples)
            anchors, positives = positive.nonzero(as_tuple=True)
        if len(anchors) == 0:
            return zero_loss(embeddings)
        if not self.normalize:
            # The regulariser acts on the same vectors: its gradient joins the written-out one.
            loss, _ = npair_term(embeddings, anchors, positives, negative, self.temperature, self.regularization)
            return loss
        vectors = torch.nn.functional.normalize(embeddings, dim=1)
        loss, _ = npair_term(vectors, anchors, positives, negative, self.temperature, 0.0)
        if self.regularization == 0:
            return loss  # NT-Xent's default: no regulariser chain to build and differentiate
        return loss + self.regularization * embeddings.pow(2).sum(dim=1).mean()


@LOSSES.register("nt_xent", "info_nce")
class NTXentLoss(NPairsLoss):
    """NT-Xent / InfoNCE, Roth et al. 2020 supp. eq. 4 on cosine similarity over a temperature (Musgrave et al. 2020 Table 7).

    The same loss as ``npairs`` with other defaults: cosine similarity, no embedding regulariser and
    temperature 0.07 (the seeds tune it rather than fix it; 0.07 is the usual InfoNCE value).
    """

    def __init__(self, temperature: float = 0.07, regularization: float = 0.0, normalize: bool = True) -> None:
        super().__init__(temperature=temperature, regularization=regularization, normalize=normalize)
