"""Contrastive loss (Roth et al. 2020 supp. eq. 1): loop reference, gradcheck, degenerate inputs, PML cross-check."""

from __future__ import annotations

import pytest
import torch
from losses_testkit import (
    LOOP_REFERENCE_TOLERANCES,
    all_pair_lists,
    assert_same_value_and_gradient,
    check_degenerate_inputs,
    check_empty_tuple_sets_keep_graph,
    check_empty_tuples_keep_graph,
    check_tuple_loss_bf16,
    loss_gradcheck,
    mined_tuples,
    random_batch,
    random_pair_subset,
    reference_pairs,
)
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import reducers as pml_reducers
from pytorch_metric_learning.distances import LpDistance

from dmlbench import losses, mining
from dmlbench.errors import UserInputError
from dmlbench.mining import to_pairs


def reference(x: torch.Tensor, positive: list, negative: list, margin: float = 1.0) -> torch.Tensor:
    """Eq. 1 as loops: 1/b over the b pairs of d (positive) and [margin - d]_+ (negative)."""
    terms = [torch.sqrt(((x[i] - x[j]) ** 2).sum()) for i, j in positive]
    terms += [torch.clamp(margin - torch.sqrt(((x[i] - x[j]) ** 2).sum()), min=0) for i, j in negative]
    return sum(terms) / len(terms)


def mined(kind: str, embeddings: torch.Tensor, labels: torch.Tensor):
    return mined_tuples(kind, embeddings, labels, keep=0.4, pair_seed=3, miner_seed=4)


@pytest.mark.parametrize("kind", ["all", "pairs", "distance_weighted", "multi_similarity"])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_loop_reference_values_and_gradients(kind: str, seed: int) -> None:
    embeddings, labels = random_batch(14, 6, 4, seed=seed)
    tuples = mined(kind, embeddings, labels)
    positive, negative = reference_pairs(labels, tuples)
    loss = losses.build("contrastive", margin=1.0)
    assert_same_value_and_gradient(
        lambda e, y: loss(e, y, tuples),
        lambda e, y: reference(e, positive, negative),
        embeddings,
        labels,
        **LOOP_REFERENCE_TOLERANCES,
    )


def test_margin_is_a_hyper_parameter() -> None:
    embeddings, labels = random_batch(10, 4, 3, seed=2)
    positive, negative = all_pair_lists(labels.tolist())
    value = losses.build("contrastive", margin=0.7)(embeddings, labels)
    torch.testing.assert_close(value, reference(embeddings, positive, negative, margin=0.7))


def test_triplets_count_as_their_two_pairs() -> None:
    embeddings, labels = random_batch(10, 4, 3, seed=5)
    triplets = mining.build("random")(embeddings, labels)
    loss = losses.build("contrastive")
    torch.testing.assert_close(loss(embeddings, labels, triplets), loss(embeddings, labels, to_pairs(triplets)))


def test_gradcheck() -> None:
    embeddings, labels = random_batch(8, 4, 3, seed=6)
    assert loss_gradcheck(losses.build("contrastive"), embeddings, labels)
    pairs = random_pair_subset(labels, keep=0.5, seed=7)
    assert loss_gradcheck(losses.build("contrastive", margin=0.5), embeddings, labels, pairs)


def test_degenerate_inputs_and_bf16_stay_finite() -> None:
    loss = losses.build("contrastive")
    values = check_degenerate_inputs(loss)
    # identical embeddings: positives at 0, negatives at 0 -> the negative term is the margin
    assert values["identical_embeddings"] > 0
    assert values["one_class"] >= 0
    check_tuple_loss_bf16(loss, seed=8, rtol=3e-2, atol=3e-2)


def test_empty_tuple_sets_give_a_zero_that_keeps_the_graph() -> None:
    embeddings, labels = random_batch(6, 4, 2, seed=9)
    loss = losses.build("contrastive")
    check_empty_tuple_sets_keep_graph(loss, embeddings, labels)
    check_empty_tuples_keep_graph(loss, embeddings[:1], labels[:1], None)


@pytest.mark.parametrize("kind", ["all", "distance_weighted"])
def test_cross_check_with_pytorch_metric_learning(kind: str) -> None:
    # PML: ContrastiveLoss(pos_margin=0, neg_margin=1) gives d (positive) and [1 - d]_+ (negative) per
    # pair, as eq. 1. PML reduces positive and negative pairs separately (MeanReducer: mean_pos + mean_neg);
    # eq. 1 averages all pairs together. With DoNothingReducer we get the per-pair terms and map:
    # ours = (sum_pos + sum_neg) / (n_pos + n_neg). LpDistance(normalize_embeddings=False) so that
    # gradients are not projected onto the sphere (our inputs are already unit vectors).
    embeddings, labels = random_batch(16, 8, 4, seed=10)
    tuples = mined(kind, embeddings, labels)
    pml = pml_losses.ContrastiveLoss(
        pos_margin=0.0, neg_margin=1.0, distance=LpDistance(normalize_embeddings=False), reducer=pml_reducers.DoNothingReducer()
    )

    def pml_mapped(e: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        indices = None if tuples is None else (tuples.anchors, tuples.positives, tuples.negatives)
        terms = pml(e, y, indices)
        positive, negative = terms["pos_loss"]["losses"], terms["neg_loss"]["losses"]
        return (positive.sum() + negative.sum()) / (len(positive) + len(negative))

    ours = losses.build("contrastive")
    assert_same_value_and_gradient(
        lambda e, y: ours(e, y, tuples), pml_mapped, embeddings, labels, gradient_tol=(1e-6, 1e-9)
    )


@pytest.mark.parametrize(("hparams", "parameter"), [({"margin": -1.0}, "margin"), ({"margin": 0.0}, "margin"), ({"gamma": 1.0}, "gamma")])
def test_bad_hyper_parameters_name_the_parameter(hparams: dict, parameter: str) -> None:
    with pytest.raises(UserInputError, match=parameter):
        losses.build("contrastive", **hparams)


def test_mismatched_shapes_name_the_parameter() -> None:
    embeddings, labels = random_batch(6, 4, 2, seed=11)
    with pytest.raises(UserInputError, match="labels"):
        losses.build("contrastive")(embeddings, labels[:-1])
