"""Generalised lifted structure loss, Roth et al. 2020 supp. eq. 3."""

from __future__ import annotations

import math

import pytest
import torch
from losses_testkit import (
    assert_same_value_and_gradient,
    check_bad_hyper_parameters,
    check_pair_loss_degenerate_bf16_and_empty_pairs,
    check_permutation_invariance,
    given_or_all_pairs,
    loss_gradcheck,
    pair_lists,
    py_distance,
    py_dot,
    random_batch,
    random_pair_subset,
    rows,
)
from pytorch_metric_learning import distances as pml_distances
from pytorch_metric_learning import losses as pml_losses

from dmlbench import losses
from dmlbench.errors import UserInputError
from dmlbench.losses.generalized_lifted_structure import GeneralizedLiftedStructureLoss


def reference_generalized_lifted(embeddings, labels, margin=1.0, nu=0.005, positive_pairs=None, negative_pairs=None) -> float:
    """Eq. 3: sum_a [log sum_p e^{d_ap} + log sum_n e^{margin - d_an}]_+ + nu/b sum_a ||phi*_a||^2, d on phi*."""
    x = rows(embeddings)
    y = labels.tolist()
    positive_pairs, negative_pairs = given_or_all_pairs(y, positive_pairs, negative_pairs)
    total = 0.0
    any_term = False
    for a in range(len(y)):
        positives = [p for p in range(len(y)) if (a, p) in positive_pairs and p != a]
        negatives = [n for n in range(len(y)) if (a, n) in negative_pairs and n != a]
        if not positives or not negatives:
            continue
        any_term = True
        positive_term = math.log(sum(math.exp(py_distance(x[a], x[p])) for p in positives))
        negative_term = math.log(sum(math.exp(margin - py_distance(x[a], x[n])) for n in negatives))
        total += max(0.0, positive_term + negative_term)
    if not any_term:
        return 0.0
    return total + nu / len(y) * sum(py_dot(row, row) for row in x)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("normalize", [True, False])
def test_matches_loop_reference_on_all_pairs(seed: int, normalize: bool) -> None:
    embeddings, labels = random_batch(12, 6, 4, seed=seed, normalize=normalize)
    value = GeneralizedLiftedStructureLoss()(embeddings, labels)
    assert float(value) == pytest.approx(reference_generalized_lifted(embeddings, labels), rel=1e-10)


def test_matches_loop_reference_on_mined_pairs_and_other_hyperparameters() -> None:
    embeddings, labels = random_batch(12, 6, 3, seed=3, normalize=False)
    pairs = random_pair_subset(labels, keep=0.4, seed=3)
    positive_pairs, negative_pairs = pair_lists(pairs)
    loss = GeneralizedLiftedStructureLoss(margin=0.5, regularization=0.1)
    expected = reference_generalized_lifted(embeddings, labels, 0.5, 0.1, positive_pairs, negative_pairs)
    assert float(loss(embeddings, labels, pairs)) == pytest.approx(expected, rel=1e-10)


def test_hinge_term_is_summed_over_anchors_not_averaged() -> None:
    embeddings, labels = random_batch(8, 4, 2, seed=11, samples_per_class=4)
    doubled = GeneralizedLiftedStructureLoss(regularization=0.0)(
        torch.cat([embeddings, embeddings + 10.0]), torch.cat([labels, labels + 2])
    )
    single = GeneralizedLiftedStructureLoss(regularization=0.0)(embeddings, labels)
    # The far-away copy is a second, independent batch (its negatives to the original are > margin + 9).
    assert float(doubled) == pytest.approx(2 * float(single), rel=1e-6)


def test_gradcheck() -> None:
    embeddings, labels = random_batch(8, 4, 3, seed=5, normalize=False)
    assert loss_gradcheck(GeneralizedLiftedStructureLoss(), embeddings, labels)
    assert loss_gradcheck(GeneralizedLiftedStructureLoss(), embeddings, labels, random_pair_subset(labels, 0.5, seed=2))


@pytest.mark.parametrize("normalize", [True, False])
def test_matches_pytorch_metric_learning_times_batch_size(normalize: bool) -> None:
    # PML's GeneralizedLiftedStructureLoss(neg_margin=margin, pos_margin=0) averages the same per-anchor
    # hinge over the b anchors and has no norm regulariser; eq. 3 sums: ours(nu=0) = b * PML. Only
    # batches where every anchor has a positive compare (PML scores an anchor without positives as
    # relu(0 + negative term), eq. 3 as 0). PML's distance must not normalise to see phi*.
    embeddings, labels = random_batch(12, 6, 4, seed=6, normalize=normalize, samples_per_class=3)
    pml = pml_losses.GeneralizedLiftedStructureLoss(
        neg_margin=1.0, pos_margin=0, distance=pml_distances.LpDistance(normalize_embeddings=False)
    )
    ours = GeneralizedLiftedStructureLoss(regularization=0.0)
    assert_same_value_and_gradient(ours, pml, embeddings, labels, scale=12)


def test_degenerate_inputs_bf16_and_empty_tuples() -> None:
    loss = GeneralizedLiftedStructureLoss()
    values = check_pair_loss_degenerate_bf16_and_empty_pairs(loss, normalize=False, rel=0.05)
    assert values["one_class"] == 0 and values["no_positive_pairs"] == 0


def test_permutation_invariance() -> None:
    embeddings, labels = random_batch(12, 6, 4, seed=8, normalize=False)
    check_permutation_invariance(GeneralizedLiftedStructureLoss(), embeddings, labels)


def test_build_and_bad_input() -> None:
    loss = losses.build("generalized_lifted_structure", margin=2.0, regularization=0.0)
    assert isinstance(loss, GeneralizedLiftedStructureLoss) and loss.uses_tuples
    check_bad_hyper_parameters("generalized_lifted_structure", {"margin": [-0.1], "regularization": [-1.0]})
    with pytest.raises(UserInputError, match="labels"):
        loss(torch.randn(4, 3), torch.zeros(3, dtype=torch.long))
