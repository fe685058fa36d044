"""Hardest-positive / hardest-negative triplet mining."""

from __future__ import annotations

from torch import Tensor

from dmlbench.distances import euclidean, label_masks
from dmlbench.mining.base import MINERS, Miner
from dmlbench.mining.tuples import Triplets


@MINERS.register("hard")
class HardMiner(Miner):
    """Batch-hard mining, Hermans et al. 2017: per anchor its farthest positive and closest negative (Euclidean).

    Anchors without a positive or a negative give no triplet; ties go to the lowest batch index.
    Deterministic: the generator is not used.
    """

    def mine(self, embeddings: Tensor, labels: Tensor) -> Triplets:
        distances = euclidean(embeddings)
        positive, negative = label_masks(labels)
        anchors = (positive.any(dim=1) & negative.any(dim=1)).nonzero().squeeze(1)
        distances = distances[anchors]
        # argmax/argmin return the first extreme index, which breaks ties by batch index
        positives = distances.masked_fill(~positive[anchors], float("-inf")).argmax(dim=1)
        negatives = distances.masked_fill(~negative[anchors], float("inf")).argmin(dim=1)
        return Triplets(anchors, positives, negatives)
