"""Signal-to-noise-ratio (SNR) triplet loss."""

from __future__ import annotations

from torch import Tensor

from dmlbench.distances import check_batch, squared_euclidean
from dmlbench.losses.base import LOSSES, MetricLoss, zero_loss
from dmlbench.mining.tuples import Tuples, all_triplets, to_triplets
from dmlbench.validation import check_non_negative

# Var(phi_i) = 0 (all components equal) would divide by zero; the sum of squares is clamped here
_MIN_SQUARED_DEVIATION = 1e-12


def snr_distances(embeddings: Tensor) -> Tensor:
    """SNR distance ``d_S(i, j) = Var(phi_j - phi_i) / Var(phi_i)``, Yuan et al. 2019 eq. 5, for all pairs.

    Variances are taken over the embedding dimensions, centred, and the ``1/D`` cancels:
    ``d_S(i, j) = |c_j - c_i|^2 / |c_i|^2`` with ``c = phi - mean_m(phi)``. Not symmetric: row
    ``i`` is the anchor whose variance is the signal.
    """
    centred = embeddings - embeddings.mean(dim=1, keepdim=True)
    signal = centred.square().sum(dim=1, keepdim=True).clamp_min(_MIN_SQUARED_DEVIATION)
    return squared_euclidean(centred) / signal


@LOSSES.register("snr")
class SNRLoss(MetricLoss):
    """SNR triplet loss, Yuan et al. 2019 / Roth et al. 2020 supp. eq. 15: [d_S(a,p) - d_S(a,n) + margin]_+ + penalty.

    The penalty is ``lambda/b sum_i |sum_m phi_im|`` (``regularization`` = lambda).

    The printed eq. 15 lost the squares and the centring of Yuan et al.'s variances (its numerator
    ``sum_m (phi_im - phi_jm)`` is a signed sum, not a distance); the SNR distance here is
    ``Var(phi_j - phi_i) / Var(phi_i)`` as in Yuan et al. and the authors' code (``snr_distances``).
    The regulariser pushes every embedding towards zero mean over its dimensions, which Yuan et al.
    assume; it averages over the whole batch as eq. 15 writes (the authors' code: over the triplets'
    anchors). Zero variance is guarded by clamping ``|c_i|^2`` at 1e-12. Accepts normalised or
    unnormalised embeddings (d_S is invariant to a common scale and to per-sample shifts along the
    all-ones direction). Reduction: eq. 15 writes a bare sum over triplets; here their mean (zeros
    included). Pairs become every (positive pair, negative pair) combination sharing an anchor;
    without tuples every valid triplet of the batch is used; triplets are trusted as given.
    """

    uses_tuples = True

    def __init__(self, margin: float = 0.2, regularization: float = 0.005) -> None:
        super().__init__()
        self.margin = check_non_negative("margin", margin)
        self.regularization = check_non_negative("regularization", regularization)

    def forward(self, embeddings: Tensor, labels: Tensor, tuples: Tuples | None = None) -> Tensor:
        check_batch(embeddings, labels)
        triplets = all_triplets(labels) if tuples is None else to_triplets(tuples)
        regularizer = self.regularization * embeddings.sum(dim=1).abs().mean()
        if len(triplets) == 0:
            return zero_loss(embeddings) + regularizer
        distances = snr_distances(embeddings)
        d_ap = distances[triplets.anchors, triplets.positives]
        d_an = distances[triplets.anchors, triplets.negatives]
        return (d_ap - d_an + self.margin).relu().mean() + regularizer
