"""Multi-similarity loss with its built-in pair mining."""

from __future__ import annotations

from torch import Tensor

from dmlbench.distances import check_batch, cosine_similarity
from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.losses.pair_masks import log1p_exp, masked_logsumexp, pair_masks
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_non_negative, check_positive


def multi_similarity_pair_selection(
    similarity: Tensor, positive: Tensor, negative: Tensor, epsilon: float
) -> tuple[Tensor, Tensor]:
    """Roth et al. 2020 supp. eq. 11 (Wang et al. 2019a, pair mining): the informative positive and negative pairs.

    A negative pair (a, n) is kept if ``s_an > min_p s_ap - epsilon``, a positive pair (a, p) if
    ``s_ap < max_n s_an + epsilon`` (strict inequalities; min/max over the anchor's candidate pairs,
    so an anchor without positives keeps no negatives and vice versa).
    """
    similarity = similarity.detach()
    hardest_positive = similarity.masked_fill(~positive, float("inf")).amin(dim=1, keepdim=True)
    hardest_negative = similarity.masked_fill(~negative, float("-inf")).amax(dim=1, keepdim=True)
    return positive & (similarity < hardest_negative + epsilon), negative & (similarity > hardest_positive - epsilon)


@LOSSES.register("multi_similarity")
class MultiSimilarityLoss(MetricLoss):
    """Multi-similarity loss, Roth et al. 2020 supp. eq. 11-12 (Wang et al. 2019a).

    ``L = 1/b sum_i [1/alpha log(1 + sum_{j in P_i} exp(-alpha (s_ij - threshold)))
    + 1/beta log(1 + sum_{k in N_i} exp(beta (s_ik - threshold)))]`` with cosine similarity s (the loss
    normalises its input). Without tuples, P_i and N_i are the pairs kept by the mining step of eq. 11
    (``multi_similarity_pair_selection``); eq. 12 writes the sums over all pairs with s* = 0 for the
    others, but as in Wang et al. only the kept pairs enter the sums. Given tuples (Pairs, or Triplets
    read as pairs) are used as P_i and N_i directly, without this mining. ``threshold`` is the lambda of eq. 12.
    """

    uses_tuples = True

    def __init__(self, alpha: float = 2.0, beta: float = 40.0, threshold: float = 0.5, epsilon: float = 0.1) -> None:
        super().__init__()
        self.alpha = check_positive("alpha", alpha)
        self.beta = check_positive("beta", beta)
        self.threshold = check_non_negative("threshold", threshold)
        self.epsilon = check_non_negative("epsilon", epsilon)

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_batch(embeddings, labels)
        positive, negative = pair_masks(labels, tuples)
        if not (positive.any() or negative.any()):
            return zero_loss(embeddings)
        similarity = cosine_similarity(embeddings)
        if tuples is None:
            positive, negative = multi_similarity_pair_selection(similarity, positive, negative, self.epsilon)
        positive_term = log1p_exp(masked_logsumexp(-self.alpha * (similarity - self.threshold), positive, dim=1))
        negative_term = log1p_exp(masked_logsumexp(self.beta * (similarity - self.threshold), negative, dim=1))
        return (positive_term / self.alpha + negative_term / self.beta).mean()
