"""SNR loss (Yuan et al. 2019, Roth et al. 2020 supp. eq. 15): loop reference, zero variance, PML cross-check."""

from __future__ import annotations

import pytest
import torch
from losses_testkit import (
    LOOP_REFERENCE_TOLERANCES,
    assert_same_value_and_gradient,
    check_degenerate_inputs,
    check_empty_tuple_sets_keep_graph,
    check_tuple_loss_bf16,
    empty_triplets,
    loss_gradcheck,
    mined_tuples,
    random_batch,
    reference_triplets,
)
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import reducers as pml_reducers
from pytorch_metric_learning.distances import SNRDistance

from dmlbench import losses, mining
from dmlbench.errors import UserInputError
from dmlbench.losses.snr import snr_distances


def variance(v: torch.Tensor) -> torch.Tensor:
    """Variance over the dimensions as a loop: (1/D) sum_m (v_m - mean)^2."""
    size = len(v)
    mean = sum(v[m] for m in range(size)) / size
    return sum((v[m] - mean) ** 2 for m in range(size)) / size


def snr(anchor: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    return variance(other - anchor) / variance(anchor)


def reference(x: torch.Tensor, triplets: list, margin: float = 0.2, regularization: float = 0.005) -> torch.Tensor:
    """Eq. 15 with Yuan et al.'s variances: mean over triplets + lambda/b sum_i |sum_m phi_im|."""
    ranking = sum(torch.clamp(snr(x[a], x[p]) - snr(x[a], x[n]) + margin, min=0) for a, p, n in triplets) / len(triplets)
    penalty = sum(abs(sum(x[i][m] for m in range(x.shape[1]))) for i in range(len(x))) / len(x)
    return ranking + regularization * penalty


@pytest.mark.parametrize("kind", ["all", "pairs", "distance_weighted"])
@pytest.mark.parametrize("normalize", [True, False])
def test_matches_loop_reference_values_and_gradients(kind: str, normalize: bool) -> None:
    embeddings, labels = random_batch(10, 5, 3, seed=1, normalize=normalize)
    tuples = mined_tuples(kind, embeddings, labels, keep=0.4, pair_seed=2, miner_seed=3)
    triplets = reference_triplets(labels, tuples)
    loss = losses.build("snr")
    assert_same_value_and_gradient(
        lambda e, y: loss(e, y, tuples),
        lambda e, y: reference(e, triplets),
        embeddings,
        labels,
        **LOOP_REFERENCE_TOLERANCES,
    )


def test_snr_distance_properties() -> None:
    embeddings, _ = random_batch(6, 8, 2, seed=4, normalize=False)
    distances = snr_distances(embeddings)
    assert torch.allclose(distances.diagonal(), torch.zeros(6, dtype=torch.float64))
    # invariant to a common scale and to per-embedding shifts along the all-ones direction
    torch.testing.assert_close(snr_distances(3.0 * embeddings), distances)
    shifted = embeddings + torch.randn(6, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(snr_distances(shifted), distances)
    # not symmetric: the anchor's variance is the signal
    assert not torch.allclose(distances, distances.T)


def test_snr_distance_matches_pytorch_metric_learning() -> None:
    # PML's SNRDistance uses the unbiased variance for both (the ratio is the same) and by default
    # L2-normalises first, which changes d_S of unnormalised embeddings (the numerator mixes scales)
    embeddings, _ = random_batch(7, 6, 2, seed=6, normalize=False)
    pml = SNRDistance(normalize_embeddings=False)(embeddings)
    torch.testing.assert_close(snr_distances(embeddings), pml, rtol=1e-10, atol=1e-12)
    normalized = torch.nn.functional.normalize(embeddings, dim=1)
    torch.testing.assert_close(snr_distances(normalized), SNRDistance()(embeddings), rtol=1e-10, atol=1e-12)


def test_cross_check_loss_with_pytorch_metric_learning() -> None:
    # Our ranking term is PML's TripletMarginLoss(margin=0.2, distance=SNRDistance()) with
    # MeanReducer (mean over all triplets); PML has no zero-mean regulariser, added here by hand.
    # normalize_embeddings=False: PML would otherwise differentiate through its own L2 normalisation.
    # (PML's SignalToNoiseRatioContrastiveLoss is the contrastive form of Yuan et al., not eq. 15.)
    embeddings, labels = random_batch(12, 8, 3, seed=7)
    pml = pml_losses.TripletMarginLoss(
        margin=0.2, distance=SNRDistance(normalize_embeddings=False), reducer=pml_reducers.MeanReducer()
    )

    def pml_mapped(e: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return pml(e, y) + 0.005 * e.sum(dim=1).abs().mean()

    assert_same_value_and_gradient(losses.build("snr"), pml_mapped, embeddings, labels, gradient_tol=(1e-6, 1e-9))


def test_zero_variance_is_guarded() -> None:
    loss = losses.build("snr")
    values = check_degenerate_inputs(loss)
    # identical constant embeddings: every SNR distance is 0 (guarded 0/0) and the loss is the margin + penalty
    constant = torch.nn.functional.normalize(torch.ones(1, 8, dtype=torch.float64), dim=1).repeat(4, 1)
    expected = 0.2 + 0.005 * constant.sum(dim=1).abs().mean()
    torch.testing.assert_close(values["identical_constant_embeddings"], expected)
    distances = snr_distances(torch.cat([constant[:1], torch.randn(1, 8, dtype=torch.float64)]))
    assert torch.isfinite(distances).all()


def test_gradcheck() -> None:
    embeddings, labels = random_batch(8, 5, 3, seed=8, normalize=False)
    assert loss_gradcheck(losses.build("snr"), embeddings, labels)
    triplets = mining.build("random")(embeddings, labels)
    assert loss_gradcheck(losses.build("snr", margin=0.5, regularization=0.1), embeddings, labels, triplets)


def test_bf16_autocast_and_empty_tuples() -> None:
    loss = losses.build("snr")
    check_tuple_loss_bf16(loss, seed=9, rtol=5e-2, atol=3e-2)
    # without tuples only the regulariser remains, and it keeps the graph
    embeddings, labels = random_batch(16, 8, 4, seed=9)
    check_empty_tuple_sets_keep_graph(losses.build("snr", regularization=0.0), embeddings, labels)
    penalty_only = loss(embeddings, labels, empty_triplets())
    torch.testing.assert_close(penalty_only, 0.005 * embeddings.sum(dim=1).abs().mean())


@pytest.mark.parametrize(("hparams", "parameter"), [({"margin": -0.2}, "margin"), ({"regularization": -1.0}, "regularization"), ({"lam": 0.1}, "lam")])
def test_bad_hyper_parameters_name_the_parameter(hparams: dict, parameter: str) -> None:
    with pytest.raises(UserInputError, match=parameter):
        losses.build("snr", **hparams)
