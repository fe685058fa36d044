"""rho-regularisation (Roth et al. 2020 sec. 5.1): switch frequency, switched-tuple structure, every miner x loss."""

from __future__ import annotations

import math

import pytest
import torch
from losses_testkit import assert_finite_loss_and_grad, random_batch, random_labels

import dmlbench.losses as losses
import dmlbench.mining as mining
from dmlbench.mining import Pairs, Triplets, all_pairs, all_triplets
from dmlbench.mining.base import RhoRegularizedMiner
from dmlbench.mining.rho import switch_negatives


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def binomial_tolerance(trials: int, p: float) -> float:
    return 5 * math.sqrt(trials * p * (1 - p)) + 1


@pytest.mark.parametrize("p_switch", [0.05, 0.3, 0.8])
def test_triplet_switch_frequency_matches_p_switch(p_switch: float) -> None:
    labels = random_labels(40, 8, seed=1, samples_per_class=5)
    triplets = all_triplets(labels)
    switched = switch_negatives(triplets, labels, p_switch, generator(2))
    changed = switched.positives == switched.anchors  # miners never give a == p; a switch always does
    count = int(changed.sum())
    assert abs(count - p_switch * len(triplets)) <= binomial_tolerance(len(triplets), p_switch)
    # switched: (a, a, s) with s a classmate of a; the rest untouched
    assert (labels[switched.negatives[changed]] == labels[switched.anchors[changed]]).all()
    assert (switched.negatives[changed] != switched.anchors[changed]).all()
    assert torch.equal(switched.anchors, triplets.anchors)
    assert torch.equal(switched.positives[~changed], triplets.positives[~changed])
    assert torch.equal(switched.negatives[~changed], triplets.negatives[~changed])


def test_replacement_negatives_are_uniform_over_the_class() -> None:
    labels = torch.tensor([0, 0, 0, 0, 1, 1])
    anchors = torch.zeros(6000, dtype=torch.long)
    triplets = Triplets(anchors, torch.ones_like(anchors), torch.full_like(anchors, 4))
    switched = switch_negatives(triplets, labels, 1.0, generator(3))
    counts = torch.bincount(switched.negatives, minlength=6)
    assert counts[0] == 0 and counts[4:].sum() == 0
    assert (counts[1:4] - 2000).abs().max() <= binomial_tolerance(6000, 1 / 3)


def test_pairs_switch_negative_pairs_only() -> None:
    labels = random_labels(30, 6, seed=4, samples_per_class=5)
    pairs = all_pairs(labels)
    switched = switch_negatives(pairs, labels, 0.4, generator(5))
    assert isinstance(switched, Pairs)
    assert torch.equal(switched.positive_anchors, pairs.positive_anchors)
    assert torch.equal(switched.positives, pairs.positives)
    assert torch.equal(switched.negative_anchors, pairs.negative_anchors)
    changed = labels[switched.negatives] == labels[switched.negative_anchors]
    assert (switched.negatives[changed] != switched.negative_anchors[changed]).all()
    count, trials = int(changed.sum()), len(pairs.negative_anchors)
    assert abs(count - 0.4 * trials) <= binomial_tolerance(trials, 0.4)


def test_anchors_without_classmates_are_never_switched() -> None:
    labels = torch.tensor([0, 1, 1, 2])  # anchors 0 and 3 are alone in their class
    pairs = all_pairs(labels)
    switched = switch_negatives(pairs, labels, 1.0, generator(6))
    lonely = (switched.negative_anchors == 0) | (switched.negative_anchors == 3)
    assert torch.equal(switched.negatives[lonely], pairs.negatives[lonely])
    assert (labels[switched.negatives[~lonely]] == labels[switched.negative_anchors[~lonely]]).all()


def test_build_wraps_only_when_p_switch_is_positive_and_shares_the_generator() -> None:
    assert not isinstance(mining.build("random", p_switch=0.0), RhoRegularizedMiner)
    shared = generator(7)
    miner = mining.build("random", p_switch=0.5, generator=shared)
    assert isinstance(miner, RhoRegularizedMiner) and miner.generator is shared and miner.miner.generator is shared


