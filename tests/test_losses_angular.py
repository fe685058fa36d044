"""N-pair + angular loss, Roth et al. 2020 supp. eq. 5 with Wang et al. 2017's f_apn."""

from __future__ import annotations

import math

import pytest
import torch
from losses_testkit import (
    all_pair_lists,
    check_bad_hyper_parameters,
    check_pair_loss_degenerate_bf16_and_empty_pairs,
    check_permutation_invariance,
    given_or_all_pairs,
    loss_gradcheck,
    pair_lists,
    py_dot,
    py_unit,
    random_batch,
    random_pair_subset,
    rows,
    value_and_gradient,
)
from pytorch_metric_learning import losses as pml_losses

from dmlbench import losses
from dmlbench.losses.angular import AngularLoss


def reference_angular(
    embeddings, labels, alpha=math.pi / 4, weight=2.0, nu=0.005, positive_pairs=None, negative_pairs=None
) -> float:
    """L_npair(phi*) + weight/b sum_(a,p) log(1 + sum_n exp(4 tan^2(alpha) (x_a + x_p)^T x_n - 2 (1 + tan^2(alpha)) x_a^T x_p))."""
    raw = rows(embeddings)
    x = [py_unit(row) for row in raw]
    y = labels.tolist()
    positive_pairs, negative_pairs = given_or_all_pairs(y, positive_pairs, negative_pairs)
    positive_pairs = sorted((a, p) for a, p in positive_pairs if a != p)
    if not positive_pairs:
        return 0.0
    tan_squared = math.tan(alpha) ** 2
    npair = angular = 0.0
    for a, p in positive_pairs:
        negatives = [n for n in range(len(y)) if (a, n) in negative_pairs and n != a]
        npair += math.log(1 + sum(math.exp(py_dot(raw[a], raw[n]) - py_dot(raw[a], raw[p])) for n in negatives))
        angular += math.log(
            1
            + sum(
                math.exp(
                    4 * tan_squared * py_dot([u + v for u, v in zip(x[a], x[p])], x[n])
                    - 2 * (1 + tan_squared) * py_dot(x[a], x[p])
                )
                for n in negatives
            )
        )
    regularizer = nu / len(y) * sum(py_dot(row, row) for row in raw)
    return npair / len(y) + regularizer + weight * angular / len(y)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_loop_reference(seed: int) -> None:
    embeddings, labels = random_batch(12, 6, 4, seed=seed, normalize=False)
    assert float(AngularLoss()(embeddings, labels)) == pytest.approx(reference_angular(embeddings, labels), rel=1e-10)


def test_matches_loop_reference_on_mined_pairs_and_other_hyperparameters() -> None:
    embeddings, labels = random_batch(12, 6, 3, seed=3, normalize=False)
    pairs = random_pair_subset(labels, keep=0.4, seed=3)
    positive_pairs, negative_pairs = pair_lists(pairs)
    loss = AngularLoss(alpha=math.radians(36), angular_weight=0.5, regularization=0.0)
    expected = reference_angular(embeddings, labels, math.radians(36), 0.5, 0.0, positive_pairs, negative_pairs)
    assert float(loss(embeddings, labels, pairs)) == pytest.approx(expected, rel=1e-10)


def test_without_angular_weight_it_is_the_npairs_loss() -> None:
    embeddings, labels = random_batch(12, 6, 4, seed=4, normalize=False)
    torch.testing.assert_close(
        AngularLoss(angular_weight=0.0)(embeddings, labels),
        losses.build("npairs")(embeddings, labels),
        rtol=1e-12,
        atol=0,
    )


def test_gradcheck() -> None:
    embeddings, labels = random_batch(8, 4, 3, seed=5, normalize=False)
    assert loss_gradcheck(AngularLoss(), embeddings, labels)
    assert loss_gradcheck(AngularLoss(), embeddings, labels, random_pair_subset(labels, 0.5, seed=2))


def test_angular_term_matches_pytorch_metric_learning() -> None:
    # PML's AngularLoss (alpha in degrees) is the angular term alone, averaged over the ordered
    # positive pairs, on normalised embeddings. Eq. 5 adds the N-pair term and uses weight/b:
    # ours(weight) - ours(0) = weight * |P| / b * PML, for values and gradients. PML normalises x_a
    # and x_p but not x_n, so the embeddings compared are unit vectors.
    embeddings, labels = random_batch(12, 6, 3, seed=6)
    positive_pairs = len(all_pair_lists(labels.tolist())[0])
    full = value_and_gradient(AngularLoss(angular_weight=2.0), embeddings, labels)
    npair_only = value_and_gradient(AngularLoss(angular_weight=0.0), embeddings, labels)
    theirs = value_and_gradient(pml_losses.AngularLoss(alpha=45), embeddings, labels)
    scale = 2.0 * positive_pairs / len(labels)
    torch.testing.assert_close(full[0] - npair_only[0], scale * theirs[0], rtol=1e-9, atol=1e-12)
    # PML's gradient keeps a radial part for x_n that normalisation removes: compare tangent parts.
    def tangent(gradient: torch.Tensor) -> torch.Tensor:
        return gradient - (gradient * embeddings).sum(dim=1, keepdim=True) * embeddings

    torch.testing.assert_close(tangent(full[1] - npair_only[1]), tangent(scale * theirs[1]), rtol=1e-7, atol=1e-10)
    ours_angular = full[1] - npair_only[1]
    torch.testing.assert_close(ours_angular, tangent(ours_angular), rtol=0, atol=1e-12)


def test_degenerate_inputs_bf16_and_empty_tuples() -> None:
    values = check_pair_loss_degenerate_bf16_and_empty_pairs(AngularLoss(), normalize=False, rel=0.05)
    assert values["no_positive_pairs"] == 0


def test_permutation_invariance() -> None:
    embeddings, labels = random_batch(12, 6, 4, seed=8, normalize=False)
    check_permutation_invariance(AngularLoss(), embeddings, labels)


def test_build_and_bad_input() -> None:
    loss = losses.build("angular")
    assert isinstance(loss, AngularLoss) and loss.alpha == pytest.approx(math.pi / 4) and loss.angular_weight == 2.0
    check_bad_hyper_parameters("angular", {"alpha": [0.0, -0.5, math.pi / 2, 45], "angular_weight": [-1]})
