"""Multi-similarity loss with its pair mining, Roth et al. 2020 supp. eq. 11-12."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from losses_testkit import (
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
)
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners as pml_miners

from dmlbench import losses
from dmlbench.distances import cosine_similarity
from dmlbench.losses.multi_similarity import (
    MultiSimilarityLoss,
    multi_similarity_pair_selection,
)
from dmlbench.losses.pair_masks import pair_masks


def reference_multi_similarity(
    embeddings, labels, alpha=2.0, beta=40.0, threshold=0.5, epsilon=0.1, positive_pairs=None, negative_pairs=None
) -> float:
    """Eq. 11-12; with given pairs there is no mining step."""
    x = [py_unit(row) for row in rows(embeddings)]
    y = labels.tolist()
    size = len(y)
    mine = positive_pairs is None
    positive_pairs, negative_pairs = given_or_all_pairs(y, positive_pairs, negative_pairs)
    total = 0.0
    for i in range(size):
        positives = [j for j in range(size) if (i, j) in positive_pairs and j != i]
        negatives = [k for k in range(size) if (i, k) in negative_pairs and k != i]
        s = {j: py_dot(x[i], x[j]) for j in range(size)}
        if mine:
            hardest_positive = min((s[j] for j in positives), default=math.inf)
            hardest_negative = max((s[k] for k in negatives), default=-math.inf)
            positives, negatives = (
                [j for j in positives if s[j] < hardest_negative + epsilon],
                [k for k in negatives if s[k] > hardest_positive - epsilon],
            )
        total += math.log(1 + sum(math.exp(-alpha * (s[j] - threshold)) for j in positives)) / alpha
        total += math.log(1 + sum(math.exp(beta * (s[k] - threshold)) for k in negatives)) / beta
    return total / size


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_matches_loop_reference_with_built_in_mining(seed: int) -> None:
    embeddings, labels = random_batch(12, 4, 3, seed=seed, normalize=seed % 2 == 0)
    value = MultiSimilarityLoss()(embeddings, labels)
    assert float(value) == pytest.approx(reference_multi_similarity(embeddings, labels), rel=1e-10)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=2, max_size=10), st.integers(0, 10**6), st.floats(0.0, 0.5))
def test_matches_loop_reference_on_any_label_structure(labels: list[int], seed: int, epsilon: float) -> None:
    embeddings, _ = random_batch(len(labels), 3, 2, seed=seed, normalize=False)
    labels_tensor = torch.tensor(labels)
    expected = reference_multi_similarity(embeddings, labels_tensor, epsilon=epsilon)
    assert float(MultiSimilarityLoss(epsilon=epsilon)(embeddings, labels_tensor)) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_given_pairs_replace_the_mining() -> None:
    embeddings, labels = random_batch(12, 4, 3, seed=4)
    pairs = random_pair_subset(labels, keep=0.5, seed=4)
    positive_pairs, negative_pairs = pair_lists(pairs)
    loss = MultiSimilarityLoss(alpha=1.0, beta=10.0, threshold=0.2, epsilon=0.3)
    expected = reference_multi_similarity(embeddings, labels, 1.0, 10.0, 0.2, 0.3, positive_pairs, negative_pairs)
    assert float(loss(embeddings, labels, pairs)) == pytest.approx(expected, rel=1e-10)
    mined_reference = reference_multi_similarity(embeddings, labels, 1.0, 10.0, 0.2, 0.3)
    assert float(loss(embeddings, labels)) == pytest.approx(mined_reference, rel=1e-10)


def test_pair_selection_equals_pytorch_metric_learning_miner() -> None:
    for seed in range(5):
        embeddings, labels = random_batch(16, 4, 4, seed=seed)
        positive, negative = multi_similarity_pair_selection(cosine_similarity(embeddings), *pair_masks(labels), 0.1)
        a1, p, a2, n = pml_miners.MultiSimilarityMiner(epsilon=0.1)(embeddings, labels)
        assert sorted(map(list, zip(a1.tolist(), p.tolist()))) == positive.nonzero().tolist()
        assert sorted(map(list, zip(a2.tolist(), n.tolist()))) == negative.nonzero().tolist()
        # The selection really selects: some candidate pairs are dropped, all kept ones are valid.
        candidates_positive, candidates_negative = pair_masks(labels)
        assert (positive & ~candidates_positive).sum() == 0 and (negative & ~candidates_negative).sum() == 0
        assert positive.sum() + negative.sum() < candidates_positive.sum() + candidates_negative.sum()


def test_matches_pytorch_metric_learning_loss_with_its_miner() -> None:
    # PML: MultiSimilarityLoss(alpha, beta, base=threshold) on the pairs of MultiSimilarityMiner(epsilon),
    # averaged over all b anchors: the same definition as eq. 11-12 (PML's default beta is 50, not 40).
    embeddings, labels = random_batch(16, 6, 4, seed=5, normalize=False)
    miner = pml_miners.MultiSimilarityMiner(epsilon=0.1)
    pml = pml_losses.MultiSimilarityLoss(alpha=2, beta=40, base=0.5)
    assert_same_value_and_gradient(MultiSimilarityLoss(), lambda e, l: pml(e, l, miner(e, l)), embeddings, labels)


def test_gradcheck() -> None:
    embeddings, labels = random_batch(8, 4, 3, seed=6, normalize=False)
    assert loss_gradcheck(MultiSimilarityLoss(), embeddings, labels)
    assert loss_gradcheck(MultiSimilarityLoss(), embeddings, labels, random_pair_subset(labels, 0.5, seed=2))


def test_degenerate_inputs_bf16_and_empty_tuples() -> None:
    values = check_pair_loss_degenerate_bf16_and_empty_pairs(MultiSimilarityLoss(), rel=0.05)
    # Without positives the mining keeps no negatives (and vice versa): nothing to learn.
    assert values["one_class"] == 0 and values["no_positive_pairs"] == 0


def test_permutation_invariance() -> None:
    embeddings, labels = random_batch(12, 6, 4, seed=8)
    check_permutation_invariance(MultiSimilarityLoss(), embeddings, labels)


def test_build_and_bad_input() -> None:
    loss = losses.build("multi_similarity")
    assert (loss.alpha, loss.beta, loss.threshold, loss.epsilon) == (2.0, 40.0, 0.5, 0.1) and loss.uses_tuples
    bad = {"alpha": [0.0], "beta": [-1.0], "threshold": [-0.5], "epsilon": [-0.1]}
    check_bad_hyper_parameters("multi_similarity", bad)
