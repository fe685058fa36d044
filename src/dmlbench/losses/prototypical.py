"""Prototypical loss (Snell et al. 2017): soft nearest class mean over the classes of the batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dmlbench.distances import check_batch, same_label_mask, squared_euclidean
from dmlbench.errors import UserInputError
from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.mining.tuples import Tuples

SPLITS = ("half", "leave_one_out")


@LOSSES.register("prototypical")
class PrototypicalLoss(MetricLoss):
    """Prototypical loss, Fehervari et al. 2019 eq. 13 (Snell et al. 2017).

    ``L = -1/|Q| sum_{a in Q} log(exp(-d(phi_a, mu_{y_a})) / sum_{k in K} exp(-d(phi_a, mu_k)))`` with
    ``d`` the squared Euclidean distance (Snell et al.; seed 000's code), ``K`` the classes of the
    batch and ``mu_k`` the mean of class k's support samples. Seed 000 trains on episodes split into
    support and query samples; a batch here carries no such split, so ``split`` makes one:

    - ``"half"`` (default): in each class the first ``ceil(n/2)`` samples in batch order are supports,
      the rest queries, which reproduces seed 000's Ns = Nq episodes for an even class count.
    - ``"leave_one_out"``: every sample is a query; its own class mean leaves it out, the other classes
      use all their samples.

    Classes with a single sample supply a prototype but no query. The embeddings are used as given
    (seed 000 trains this loss on unnormalised ones). Mean over the queries; no query gives 0.
    """

    def __init__(self, split: str = "half") -> None:
        super().__init__()
        if split not in SPLITS:
            raise UserInputError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        self.split = split

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_batch(embeddings, labels)
        if len(labels) == 0:
            return zero_loss(embeddings)
        classes, class_index = torch.unique(labels, return_inverse=True)
        members = F.one_hot(class_index, len(classes)).T.to(embeddings.dtype)  # [K, b]
        class_sizes = torch.bincount(class_index, minlength=len(classes))
        if self.split == "half":
            logits, targets = self.half_split_logits(embeddings, labels, class_index, members, class_sizes)
        else:
            logits, targets = self.leave_one_out_logits(embeddings, class_index, members, class_sizes)
        if len(targets) == 0:
            return zero_loss(embeddings)
        return F.cross_entropy(logits, targets)

    @staticmethod
    def half_split_logits(
        embeddings: Tensor, labels: Tensor, class_index: Tensor, members: Tensor, class_sizes: Tensor
    ) -> tuple[Tensor, Tensor]:
        batch = len(labels)
        earlier = torch.ones(batch, batch, dtype=torch.bool, device=labels.device).tril(diagonal=-1)
        rank_in_class = (same_label_mask(labels) & earlier).sum(dim=1)
        supports_per_class = (class_sizes + 1) // 2
        is_support = rank_in_class < supports_per_class[class_index]
        support_members = members * is_support.to(members.dtype)
        prototypes = (support_members @ embeddings) / support_members.sum(dim=1, keepdim=True)
        queries = (~is_support).nonzero().squeeze(1)
        return -squared_euclidean(embeddings[queries], prototypes), class_index[queries]

    @staticmethod
    def leave_one_out_logits(
        embeddings: Tensor, class_index: Tensor, members: Tensor, class_sizes: Tensor
    ) -> tuple[Tensor, Tensor]:
        sums = members @ embeddings
        queries = (class_sizes[class_index] > 1).nonzero().squeeze(1)
        points, own = embeddings[queries], class_index[queries]
        distances = squared_euclidean(points, sums / class_sizes.unsqueeze(1).to(sums.dtype))
        own_prototype = (sums[own] - points) / (class_sizes[own] - 1).unsqueeze(1).to(sums.dtype)
        own_distance = (points - own_prototype).square().sum(dim=1, keepdim=True)
        return -distances.scatter(1, own.unsqueeze(1), own_distance), own
