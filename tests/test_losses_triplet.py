"""Triplet loss (Roth et al. 2020 supp. eq. 2): loop reference, gradcheck, degenerate inputs, PML cross-check."""

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
    random_pair_subset,
    reference_triplets,
    tensor_distance,
    triplet_set,
)
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import reducers as pml_reducers
from pytorch_metric_learning.distances import LpDistance

from dmlbench import losses, mining
from dmlbench.errors import UserInputError
from dmlbench.mining import to_triplets


def reference(x: torch.Tensor, triplets: list[tuple[int, int, int]], margin: float = 0.2) -> torch.Tensor:
    """Eq. 2 as a loop: 1/b over the b triplets of [d_ap - d_an + margin]_+."""
    terms = [
        torch.clamp(tensor_distance(x[a], x[p]) - tensor_distance(x[a], x[n]) + margin, min=0) for a, p, n in triplets
    ]
    return sum(terms) / len(terms)


@pytest.mark.parametrize("kind", ["all", "pairs", "semihard", "distance_weighted", "hard"])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_loop_reference_values_and_gradients(kind: str, seed: int) -> None:
    embeddings, labels = random_batch(12, 6, 3, seed=seed)
    tuples = mined_tuples(kind, embeddings, labels, keep=0.5, pair_seed=seed, miner_seed=seed)
    triplets = reference_triplets(labels, tuples)
    loss = losses.build("triplet")
    assert_same_value_and_gradient(
        lambda e, y: loss(e, y, tuples),
        lambda e, y: reference(e, triplets),
        embeddings,
        labels,
        **LOOP_REFERENCE_TOLERANCES,
    )


def test_pairs_become_every_positive_negative_combination_of_an_anchor() -> None:
    embeddings, labels = random_batch(10, 4, 3, seed=2)
    pairs = random_pair_subset(labels, keep=0.5, seed=3)
    positive = set(zip(pairs.positive_anchors.tolist(), pairs.positives.tolist()))
    negative = set(zip(pairs.negative_anchors.tolist(), pairs.negatives.tolist()))
    expected = {(a, p, n) for a, p in positive for b, n in negative if a == b}
    assert triplet_set(to_triplets(pairs)) == expected


def test_gradcheck() -> None:
    embeddings, labels = random_batch(8, 4, 3, seed=4)
    assert loss_gradcheck(losses.build("triplet"), embeddings, labels)
    triplets = mining.build("random")(embeddings, labels)
    assert loss_gradcheck(losses.build("triplet", margin=0.5), embeddings, labels, triplets)


def test_degenerate_inputs_and_bf16_stay_finite() -> None:
    loss = losses.build("triplet")
    values = check_degenerate_inputs(loss)
    torch.testing.assert_close(values["identical_embeddings"], torch.tensor(0.2, dtype=torch.float64))
    assert values["no_positive_pairs"] == 0 and values["one_class"] == 0
    check_tuple_loss_bf16(loss, seed=5, rtol=5e-2, atol=2e-2)


def test_empty_tuple_sets_give_a_zero_that_keeps_the_graph() -> None:
    embeddings, labels = random_batch(6, 4, 2, seed=6)
    loss = losses.build("triplet")
    check_empty_tuple_sets_keep_graph(loss, embeddings, labels)


@pytest.mark.parametrize("kind", ["all", "semihard"])
def test_cross_check_with_pytorch_metric_learning(kind: str) -> None:
    # PML TripletMarginLoss(margin=0.2) is eq. 2 per triplet; its default AvgNonZeroReducer averages
    # only the non-zero triplets, MeanReducer averages all of them like eq. 2's 1/b. Without an
    # indices tuple both use every valid triplet. LpDistance(normalize_embeddings=False) keeps the
    # gradient unprojected (inputs are unit vectors already).
    embeddings, labels = random_batch(16, 8, 4, seed=7)
    tuples = None
    if kind == "semihard":
        tuples = mining.build("semihard", all_triplets=True, margin=0.4)(embeddings, labels)
    pml = pml_losses.TripletMarginLoss(
        margin=0.2, distance=LpDistance(normalize_embeddings=False), reducer=pml_reducers.MeanReducer()
    )
    indices = None if tuples is None else (tuples.anchors, tuples.positives, tuples.negatives)
    ours = losses.build("triplet")
    value = assert_same_value_and_gradient(
        lambda e, y: ours(e, y, tuples), lambda e, y: pml(e, y, indices), embeddings, labels, gradient_tol=(1e-6, 1e-9)
    )
    # and the AvgNonZero mapping: ours * n_triplets / n_nonzero
    nonzero_pml = pml_losses.TripletMarginLoss(margin=0.2, distance=LpDistance(normalize_embeddings=False))
    triplets = mining.all_triplets(labels) if tuples is None else tuples
    d = torch.cdist(embeddings, embeddings)
    active = (d[triplets.anchors, triplets.positives] - d[triplets.anchors, triplets.negatives] + 0.2 > 0).sum()
    torch.testing.assert_close(value * len(triplets) / active, nonzero_pml(embeddings, labels, indices).detach())


@pytest.mark.parametrize(("hparams", "parameter"), [({"margin": -0.2}, "margin"), ({"margin": float("nan")}, "margin"), ({"swap": True}, "swap")])
def test_bad_hyper_parameters_name_the_parameter(hparams: dict, parameter: str) -> None:
    with pytest.raises(UserInputError, match=parameter):
        losses.build("triplet", **hparams)


def test_mismatched_shapes_name_the_parameter() -> None:
    embeddings, labels = random_batch(6, 4, 2, seed=8)
    with pytest.raises(UserInputError, match="embeddings"):
        losses.build("triplet")(embeddings[0], labels)
