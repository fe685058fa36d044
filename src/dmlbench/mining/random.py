"""Random triplet mining."""

from __future__ import annotations

from torch import Tensor

from dmlbench.distances import label_masks
from dmlbench.mining.base import MINERS, Miner
from dmlbench.mining.draw import draw_from_masks
from dmlbench.mining.tuples import Triplets


@MINERS.register("random")
class RandomMiner(Miner):
    """Random tuple mining, Hu et al. 2014 as in Roth et al. 2020 supp. A.2: per anchor a random positive and negative.

    Anchors without a positive or without a negative in the batch give no triplet.
    """

    def mine(self, embeddings: Tensor, labels: Tensor) -> Triplets:
        positive, negative = label_masks(labels)
        anchors = (positive.any(dim=1) & negative.any(dim=1)).nonzero().squeeze(1)
        positives = draw_from_masks(positive[anchors], self.generator)
        negatives = draw_from_masks(negative[anchors], self.generator)
        return Triplets(anchors, positives, negatives)
