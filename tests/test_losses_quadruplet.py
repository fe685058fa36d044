"""Quadruplet loss (Chen et al. 2017, Roth et al. 2020 supp. eq. 14): loop reference, gradcheck, degenerate inputs.

pytorch-metric-learning has no quadruplet loss; the cross-check is the triplet term against our
(separately PML-checked) triplet loss.
"""

from __future__ import annotations

import pytest
import torch
from losses_testkit import (
    LOOP_REFERENCE_TOLERANCES,
    assert_same_value_and_gradient,
    check_degenerate_inputs,
    check_empty_tuple_sets_keep_graph,
    check_tuple_loss_bf16,
    loss_gradcheck,
    mined_tuples,
    random_batch,
    reference_triplets,
    tensor_distance,
)

from dmlbench import losses, mining
from dmlbench.errors import UserInputError


def reference(x: torch.Tensor, labels: list[int], triplets: list, margin_1: float = 1.0, margin_2: float = 0.5) -> torch.Tensor:
    """Eq. 14 as loops (second distance pair as in Chen et al.: d_ij - d_lk); means over triplets and over quadruplets."""
    triplet_terms, quadruplet_terms = [], []
    for i, j, k in triplets:
        d_ij = tensor_distance(x[i], x[j])
        triplet_terms.append(torch.clamp(d_ij - tensor_distance(x[i], x[k]) + margin_1, min=0))
        for l in range(len(labels)):
            if labels[l] != labels[k] and labels[l] != labels[i]:
                quadruplet_terms.append(torch.clamp(d_ij - tensor_distance(x[l], x[k]) + margin_2, min=0))
    quadruplet = sum(quadruplet_terms) / len(quadruplet_terms) if quadruplet_terms else 0.0
    return sum(triplet_terms) / len(triplet_terms) + quadruplet


@pytest.mark.parametrize("kind", ["all", "pairs", "distance_weighted", "softhard"])
@pytest.mark.parametrize("margins", [(1.0, 0.5), (0.3, 0.1)])
def test_matches_loop_reference_values_and_gradients(kind: str, margins: tuple[float, float]) -> None:
    embeddings, labels = random_batch(10, 5, 4, seed=1)
    tuples = mined_tuples(kind, embeddings, labels, keep=0.4, pair_seed=2, miner_seed=3)
    triplets = reference_triplets(labels, tuples)
    loss = losses.build("quadruplet", margin_1=margins[0], margin_2=margins[1])
    assert_same_value_and_gradient(
        lambda e, y: loss(e, y, tuples),
        lambda e, y: reference(e, y.tolist(), triplets, *margins),
        embeddings,
        labels,
        **LOOP_REFERENCE_TOLERANCES,
    )


def test_sorted_prefix_sum_path_equals_explicit_enumeration() -> None:
    # without tuples the quadruplet term is summed through sorted rows; passing every triplet
    # explicitly takes the enumeration path; both must agree in value and gradient
    embeddings, labels = random_batch(30, 8, 7, seed=8, samples_per_class=3)
    loss = losses.build("quadruplet", margin_1=0.3, margin_2=0.6)
    every = mining.all_triplets(labels)
    assert_same_value_and_gradient(
        loss, lambda e, y: loss(e, y, every), embeddings, labels, **LOOP_REFERENCE_TOLERANCES
    )


def test_triplet_term_equals_the_triplet_loss_when_no_fourth_sample_exists() -> None:
    # two classes: no l differs from both the anchor's and the negative's class
    embeddings, labels = random_batch(8, 4, 2, seed=4, samples_per_class=4)
    quadruplet = losses.build("quadruplet", margin_1=0.2)(embeddings, labels)
    torch.testing.assert_close(quadruplet, losses.build("triplet", margin=0.2)(embeddings, labels))


def test_gradcheck() -> None:
    embeddings, labels = random_batch(9, 4, 3, seed=5)
    assert loss_gradcheck(losses.build("quadruplet"), embeddings, labels)
    triplets = mining.build("random")(embeddings, labels)
    assert loss_gradcheck(losses.build("quadruplet", margin_1=0.4, margin_2=0.3), embeddings, labels, triplets)


def test_degenerate_inputs_and_bf16_stay_finite() -> None:
    loss = losses.build("quadruplet")
    values = check_degenerate_inputs(loss)
    torch.testing.assert_close(values["identical_embeddings"], torch.tensor(1.0, dtype=torch.float64))
    check_tuple_loss_bf16(loss, seed=6, rtol=3e-2, atol=3e-2)


def test_empty_tuple_sets_give_a_zero_that_keeps_the_graph() -> None:
    embeddings, labels = random_batch(6, 4, 3, seed=7)
    loss = losses.build("quadruplet")
    check_empty_tuple_sets_keep_graph(loss, embeddings, labels)


@pytest.mark.parametrize(("hparams", "parameter"), [({"margin_1": -1.0}, "margin_1"), ({"margin_2": -0.5}, "margin_2"), ({"margin": 1.0}, "margin")])
def test_bad_hyper_parameters_name_the_parameter(hparams: dict, parameter: str) -> None:
    with pytest.raises(UserInputError, match=parameter):
        losses.build("quadruplet", **hparams)
