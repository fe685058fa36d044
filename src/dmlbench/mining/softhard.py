"""Softhard triplet mining."""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.distances import euclidean, label_masks
from dmlbench.mining.base import MINERS, Miner
from dmlbench.mining.draw import draw_from_masks
from dmlbench.mining.tuples import Triplets


@MINERS.register("softhard")
class SofthardMiner(Miner):
    """Softhard mining, Roth & Brattoli 2019 / Roth et al. 2020 supp. eq. 21-22: random hard positive and hard negative.

    Per anchor (with a positive and a negative), the negative is drawn uniformly from those closer
    than its farthest positive (eq. 21) and the positive from those farther than its closest
    negative (eq. 22), both strict. An empty hard set falls back to all positives / negatives of the
    anchor, as in the authors' code. The equations use squared distances; the sets are the same
    with Euclidean ones.
    """

    def mine(self, embeddings: Tensor, labels: Tensor) -> Triplets:
        distances = euclidean(embeddings)
        positive, negative = label_masks(labels)
        anchors = (positive.any(dim=1) & negative.any(dim=1)).nonzero().squeeze(1)
        positive, negative, distances = positive[anchors], negative[anchors], distances[anchors]
        farthest_positive = distances.masked_fill(~positive, float("-inf")).amax(dim=1, keepdim=True)
        closest_negative = distances.masked_fill(~negative, float("inf")).amin(dim=1, keepdim=True)
        hard_positive = positive & (distances > closest_negative)
        hard_negative = negative & (distances < farthest_positive)
        positive_pool = torch.where(hard_positive.any(dim=1, keepdim=True), hard_positive, positive)
        negative_pool = torch.where(hard_negative.any(dim=1, keepdim=True), hard_negative, negative)
        positives = draw_from_masks(positive_pool, self.generator)
        negatives = draw_from_masks(negative_pool, self.generator)
        return Triplets(anchors, positives, negatives)
