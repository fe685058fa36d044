"""Multi-class N-pair loss and its temperature-scaled cosine form NT-Xent / InfoNCE."""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.losses.pair_masks import gram, log1p_exp, masked_logsumexp, pair_masks
from dmlbench.mining.base import check_batch
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_non_negative, check_positive


def npair_sum(similarity: Tensor, anchors: Tensor, positives: Tensor, negative: Tensor) -> Tensor:
    """Roth et al. 2020 supp. eq. 4, the sum over the positive pairs ``(anchors[k], positives[k])``:
    ``sum_(a,p) log(1 + sum_n exp(s_an - s_ap))``."""
    negative_term = masked_logsumexp(similarity, negative, dim=1)
    return log1p_exp(negative_term[anchors] - similarity[anchors, positives]).sum()


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
        anchors, positives = positive.nonzero(as_tuple=True)
        if len(anchors) == 0:
            return zero_loss(embeddings)
        vectors = torch.nn.functional.normalize(embeddings, dim=1) if self.normalize else embeddings
        # The temperature scales the [b, dim] factors rather than the [b, b] product.
        similarity = gram(vectors / self.temperature**0.5)
        ranking = npair_sum(similarity, anchors, positives, negative) / len(labels)
        return ranking + self.regularization * embeddings.pow(2).sum(dim=1).mean()


@LOSSES.register("nt_xent", "info_nce")
class NTXentLoss(NPairsLoss):
    """NT-Xent / InfoNCE, Roth et al. 2020 supp. eq. 4 on cosine similarity over a temperature (Musgrave et al. 2020 Table 7).

    The same loss as ``npairs`` with other defaults: cosine similarity, no embedding regulariser and
    temperature 0.07 (the seeds tune it rather than fix it; 0.07 is the usual InfoNCE value).
    """

    def __init__(self, temperature: float = 0.07, regularization: float = 0.0, normalize: bool = True) -> None:
        super().__init__(temperature=temperature, regularization=regularization, normalize=normalize)
