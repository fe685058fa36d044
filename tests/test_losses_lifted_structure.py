"""Lifted structure loss (Oh Song et al. 2016) and the shared pair-mask helpers."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from losses_testkit import (
    assert_same_value_and_gradient,
    check_bad_hyper_parameters,
    check_empty_tuples_keep_graph,
    check_pair_loss_degenerate_bf16_and_empty_pairs,
    check_permutation_invariance,
    given_or_all_pairs,
    loss_gradcheck,
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
from dmlbench.losses.lifted_structure import LiftedStructureLoss
from dmlbench.losses.pair_masks import masked_logsumexp, pair_masks
from dmlbench.mining.tuples import Pairs, Triplets, all_pairs, all_triplets


def reference_lifted_structure(embeddings, labels, margin=1.0, positive_pairs=None, negative_pairs=None) -> float:
    """Oh Song et al. 2016: J = 1/(2|P|) sum_P [log(sum_{(i,k) in N} e^{margin-D_ik} + sum_{(j,l) in N} e^{margin-D_jl}) + D_ij]_+^2."""
    x = [py_unit(row) for row in rows(embeddings)]
    y = labels.tolist()
    positive_pairs, negative_pairs = given_or_all_pairs(y, positive_pairs, negative_pairs)
    positive_set = {(i, j) for i, j in positive_pairs if i != j}
    neighbours = {i: set() for i in range(len(y))}
    for i, k in negative_pairs:
        if i != k:
            neighbours[i].add(k)
            neighbours[k].add(i)
    total = 0.0
    for i, j in positive_set:
        inner = sum(math.exp(margin - py_distance(x[i], x[k])) for k in neighbours[i])
        inner += sum(math.exp(margin - py_distance(x[j], x[l])) for l in neighbours[j])
        if inner > 0:
            total += max(0.0, math.log(inner) + py_distance(x[i], x[j])) ** 2
    return total / (2 * len(positive_set))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("margin", [1.0, 0.3])
def test_matches_loop_reference_on_all_pairs(seed: int, margin: float) -> None:
    embeddings, labels = random_batch(12, 6, 4, seed=seed)
    value = LiftedStructureLoss(margin=margin)(embeddings, labels)
    assert value > 0
    assert float(value) == pytest.approx(reference_lifted_structure(embeddings, labels, margin), rel=1e-10)


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_loop_reference_on_mined_pairs(seed: int) -> None:
    embeddings, labels = random_batch(12, 6, 3, seed=seed)
    pairs = random_pair_subset(labels, keep=0.4, seed=seed)
    positive_pairs, negative_pairs = pair_lists(pairs)
    expected = reference_lifted_structure(embeddings, labels, 1.0, positive_pairs, negative_pairs)
    assert float(LiftedStructureLoss()(embeddings, labels, pairs)) == pytest.approx(expected, rel=1e-10)


def test_unnormalised_input_is_normalised_first() -> None:
    embeddings, labels = random_batch(10, 5, 3, seed=4, normalize=False)
    loss = LiftedStructureLoss()
    unit = torch.nn.functional.normalize(embeddings, dim=1)
    torch.testing.assert_close(loss(3.0 * embeddings, labels), loss(unit, labels), rtol=1e-12, atol=0)


def test_gradcheck() -> None:
    embeddings, labels = random_batch(8, 4, 3, seed=5, normalize=False)
    assert loss_gradcheck(LiftedStructureLoss(), embeddings, labels)
    assert loss_gradcheck(LiftedStructureLoss(), embeddings, labels, random_pair_subset(labels, 0.5, seed=1))


def test_matches_pytorch_metric_learning_values_and_gradients() -> None:
    # PML's LiftedStructureLoss(neg_margin, pos_margin=0) averages relu(J)^2 / 2 over ordered positive
    # pairs, with the negatives of both ends, on normalised embeddings: the same definition.
    embeddings, labels = random_batch(16, 8, 4, seed=6, normalize=False)
    pml = pml_losses.LiftedStructureLoss(neg_margin=0.8, pos_margin=0)
    assert_same_value_and_gradient(LiftedStructureLoss(margin=0.8), pml, embeddings, labels)


def test_degenerate_inputs_bf16_and_empty_tuples() -> None:
    loss = LiftedStructureLoss()
    values = check_pair_loss_degenerate_bf16_and_empty_pairs(loss, rel=0.05)
    assert values["one_class"] == 0 and values["no_positive_pairs"] == 0
    embeddings, labels = random_batch(12, 8, 3, seed=7)
    check_empty_tuples_keep_graph(loss, embeddings, labels, Triplets(*(torch.empty(0, dtype=torch.long),) * 3))


def test_permutation_invariance() -> None:
    embeddings, labels = random_batch(12, 6, 4, seed=8)
    check_permutation_invariance(LiftedStructureLoss(), embeddings, labels)


def test_build_and_bad_input() -> None:
    loss = losses.build("lifted_structure", margin=0.5)
    assert isinstance(loss, LiftedStructureLoss) and loss.uses_tuples and loss.margin == 0.5
    check_bad_hyper_parameters("lifted_structure", {"margin": [0.0, -1.0, float("nan")], "alpha": [1.0]})
    embeddings, labels = random_batch(6, 4, 2)
    with pytest.raises(UserInputError, match="labels"):
        loss(embeddings, labels[:5])
    with pytest.raises(UserInputError, match="labels"):
        loss(embeddings, labels.double())
    with pytest.raises(UserInputError, match="embeddings"):
        loss(embeddings[0], labels)
    out_of_batch = Pairs(torch.tensor([0]), torch.tensor([6]), torch.tensor([0]), torch.tensor([1]))
    with pytest.raises(UserInputError, match="tuples.positives"):
        loss(embeddings, labels, out_of_batch)


# --- the shared helpers --------------------------------------------------------------------------


def test_pair_masks_without_tuples_equal_all_pairs_and_all_triplets() -> None:
    _, labels = random_batch(10, 2, 3, seed=9)
    positive, negative = pair_masks(labels)
    from_pairs = pair_masks(labels, all_pairs(labels))
    assert torch.equal(from_pairs[0], positive) and torch.equal(from_pairs[1], negative)
    # A triplet needs a positive, so anchors of singleton classes lose their negatives.
    from_triplets = pair_masks(labels, all_triplets(labels))
    has_positive = positive.any(dim=1, keepdim=True)
    assert not has_positive.all(), "the batch should contain a singleton class"
    assert torch.equal(from_triplets[0], positive) and torch.equal(from_triplets[1], negative & has_positive)
    same = labels.unsqueeze(0) == labels.unsqueeze(1)
    assert torch.equal(positive, same & ~torch.eye(10, dtype=torch.bool))
    assert torch.equal(negative, ~same)


def test_pair_masks_keep_exactly_the_listed_pairs_without_the_diagonal() -> None:
    labels = torch.tensor([0, 0, 1, 1])
    pairs = Pairs(torch.tensor([0, 0, 2]), torch.tensor([1, 0, 3]), torch.tensor([1, 1]), torch.tensor([0, 2]))
    positive, negative = pair_masks(labels, pairs)
    assert positive.nonzero().tolist() == [[0, 1], [2, 3]]
    # (1, 0) is a same-class "negative" (as rho-regularisation produces); it is kept as listed.
    assert negative.nonzero().tolist() == [[1, 0], [1, 2]]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=9), st.floats(0.0, 1.0), st.integers(0, 10**6))
def test_pair_masks_hold_the_listed_off_diagonal_pairs(labels: list[int], keep: float, seed: int) -> None:
    labels_tensor = torch.tensor(labels)
    pairs = random_pair_subset(labels_tensor, keep=keep, seed=seed)
    positive, negative = pair_masks(labels_tensor, pairs)
    listed_positive, listed_negative = pair_lists(pairs)
    assert {tuple(pair) for pair in positive.nonzero().tolist()} == {(i, j) for i, j in listed_positive if i != j}
    assert {tuple(pair) for pair in negative.nonzero().tolist()} == set(listed_negative)
    assert not (positive | negative).diagonal().any()


def test_masked_logsumexp_empty_rows_are_minus_infinity_with_finite_gradients() -> None:
    values = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, False, True, True], [False] * 4, [False, False, False, True]])
    result = masked_logsumexp(values, mask, dim=1)
    assert result[1] == float("-inf")
    torch.testing.assert_close(result[0], torch.logsumexp(values[0, [0, 2, 3]], dim=0))
    torch.testing.assert_close(result[2], values[2, 3])
    torch.relu(result).sum().backward()
    assert torch.isfinite(values.grad).all() and (values.grad[1] == 0).all() and (values.grad[0, 1] == 0)


# --- every batch-wise pair/list loss consumes every miner's tuples ----------------------------------

BATCH_WISE_LOSSES = [
    "lifted_structure", "generalized_lifted_structure", "npairs", "nt_xent", "angular",
    "multi_similarity", "circle", "histogram", "fastap", "ranked_list",
]


@pytest.mark.parametrize("miner_name", ["random", "semihard", "distance_weighted", "multi_similarity"])
@pytest.mark.parametrize("p_switch", [0.0, 1.0])
def test_batch_wise_losses_accept_mined_tuples_with_rho_regularisation(miner_name: str, p_switch: float) -> None:
    from dmlbench import mining

    embeddings, labels = random_batch(16, 8, 4, seed=10, samples_per_class=4)
    miner = mining.build(miner_name, p_switch=p_switch, generator=torch.Generator().manual_seed(3))
    tuples = miner(embeddings, labels)
    positive, negative = pair_masks(labels, tuples)
    same_class_negatives = int((negative & (labels.unsqueeze(0) == labels.unsqueeze(1))).sum())
    assert (same_class_negatives > 0) == (p_switch == 1.0)
    for name in BATCH_WISE_LOSSES:
        loss = losses.build(name)
        assert loss.uses_tuples
        value, gradient = value_and_gradient(lambda e, l: loss(e, l, tuples), embeddings, labels)
        assert torch.isfinite(value) and torch.isfinite(gradient).all(), name
