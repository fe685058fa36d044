"""ProxyNCA (Movshovitz-Attias et al. 2017) and the helpers every class-proxy loss shares.

The helpers (``check_class_batch``, ``check_num_classes``, ``check_seed``, ``init_proxies``) live here
because ProxyNCA is the first proxy loss; ``proxy_triplet``, ``proxy_anchor``,
``normalized_softmax``, ``cosface``, ``arcface``, ``softtriple`` and ``dreml`` import them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dmlbench.distances import euclidean, squared_euclidean
from dmlbench.errors import UserInputError
from dmlbench.losses.base import LOSSES, MetricLoss, check_labels, zero_loss
from dmlbench.mining.base import check_batch
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_positive, check_positive_int


def check_class_batch(embeddings: Tensor, labels: Tensor, num_classes: int, embedding_dim: int) -> None:
    """A batch for a loss with class weights: ``[b, embedding_dim]`` embeddings, labels in ``[0, num_classes)``."""
    check_batch(embeddings, labels)
    if embeddings.shape[1] != embedding_dim:
        raise UserInputError(
            f"embeddings have dimension {embeddings.shape[1]} but the loss was built with embedding_dim={embedding_dim}"
        )
    check_labels(labels, num_classes)


def check_num_classes(num_classes: int, name: str = "num_classes") -> int:
    """A softmax/proxy loss needs at least two classes (its denominator sums over the other classes)."""
    check_positive_int(name, num_classes)
    if num_classes < 2:
        raise UserInputError(f"{name} must be at least 2, got {num_classes}")
    return num_classes


def check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UserInputError(f"seed must be an integer >= 0, got {seed!r}")
    return seed


def check_flag(name: str, value: bool) -> bool:
    if not isinstance(value, bool):
        raise UserInputError(f"{name} must be true or false, got {value!r}")
    return value


def init_proxies(shape: tuple[int, ...], seed: int) -> nn.Parameter:
    """Unit-norm proxies with uniformly random directions (normalised Gaussians), drawn from ``seed``.

    Every loss here normalises its proxies before use, so only their directions matter for the
    loss; unit norm at start keeps the effective proxy learning rate independent of the dimension.
    """
    generator = torch.Generator().manual_seed(seed)
    return nn.Parameter(F.normalize(torch.randn(*shape, generator=generator), dim=-1))


@LOSSES.register("proxy_nca")
class ProxyNCALoss(MetricLoss):
    """ProxyNCA, Roth et al. 2020 supp. eq. 13 (Movshovitz-Attias et al. 2017; Fehervari et al. 2019 eq. 14).

    ``L = 1/b sum_i [ d(s phi_i, s psi_{y_i}) + log sum_{c != y_i} exp(-d(s phi_i, s psi_c)) ]``: the
    denominator excludes the positive proxy, as printed. ``d`` is the *squared* Euclidean distance,
    as in the original paper (and in the reference code of seeds 000 and 004); ``squared=False`` gives
    the plain ``d_e`` of 004's notation. Embeddings and proxies are L2-normalised here (any embeddings
    are accepted) and multiplied by ``scale`` (default 3, the value of Roth et al.'s reference code;
    seed 000 sec. 4.2 notes that without such a scale proxy losses stall). Mean over the batch.
    """

    def __init__(
        self, num_classes: int, embedding_dim: int, scale: float = 3.0, squared: bool = True, seed: int = 0
    ) -> None:
        super().__init__()
        self.num_classes = check_num_classes(num_classes)
        self.embedding_dim = check_positive_int("embedding_dim", embedding_dim)
        self.scale = check_positive("scale", scale)
        self.squared = check_flag("squared", squared)
        self.proxies = init_proxies((num_classes, embedding_dim), check_seed(seed))

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_class_batch(embeddings, labels, self.num_classes, self.embedding_dim)
        if len(labels) == 0:
            return zero_loss(embeddings)
        points = self.scale * F.normalize(embeddings, dim=1)
        proxies = self.scale * F.normalize(self.proxies.to(points.dtype), dim=1)
        distances = squared_euclidean(points, proxies) if self.squared else euclidean(points, proxies)
        labels = labels.long()
        own_class = F.one_hot(labels, self.num_classes).bool()
        positive = distances.gather(1, labels.unsqueeze(1)).squeeze(1)
        # num_classes >= 2, so every row keeps at least one finite negative logit.
        negatives = torch.logsumexp((-distances).masked_fill(own_class, float("-inf")), dim=1)
        return (positive + negatives).mean()
