"""Ranked list loss (Wang et al. 2019b, Fehervari et al. 2019 eq. 6-9)."""

from __future__ import annotations

import math

import pytest
import torch
from losses_testkit import (
    check_bad_hyper_parameters,
    check_pair_loss_degenerate_bf16_and_empty_pairs,
    check_permutation_invariance,
    given_or_all_pairs,
    loss_gradcheck,
    numerical_gradient,
    pair_lists,
    py_distance,
    py_unit,
    random_batch,
    random_pair_subset,
    rows,
    value_and_gradient,
)
from pytorch_metric_learning import losses as pml_losses

from dmlbench import losses
from dmlbench.errors import UserInputError
from dmlbench.losses.ranked_list import RankedListLoss


def reference_ranked_list(
    embeddings,
    labels,
    margin=0.4,
    boundary=1.2,
    temperature=10.0,
    negative_weight=1.0,
    positive_pairs=None,
    negative_pairs=None,
    weights_from=None,
) -> float:
    """1/b sum_i L_P(i) + lambda L_N(i); the weights w_ij = exp(T (alpha - d_ij)) use ``weights_from``."""
    x = [py_unit(row) for row in rows(embeddings)]
    frozen = x if weights_from is None else [py_unit(row) for row in rows(weights_from)]
    y = labels.tolist()
    positive_pairs, negative_pairs = given_or_all_pairs(y, positive_pairs, negative_pairs)
    total = 0.0
    for i in range(len(y)):
        d = {j: py_distance(x[i], x[j]) for j in range(len(y))}
        hard_positives = [j for j in range(len(y)) if (i, j) in positive_pairs and j != i and d[j] > boundary - margin]
        hard_negatives = [j for j in range(len(y)) if (i, j) in negative_pairs and j != i and d[j] < boundary]
        if hard_positives:
            total += sum(d[j] - (boundary - margin) for j in hard_positives) / len(hard_positives)
        if hard_negatives:
            frozen_distance = {j: py_distance(frozen[i], frozen[j]) for j in hard_negatives}
            weights = {j: math.exp(temperature * (boundary - frozen_distance[j])) for j in hard_negatives}
            weighted = sum(weights[j] * (boundary - d[j]) for j in hard_negatives) / sum(weights.values())
            total += negative_weight * weighted
    return total / len(y)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    ("margin", "boundary", "temperature", "negative_weight"),
    [(0.4, 1.2, 10.0, 1.0), (0.2, 1.4, 0.0, 0.5), (1.0, 1.0, 3.0, 2.0)],
)
def test_matches_loop_reference(
    seed: int, margin: float, boundary: float, temperature: float, negative_weight: float
) -> None:
    embeddings, labels = random_batch(12, 4, 3, seed=seed, normalize=False)
    loss = RankedListLoss(margin, boundary, temperature, negative_weight)
    expected = reference_ranked_list(embeddings, labels, margin, boundary, temperature, negative_weight)
    assert float(loss(embeddings, labels)) == pytest.approx(expected, rel=1e-10)


def test_matches_loop_reference_on_mined_pairs() -> None:
    embeddings, labels = random_batch(12, 4, 3, seed=3)
    pairs = random_pair_subset(labels, keep=0.4, seed=3)
    positive_pairs, negative_pairs = pair_lists(pairs)
    expected = reference_ranked_list(embeddings, labels, positive_pairs=positive_pairs, negative_pairs=negative_pairs)
    assert float(RankedListLoss()(embeddings, labels, pairs)) == pytest.approx(expected, rel=1e-10)


def test_classes_inside_their_hyperspheres_and_apart_give_zero() -> None:
    base = torch.eye(4, dtype=torch.float64)
    # Two tight classes on orthogonal axes: positives at distance ~0.1 < 0.8, negatives at ~1.41 > 1.2.
    points = torch.stack([base[0] + 0.05 * base[2], base[0] - 0.05 * base[2], base[1] + 0.05 * base[3], base[1]])
    assert float(RankedListLoss()(points, torch.tensor([0, 0, 1, 1]))) == 0.0


def test_gradient_treats_the_weights_as_constants() -> None:
    # With T = 0 all weights are 1 and the loss is an ordinary function: torch gradcheck applies.
    embeddings, labels = random_batch(8, 4, 3, seed=5, normalize=False)
    assert loss_gradcheck(RankedListLoss(temperature=0.0), embeddings, labels)
    assert loss_gradcheck(RankedListLoss(temperature=0.0), embeddings, labels, random_pair_subset(labels, 0.6, seed=2))
    # With T > 0 the paper (and its code) hold w fixed: compare with central finite differences of the
    # loop reference whose weights are frozen at the evaluation point.
    _, gradient = value_and_gradient(RankedListLoss(), embeddings, labels)

    def frozen(e: torch.Tensor) -> float:
        return reference_ranked_list(e, labels, weights_from=embeddings)

    torch.testing.assert_close(gradient, numerical_gradient(frozen, embeddings), rtol=1e-6, atol=1e-8)


@pytest.mark.filterwarnings("ignore:Values of Tp or Tn are too high:UserWarning")
def test_matches_pytorch_metric_learning_up_to_imbalance_and_stabiliser() -> None:
    # PML's RankedListLoss(margin, Tn, imbalance, alpha, Tp=0) computes (1 - imbalance) L_P + imbalance L_N
    # per anchor, mean over b, with 1e-5 added to every weight in the normalisers, and differentiates
    # through the weights. With imbalance = 0.5: ours(lambda = 1) = 2 * PML up to the stabiliser; the
    # gradients agree when T = 0 (constant weights).
    embeddings, labels = random_batch(16, 6, 4, seed=6, normalize=False)
    for temperature in (10.0, 0.0):
        pml = pml_losses.RankedListLoss(margin=0.4, Tn=temperature, imbalance=0.5, alpha=1.2, Tp=0)
        ours = value_and_gradient(RankedListLoss(temperature=temperature), embeddings, labels)
        theirs = value_and_gradient(pml, embeddings, labels)
        torch.testing.assert_close(ours[0], 2 * theirs[0], rtol=1e-3, atol=0)
    torch.testing.assert_close(ours[1], 2 * theirs[1], rtol=1e-3, atol=1e-6)


def test_degenerate_inputs_bf16_and_empty_tuples() -> None:
    values = check_pair_loss_degenerate_bf16_and_empty_pairs(RankedListLoss(), rel=0.05)
    assert values["one_class"] >= 0 and values["identical_embeddings"] > 0


def test_large_temperature_stays_finite() -> None:
    embeddings, labels = random_batch(12, 6, 3, seed=9, dtype=torch.float32)
    value, gradient = value_and_gradient(RankedListLoss(temperature=1000.0), embeddings, labels)
    assert torch.isfinite(value) and torch.isfinite(gradient).all()


def test_permutation_invariance() -> None:
    embeddings, labels = random_batch(12, 6, 4, seed=8)
    check_permutation_invariance(RankedListLoss(), embeddings, labels)


def test_build_and_bad_input() -> None:
    loss = losses.build("ranked_list")
    assert (loss.margin, loss.boundary, loss.temperature, loss.negative_weight) == (0.4, 1.2, 10.0, 1.0)
    bad = {"margin": [0.0], "boundary": [-1.0], "temperature": [-1.0], "negative_weight": [-0.5]}
    check_bad_hyper_parameters("ranked_list", bad)
    with pytest.raises(UserInputError, match="margin must not exceed boundary"):
        losses.build("ranked_list", margin=1.5, boundary=1.2)
