"""N-pair loss (Roth et al. 2020 supp. eq. 4) and its NT-Xent / InfoNCE form."""

from __future__ import annotations

import math

import pytest
import torch
from losses_testkit import (
    all_pair_lists,
    assert_same_value_and_gradient,
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
from pytorch_metric_learning import distances as pml_distances
from pytorch_metric_learning import losses as pml_losses

from dmlbench import losses
from dmlbench.errors import UserInputError
from dmlbench.losses.npairs import NPairsLoss, NTXentLoss
from dmlbench.losses.pair_masks import label_pairs, pair_masks
from dmlbench.mining.tuples import Pairs


def reference_npairs(
    embeddings, labels, temperature=1.0, nu=0.005, normalize=False, positive_pairs=None, negative_pairs=None
) -> float:
    """Eq. 4: 1/b sum_(a,p) log(1 + sum_n exp((s_an - s_ap)/T)) + nu/b sum_i ||phi*_i||^2."""
    raw = rows(embeddings)
    x = [py_unit(row) for row in raw] if normalize else raw
    y = labels.tolist()
    positive_pairs, negative_pairs = given_or_all_pairs(y, positive_pairs, negative_pairs)
    positive_pairs = sorted((a, p) for a, p in positive_pairs if a != p)
    if not positive_pairs:
        return 0.0
    total = 0.0
    for a, p in positive_pairs:
        negatives = [n for n in range(len(y)) if (a, n) in negative_pairs and n != a]
        total += math.log(1 + sum(math.exp((py_dot(x[a], x[n]) - py_dot(x[a], x[p])) / temperature) for n in negatives))
    return total / len(y) + nu / len(y) * sum(py_dot(row, row) for row in raw)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_npairs_matches_loop_reference(seed: int) -> None:
    embeddings, labels = random_batch(12, 6, 4, seed=seed, normalize=False)
    expected = reference_npairs(embeddings, labels)
    assert float(NPairsLoss()(embeddings, labels)) == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("seed", [0, 1])
def test_nt_xent_matches_loop_reference(seed: int) -> None:
    embeddings, labels = random_batch(12, 6, 4, seed=seed, normalize=False)
    expected = reference_npairs(embeddings, labels, temperature=0.07, nu=0.0, normalize=True)
    assert float(NTXentLoss()(embeddings, labels)) == pytest.approx(expected, rel=1e-10)
    custom = losses.build("nt_xent", temperature=0.5)
    expected = reference_npairs(embeddings, labels, temperature=0.5, nu=0.0, normalize=True)
    assert float(custom(embeddings, labels)) == pytest.approx(expected, rel=1e-10)


def test_matches_loop_reference_on_mined_pairs() -> None:
    embeddings, labels = random_batch(12, 6, 3, seed=3, normalize=False)
    pairs = random_pair_subset(labels, keep=0.4, seed=3)
    positive_pairs, negative_pairs = pair_lists(pairs)
    expected = reference_npairs(embeddings, labels, 2.0, 0.01, False, positive_pairs, negative_pairs)
    value = NPairsLoss(temperature=2.0, regularization=0.01)(embeddings, labels, pairs)
    assert float(value) == pytest.approx(expected, rel=1e-10)


def test_gradcheck() -> None:
    embeddings, labels = random_batch(8, 4, 3, seed=5, normalize=False)
    assert loss_gradcheck(NPairsLoss(), embeddings, labels)
    assert loss_gradcheck(NTXentLoss(temperature=0.3), embeddings, labels, random_pair_subset(labels, 0.5, seed=2))


def test_matches_pytorch_metric_learning_npairs_on_its_own_pairs() -> None:
    # PML's NPairsLoss takes one (anchor, positive) pair per class (the first in index order) and, for
    # anchor i, uses the other classes' *positives* as negatives, cross-entropy averaged over the N
    # pairs, no regulariser (and normalises unless told not to). Feeding eq. 4 exactly those pairs as mined tuples gives
    # ours(nu=0) = (1/b) * sum_i [...] = (N / b) * PML = PML / 2 for a batch of N classes x 2 samples.
    embeddings, _ = random_batch(10, 6, 5, seed=6, normalize=False)
    labels = torch.arange(5).repeat_interleave(2)
    anchors, positives = torch.arange(0, 10, 2), torch.arange(1, 10, 2)
    other = ~torch.eye(5, dtype=torch.bool)
    anchor_index, positive_index = other.nonzero(as_tuple=True)
    pairs = Pairs(anchors, positives, anchors[anchor_index], positives[positive_index])
    ours = NPairsLoss(regularization=0.0)
    pml = pml_losses.NPairsLoss(distance=pml_distances.DotProductSimilarity(normalize_embeddings=False))
    assert_same_value_and_gradient(lambda e, l: ours(e, l, pairs), pml, embeddings, labels, scale=0.5)


def test_nt_xent_matches_pytorch_metric_learning_up_to_the_reduction() -> None:
    # PML's NTXentLoss averages -log(e^{s_ap/T} / (e^{s_ap/T} + sum_n e^{s_an/T})) over the ordered
    # positive pairs; eq. 4 sums the same terms and divides by b: ours = |P| / b * PML.
    embeddings, labels = random_batch(12, 6, 3, seed=7, normalize=False)
    positive_pairs = len(all_pair_lists(labels.tolist())[0])
    pml = pml_losses.NTXentLoss(temperature=0.1)
    scale = positive_pairs / len(labels)
    assert_same_value_and_gradient(NTXentLoss(temperature=0.1), pml, embeddings, labels, scale=scale)


@pytest.mark.parametrize("loss", [NPairsLoss(), NTXentLoss()], ids=["npairs", "nt_xent"])
def test_degenerate_inputs_bf16_and_empty_tuples(loss: NPairsLoss) -> None:
    values = check_pair_loss_degenerate_bf16_and_empty_pairs(loss, normalize=False, rel=0.05)
    assert values["no_positive_pairs"] == 0


def test_large_unnormalised_embeddings_do_not_overflow() -> None:
    embeddings, labels = random_batch(12, 6, 3, seed=9, normalize=False, dtype=torch.float32)
    value, gradient = value_and_gradient(NPairsLoss(), 30.0 * embeddings, labels)
    assert torch.isfinite(value) and torch.isfinite(gradient).all()


def test_permutation_invariance() -> None:
    embeddings, labels = random_batch(12, 6, 4, seed=8, normalize=False)
    check_permutation_invariance(NPairsLoss(), embeddings, labels)


def test_build_aliases_and_bad_input() -> None:
    assert type(losses.build("npairs")) is NPairsLoss
    for name in ("nt_xent", "info_nce"):
        loss = losses.build(name)
        assert isinstance(loss, NTXentLoss) and loss.normalize and loss.temperature == 0.07 and loss.regularization == 0
    check_bad_hyper_parameters("nt_xent", {"temperature": [0.0, -0.1]})
    check_bad_hyper_parameters("npairs", {"regularization": [-1]})
    with pytest.raises(UserInputError, match="unknown loss 'npair'"):
        losses.build("npair")


@pytest.mark.parametrize("labels", [[], [3], [1, 1, 1], [0, 1, 2], [2, 0, 2, 1, 0, 2, 5, 5, 0], list(range(7)) * 3])
def test_label_pairs_are_the_positive_mask(labels: list[int]) -> None:
    # The sorted-label enumeration lists exactly the pairs of pair_masks' positive mask, each once.
    tensor = torch.tensor(labels, dtype=torch.long)
    anchors, positives = label_pairs(tensor)
    expected = pair_masks(tensor)[0].nonzero().tolist()
    assert sorted(zip(anchors.tolist(), positives.tolist())) == sorted(map(tuple, expected))
