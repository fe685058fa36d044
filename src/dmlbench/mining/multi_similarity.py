"""Multi-similarity pair mining."""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.distances import cosine_similarity, label_masks
from dmlbench.mining.base import MINERS, Miner
from dmlbench.mining.tuples import Pairs
from dmlbench.validation import check_non_negative


@MINERS.register("multi_similarity")
class MultiSimilarityMiner(Miner):
    """Multi-similarity pair mining, Wang et al. 2019 eq. 9-10 / Roth et al. 2020 supp. eq. 11, on cosine similarity S.

    A negative pair (i, k) is kept if ``S_ik + epsilon > min_{j in P_i} S_ij`` and a positive pair
    (i, j) if ``S_ij - epsilon < max_{k in N_i} S_ik`` (the printed eq. 11 drops which case belongs
    to which set). An anchor without positives keeps no negatives and one without negatives keeps no
    positives. Deterministic: the generator is not used.
    """

    def __init__(self, epsilon: float = 0.1, generator: torch.Generator | None = None) -> None:
        super().__init__(generator)
        self.epsilon = check_non_negative("epsilon", epsilon)

    def mine(self, embeddings: Tensor, labels: Tensor) -> Pairs:
        similarity = cosine_similarity(embeddings)
        positive, negative = label_masks(labels)
        hardest_positive = similarity.masked_fill(~positive, float("inf")).amin(dim=1, keepdim=True)
        hardest_negative = similarity.masked_fill(~negative, float("-inf")).amax(dim=1, keepdim=True)
        kept_positive = positive & (similarity - self.epsilon < hardest_negative)
        kept_negative = negative & (similarity + self.epsilon > hardest_positive)
        return Pairs(*kept_positive.nonzero(as_tuple=True), *kept_negative.nonzero(as_tuple=True))
