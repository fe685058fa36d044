"""A new loss as a dmlbench plugin: the soft-margin triplet loss (Hermans et al. 2017, eq. 4).

Use it with `plugins: [my_loss.py]` in a config (a path relative to that config) or
`dmlbench --plugin examples/my_loss.py ...`; then `loss.name: soft_triplet` works like a built-in loss.
"""

import torch
from torch import Tensor

import dmlbench
from dmlbench.distances import euclidean
from dmlbench.losses import MetricLoss, zero_loss
from dmlbench.mining import Tuples, all_triplets, to_triplets


@dmlbench.register_loss("soft_triplet")
class SoftTripleMarginLoss(MetricLoss):
    """Soft-margin triplet loss, Hermans et al. 2017 eq. 4: mean over triplets of softplus(scale * (d_ap - d_an))."""

    uses_tuples = True  # takes the miner's tuples; without a miner, every triplet of the batch

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        if not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        self.scale = scale

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        triplets = all_triplets(labels) if tuples is None else to_triplets(tuples)
        if len(triplets) == 0:
            return zero_loss(embeddings)
        distances = euclidean(embeddings)
        gap = distances[triplets.anchors, triplets.positives] - distances[triplets.anchors, triplets.negatives]
        return torch.nn.functional.softplus(self.scale * gap).mean()