def test_rho_is_deterministic_given_the_generator() -> None:
    embeddings, labels = random_batch(32, 8, 6, seed=8)
    first = mining.build("distance_weighted", p_switch=0.5, generator=generator(9))(embeddings, labels)
    second = mining.build("distance_weighted", p_switch=0.5, generator=generator(9))(embeddings, labels)
    assert torch.equal(first.positives, second.positives) and torch.equal(first.negatives, second.negatives)


def test_per_anchor_frequency_through_a_miner() -> None:
    # the paper's miners give one triplet per anchor, so per tuple = per anchor
    embeddings, labels = random_batch(64, 8, 8, seed=10)
    miner = mining.build("random", p_switch=0.25, generator=generator(11))
    switched, total = 0, 0
    for _ in range(20):
        triplets = miner(embeddings, labels)
        switched += int((triplets.positives == triplets.anchors).sum())
        total += len(triplets)
    assert abs(switched - 0.25 * total) <= binomial_tolerance(total, 0.25)


def tuple_losses() -> list[str]:
    return [name for name in losses.LOSSES.names() if getattr(losses.LOSSES.get(name), "uses_tuples", False)]


@pytest.mark.parametrize("miner_name", mining.MINERS.names())
@pytest.mark.parametrize("loss_name", ["contrastive", "triplet", "margin", "quadruplet", "snr"])
def test_every_miner_feeds_every_tuple_loss_with_rho(miner_name: str, loss_name: str) -> None:
    embeddings, labels = random_batch(24, 8, 6, seed=12, samples_per_class=4)
    miner = mining.build(miner_name, p_switch=0.5, generator=generator(13))
    loss = losses.build(loss_name, num_classes=6, embedding_dim=8).double()
    tuples = miner(embeddings, labels)
    assert_finite_loss_and_grad(lambda e, y: loss(e, y, tuples), embeddings, labels)


@pytest.mark.parametrize("loss_name", tuple_losses())
def test_rho_switched_tuples_work_with_all_registered_tuple_losses(loss_name: str) -> None:
    embeddings, labels = random_batch(24, 8, 6, seed=14, samples_per_class=4)
    loss = losses.build(loss_name, num_classes=6, embedding_dim=8).double()
    for miner_name in ("distance_weighted", "multi_similarity"):
        tuples = mining.build(miner_name, p_switch=0.5, generator=generator(15))(embeddings, labels)
        assert_finite_loss_and_grad(lambda e, y: loss(e, y, tuples), embeddings, labels)


@pytest.mark.parametrize("loss_name", ["contrastive", "triplet", "margin", "quadruplet", "snr"])
def test_a_switched_triplet_pushes_classmates_apart(loss_name: str) -> None:
    # (a, a, s) with s a close classmate: one gradient step must increase d(a, s)
    embeddings = torch.nn.functional.normalize(
        torch.tensor([[1.0, 0.1, 0.0, 0.3], [1.0, 0.15, 0.05, 0.3], [-0.2, 1.0, 0.4, 0.0], [0.0, -0.3, 1.0, 0.5]]),
        dim=1,
    ).double()
    labels = torch.tensor([0, 0, 1, 1])
    switched = switch_negatives(Triplets(torch.tensor([0]), torch.tensor([1]), torch.tensor([2])), labels, 1.0, generator())
    assert switched.positives.tolist() == [0] and switched.negatives.tolist() == [1]
    loss = losses.build(loss_name, num_classes=2, embedding_dim=4).double()
    if loss_name == "snr":
        loss.regularization = 0.0  # isolate the ranking term
    embeddings.requires_grad_(True)
    value = loss(embeddings, labels, switched)
    (gradient,) = torch.autograd.grad(value, embeddings)
    before = (embeddings[0] - embeddings[1]).norm()
    stepped = embeddings.detach() - 0.01 * gradient
    assert (stepped[0] - stepped[1]).norm() > before
