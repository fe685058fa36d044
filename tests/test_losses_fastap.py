"""FastAP loss (Cakir et al. 2019)."""

from __future__ import annotations

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
    py_unit,
    random_batch,
    random_pair_subset,
    rows,
)
from pytorch_metric_learning import losses as pml_losses

from dmlbench import losses
from dmlbench.losses.fastap import FastAPLoss


def reference_fastap(embeddings, labels, num_bins=10, positive_pairs=None, negative_pairs=None) -> float:
    """mean over anchors with positives of 1 - 1/N+ sum_l h+_l H+_l / H_l, on squared distances in [0, 4]."""
    x = [py_unit(row) for row in rows(embeddings)]
    y = labels.tolist()
    positive_pairs, negative_pairs = given_or_all_pairs(y, positive_pairs, negative_pairs)
    width = 4 / num_bins
    centres = [l * width for l in range(num_bins + 1)]
    losses_per_anchor = []
    for q in range(len(y)):
        positives = [j for j in range(len(y)) if (q, j) in positive_pairs and j != q]
        negatives = [j for j in range(len(y)) if (q, j) in negative_pairs and j != q]
        if not positives:
            continue
        distances_positive = [py_distance(x[q], x[j]) ** 2 for j in positives]
        distances_negative = [py_distance(x[q], x[j]) ** 2 for j in negatives]
        precision_sum = cumulative_positive = cumulative_all = 0.0
        for centre in centres:
            h_positive = sum(max(0.0, 1 - abs(d - centre) / width) for d in distances_positive)
            h_negative = sum(max(0.0, 1 - abs(d - centre) / width) for d in distances_negative)
            cumulative_positive += h_positive
            cumulative_all += h_positive + h_negative
            if cumulative_all > 0:
                precision_sum += h_positive * cumulative_positive / cumulative_all
        losses_per_anchor.append(1 - precision_sum / len(positives))
    return sum(losses_per_anchor) / len(losses_per_anchor)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("num_bins", [10, 3, 40])
def test_matches_loop_reference(seed: int, num_bins: int) -> None:
    embeddings, labels = random_batch(12, 4, 3, seed=seed, normalize=False)
    expected = reference_fastap(embeddings, labels, num_bins)
    assert float(FastAPLoss(num_bins)(embeddings, labels)) == pytest.approx(expected, rel=1e-10)


def test_matches_loop_reference_on_mined_pairs() -> None:
    embeddings, labels = random_batch(12, 4, 3, seed=3)
    pairs = random_pair_subset(labels, keep=0.4, seed=3)
    positive_pairs, negative_pairs = pair_lists(pairs)
    expected = reference_fastap(embeddings, labels, 10, positive_pairs, negative_pairs)
    assert float(FastAPLoss()(embeddings, labels, pairs)) == pytest.approx(expected, rel=1e-10)


def test_perfect_ranking_gives_zero_and_inverted_ranking_a_large_loss() -> None:
    unit = torch.eye(3, dtype=torch.float64)[:1]
    points = torch.cat([unit, unit, -unit, -unit])
    assert float(FastAPLoss()(points, torch.tensor([0, 0, 1, 1]))) == 0.0
    # Each anchor's only positive is at distance 4, behind its two negatives (0 and 4): AP = 1/3.
    assert float(FastAPLoss()(points, torch.tensor([0, 1, 0, 1]))) == pytest.approx(2 / 3, abs=1e-12)


def test_gradcheck() -> None:
    embeddings, labels = random_batch(8, 4, 3, seed=5, normalize=False)
    assert loss_gradcheck(FastAPLoss(), embeddings, labels)
    assert loss_gradcheck(FastAPLoss(), embeddings, labels, random_pair_subset(labels, 0.6, seed=2))


def test_matches_pytorch_metric_learning_values_and_gradients() -> None:
    # PML's FastAPLoss(num_bins): squared distances of normalised embeddings, num_bins + 1 centres on
    # [0, 4], mean of 1 - FastAP over anchors with positives: the same definition.
    embeddings, labels = random_batch(16, 6, 4, seed=6, normalize=False)
    labels[0] = 11  # an anchor without positives is left out by both
    assert_same_value_and_gradient(FastAPLoss(10), pml_losses.FastAPLoss(num_bins=10), embeddings, labels)


def test_degenerate_inputs_bf16_and_empty_tuples() -> None:
    values = check_pair_loss_degenerate_bf16_and_empty_pairs(FastAPLoss(), abs=0.05)
    assert values["no_positive_pairs"] == 0


def test_permutation_invariance() -> None:
    embeddings, labels = random_batch(12, 6, 4, seed=8)
    check_permutation_invariance(FastAPLoss(), embeddings, labels)


def test_build_and_bad_input() -> None:
    loss = losses.build("fastap")
    assert loss.num_bins == 10 and loss.uses_tuples
    check_bad_hyper_parameters("fastap", {"num_bins": [0, -1, 2.0]})


def test_non_finite_embeddings_give_a_nan_loss() -> None:
    # A NaN distance falls in no bin; the loss must come out NaN (which fails a run): neither raise
    # nor come out finite (it was 1.0 when the empty-bin mask also hid NaN bins).
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    for bad in (float("nan"), float("inf")):
        embeddings = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
        embeddings[0, 0] = bad
        assert torch.isnan(FastAPLoss()(embeddings, labels))
