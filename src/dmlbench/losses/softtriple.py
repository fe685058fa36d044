"""SoftTriple loss (Qian et al. 2019): several normalised centres per class, softly assigned."""

from __future__ import annotations

import torch
from torch import Tensor

from dmlbench.losses.base import LOSSES
from dmlbench.losses.proxies import ClassLoss, unit_weights
from dmlbench.mining.tuples import Tuples
from dmlbench.validation import check_non_negative, check_positive, check_positive_int


_EPS = 1e-12  # F.normalize's default


def _unit_rows(rows: Tensor) -> tuple[Tensor, Tensor]:
    """``F.normalize(rows, dim=-1)`` and the norms, for ``_unit_rows_gradient``."""
    norms = torch.linalg.vector_norm(rows, dim=-1, keepdim=True)
    return rows / norms.clamp_min(_EPS), norms


def _unit_rows_gradient(unit: Tensor, norms: Tensor, grad: Tensor) -> Tensor:
    """The gradient through ``F.normalize``: ``(g - u (u^T g)) / ||x||``; below its eps the norm is a
    constant and only ``g / eps`` remains."""
    projection = (unit * grad).sum(dim=-1, keepdim=True).masked_fill_(norms < _EPS, 0.0)
    return (grad - unit * projection) / norms.clamp_min(_EPS)


def _spread(centers: Tensor) -> tuple[Tensor, Tensor]:
    """The differences ``psi^k - psi^l`` ``[K, K, C, D]`` of the centres ``[K, C, D]`` of each class
    and their norms (keepdim), for eq. 18's sum over the ordered pairs."""
    differences = centers.unsqueeze(1) - centers.unsqueeze(0)
    return differences, torch.linalg.vector_norm(differences, dim=3, keepdim=True)


def _spread_gradient(differences: Tensor, norms: Tensor, grad: Tensor) -> Tensor:
    """The gradient of ``sum_{k, l} ||psi^k - psi^l||`` times ``grad``: ``2 sum_l (psi^k - psi^l) /
    ||psi^k - psi^l||`` (centre k is the first of the pairs (k, l) and the second of (l, k)), 0 for
    coinciding centres, where the norm has no derivative (as ``vector_norm``'s)."""
    # A zero difference stays 0 over any positive floor; a non-zero one has a norm above it.
    directions = differences / norms.clamp_min(torch.finfo(norms.dtype).tiny)
    return directions.sum(dim=1) * (2 * grad)


