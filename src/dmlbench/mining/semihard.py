"""Semihard triplet mining."""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.distances import euclidean, label_masks, squared_euclidean
from dmlbench.errors import UserInputError
from dmlbench.mining.base import MINERS, Miner
from dmlbench.mining.draw import draw_from_masks
from dmlbench.mining.tuples import Triplets, all_triplets
from dmlbench.validation import check_positive

DISTANCES = {"euclidean": euclidean, "squared_euclidean": squared_euclidean}


@MINERS.register("semihard")
class SemihardMiner(Miner):
    """Semihard mining, Schroff et al. 2015 / Roth et al. 2020 supp. eq. 20: negatives with d_ap < d_an < d_ap + margin.

    The upper bound of the window is docs/decisions.md's (eq. 20 only asks ``d_ap < d_an``).

    Per anchor a random positive, then a random negative inside the window, measured with
    ``distance`` (use the loss's distance; the margin is the loss's when a config sets only the loss's:
    ``WINDOW_IS_LOSS_MARGIN``, so a search over the triplet loss's margin moves the window with it).
    Anchors whose window is empty give no triplet (the authors' code falls back to a random
    negative; here every mined triplet satisfies the window). ``all_triplets=True`` returns every
    (anchor, positive, negative) inside the window instead, as pytorch-metric-learning's
    ``TripletMarginMiner(type_of_triplets="semihard")`` does.
    """

    WINDOW_IS_LOSS_MARGIN = True

    def __init__(
        self,
        margin: float = 0.2,
        distance: str = "euclidean",
        all_triplets: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(generator)
        self.margin = check_positive("margin", margin)
        if distance not in DISTANCES:
            raise UserInputError(f"distance must be one of {', '.join(DISTANCES)}, got {distance!r}")
        self.distance = distance
        self.all_triplets = bool(all_triplets)

    def mine(self, embeddings: Tensor, labels: Tensor) -> Triplets:
        distances = DISTANCES[self.distance](embeddings)
        positive, negative = label_masks(labels)
        if self.all_triplets:
            every = all_triplets(labels)
            d_ap = distances[every.anchors, every.positives]
            d_an = distances[every.anchors, every.negatives]
            inside = (d_an > d_ap) & (d_an < d_ap + self.margin)
            return Triplets(every.anchors[inside], every.positives[inside], every.negatives[inside])
        anchors = positive.any(dim=1).nonzero().squeeze(1)
        positives = draw_from_masks(positive[anchors], self.generator)
        d_ap = distances[anchors, positives].unsqueeze(1)
        d_an = distances[anchors]
        window = negative[anchors] & (d_an > d_ap) & (d_an < d_ap + self.margin)
        keep = window.any(dim=1)
        negatives = draw_from_masks(window[keep], self.generator)
        return Triplets(anchors[keep], positives[keep], negatives)