class _SoftTriple(torch.autograd.Function):
    """Roth et al. 2020 supp. eq. 16-18 from the raw embeddings and centres ``[C, K, D]``, with the
    gradient written out: ``dS/dc_k = w_k (1 + (c_k - S) / gamma)`` for the soft assignment ``w``,
    softmax minus one-hot for the cross-entropy, the two normalisations and the regulariser: one
    autograd node instead of a chain of about twenty."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        embeddings: Tensor,
        centers: Tensor,
        labels: Tensor,
        gamma: float,
        scale: float,
        margin: float,
        spread_weight: float,
    ) -> Tensor:
        batch, (num_classes, per_class, dim) = len(labels), centers.shape
        vectors, vector_norms = _unit_rows(embeddings)
        # The centres ordered centre index first, [K * C, D]: one product gives the cosines as [b, K, C],
        # and the softmax over the K centres runs along its middle axis, vectorised over the classes
        # (along a last axis of length K it costs an order of magnitude more on the CPU).
        by_center, center_norms = _unit_rows(centers.to(embeddings.dtype).transpose(0, 1).reshape(-1, dim))
        cosine = (vectors @ by_center.T).view(batch, per_class, num_classes)
        assignment = torch.softmax(cosine / gamma, dim=1)
        similarity = (assignment * cosine).sum(dim=1)
        own = labels.unsqueeze(1)
        logits = similarity.scatter_add(1, own, similarity.new_full(own.shape, -margin))
        log_probabilities = torch.log_softmax(scale * logits, dim=1)
        loss = -log_probabilities.gather(1, own).mean()
        saved = [vectors, vector_norms, by_center, center_norms, cosine, assignment, similarity, log_probabilities, own]
        if spread_weight:
            differences, norms = _spread(by_center.view(per_class, num_classes, dim))
            loss = loss + norms.sum() * spread_weight
            saved += [differences, norms]
        ctx.save_for_backward(*saved)
        ctx.gamma, ctx.scale, ctx.spread_weight = gamma, scale, spread_weight
        return loss

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: Tensor
    ) -> tuple[Tensor | None, Tensor | None, None, None, None, None, None]:
        vectors, vector_norms, by_center, center_norms, cosine, assignment, similarity, log_probabilities, own = (
            ctx.saved_tensors[:9]
        )
        batch, per_class, num_classes = cosine.shape
        # The margin shifts one logit by a constant: the similarity gets the logits' gradient.
        logits_gradient = torch.exp(log_probabilities).scatter_add_(1, own, log_probabilities.new_full(own.shape, -1.0))
        similarity_gradient = logits_gradient * (ctx.scale * grad / batch)
        centred = (cosine - similarity.unsqueeze(1)) / ctx.gamma + 1.0
        # The engine may hand a low-precision loss a float32 gradient: the products take one dtype.
        cosine_gradient = (assignment * centred * similarity_gradient.unsqueeze(1)).to(vectors.dtype).view(batch, -1)
        embeddings_gradient = centers_gradient = None
        if ctx.needs_input_grad[0]:
            embeddings_gradient = _unit_rows_gradient(vectors, vector_norms, cosine_gradient @ by_center)
        if ctx.needs_input_grad[1]:
            by_center_gradient = cosine_gradient.T @ vectors
            if ctx.spread_weight:
                differences, norms = ctx.saved_tensors[9:]
                spread_gradient = _spread_gradient(differences, norms, ctx.spread_weight * grad)
                by_center_gradient += spread_gradient.view_as(by_center_gradient).to(by_center_gradient.dtype)
            by_center_gradient = _unit_rows_gradient(by_center, center_norms, by_center_gradient)
            centers_gradient = by_center_gradient.view(per_class, num_classes, -1).transpose(0, 1)
        return embeddings_gradient, centers_gradient, None, None, None, None, None


@LOSSES.register("softtriple")
class SoftTripleLoss(ClassLoss):
    """SoftTriple, Roth et al. 2020 supp. eq. 16-18 (Qian et al. 2019).

    ``S_i^c = sum_k softmax_k(phi_i^T psi_c^k / gamma) phi_i^T psi_c^k`` (eq. 16; the printed
    version drops the factor ``phi_i^T psi``, without which S would always be 1),
    ``L_base = -1/b sum_i log softmax_c(scale * (S_i^c - margin [c = y_i]))_{y_i}`` (eq. 17) and
    ``L = L_base + tau * sum_c sum_{k < l} ||psi_c^k - psi_c^l|| / (C K (K - 1))`` (eq. 18; each
    unordered pair once, as in Qian et al. and Roth et al.'s code; ``||psi - psi'|| = sqrt(2 - 2 psi^T psi')``
    for unit centres). Defaults from 004: ``tau`` = 0.2, ``scale`` (lambda) = 8, ``margin`` (delta)
    = 0.01, ``gamma`` = 0.1, ``centers_per_class`` (K) = 2. Embeddings and centres are normalised here.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        centers_per_class: int = 2,
        scale: float = 8.0,
        gamma: float = 0.1,
        margin: float = 0.01,
        tau: float = 0.2,
        seed: int = 0,
    ) -> None:
        super().__init__(num_classes, embedding_dim)
        self.centers_per_class = check_positive_int("centers_per_class", centers_per_class)
        self.scale = check_positive("scale", scale)
        self.gamma = check_positive("gamma", gamma)
        self.margin = check_non_negative("margin", margin)
        self.tau = check_non_negative("tau", tau)
        self.centers = self.class_weights(seed, per_class=centers_per_class)

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        loss = super().forward(embeddings, labels, tuples)
        if len(labels) == 0:
            # Eq. 18's regulariser does not depend on the batch: an empty batch gives it alone.
            # Autograd suffices here: vector_norm's gradient is 0 where two centres coincide (k = l too).
            _, norms = _spread(unit_weights(self.centers.transpose(0, 1), embeddings.dtype))
            loss = loss + norms.sum() * self.spread_weight()
        return loss

    def class_loss(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """``L_base`` of eq. 17 plus eq. 18's regulariser."""
        hyper_parameters = (self.gamma, self.scale, self.margin, self.spread_weight())
        return _SoftTriple.apply(embeddings, self.centers, labels, *hyper_parameters)

    def spread_weight(self) -> float:
        """Eq. 18's ``tau / (C K (K-1))``, halved: the sums run over all ordered pairs of centres (each
        unordered pair twice, k = l adds 0), fewer ops on these small tensors than gathering k < l.
        0 at ``tau`` = 0 (Qian et al.'s eq. without the regulariser: no pass over the centres) or K = 1."""
        per_class = self.centers_per_class
        return self.tau / (2 * self.num_classes * per_class * (per_class - 1)) if per_class > 1 else 0.0
