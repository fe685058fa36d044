"""Histogram loss, Roth et al. 2020 supp. eq. 7-9 (Ustinova & Lempitsky 2016)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from losses_testkit import (
    assert_same_value_and_gradient,
    check_bad_hyper_parameters,
    check_pair_loss_degenerate_bf16_and_empty_pairs,
    check_permutation_invariance,
    loss_gradcheck,
    pair_lists,
    py_dot,
    py_unit,
    random_batch,
    random_pair_subset,
    rows,
)
from pytorch_metric_learning import losses as pml_losses

from dmlbench import losses
from dmlbench.losses.histogram import HistogramLoss, soft_histogram


def reference_delta(s: float, r: int, nodes: list[float], spacing: float) -> float:
    """Eq. 7 with the rising part on [t_{r-1}, t_r] and the falling part on (t_r, t_{r+1}], so a value on
    a node counts once (eq. 7 as printed closes both intervals and would count it twice)."""
    value = 0.0
    if r > 0 and nodes[r - 1] <= s <= nodes[r]:
        value += (s - nodes[r - 1]) / spacing
    if r == 0 and s == nodes[0]:
        value += 1.0
    if r + 1 < len(nodes) and nodes[r] < s <= nodes[r + 1]:
        value += (nodes[r + 1] - s) / spacing
    return value


def reference_histogram_loss(embeddings, labels, num_bins=65, positive_pairs=None, negative_pairs=None) -> float:
    """Eq. 8-9 over the unordered pairs i < j (Ustinova & Lempitsky), or over the given ordered pairs."""
    x = [py_unit(row) for row in rows(embeddings)]
    y = labels.tolist()
    if positive_pairs is None:
        pairs = [(i, j) for i in range(len(y)) for j in range(i + 1, len(y))]
        positive_pairs = [(i, j) for i, j in pairs if y[i] == y[j]]
        negative_pairs = [(i, j) for i, j in pairs if y[i] != y[j]]
    positive_pairs = sorted({pair for pair in positive_pairs if pair[0] != pair[1]})
    negative_pairs = sorted({pair for pair in negative_pairs if pair[0] != pair[1]})
    spacing = 2 / (num_bins - 1)
    nodes = [-1 + r * spacing for r in range(num_bins)]

    def histogram(pairs: list[tuple[int, int]]) -> list[float]:
        similarities = [py_dot(x[i], x[j]) for i, j in pairs]
        return [
            sum(reference_delta(s, r, nodes, spacing) for s in similarities) / len(similarities) for r in range(num_bins)
        ]

    positive, negative = histogram(positive_pairs), histogram(negative_pairs)
    return sum(negative[r] * sum(positive[: r + 1]) for r in range(num_bins))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("num_bins", [65, 11, 2])
def test_matches_loop_reference_on_unordered_pairs(seed: int, num_bins: int) -> None:
    embeddings, labels = random_batch(12, 4, 3, seed=seed, normalize=False)
    expected = reference_histogram_loss(embeddings, labels, num_bins)
    assert float(HistogramLoss(num_bins)(embeddings, labels)) == pytest.approx(expected, rel=1e-10)


def test_matches_loop_reference_on_mined_pairs() -> None:
    embeddings, labels = random_batch(12, 4, 3, seed=3)
    pairs = random_pair_subset(labels, keep=0.4, seed=3)
    positive_pairs, negative_pairs = pair_lists(pairs)
    expected = reference_histogram_loss(embeddings, labels, 65, positive_pairs, negative_pairs)
    assert float(HistogramLoss()(embeddings, labels, pairs)) == pytest.approx(expected, rel=1e-10)


def test_value_on_a_node_and_at_cos_one_has_unit_mass_in_one_bin() -> None:
    nodes = torch.linspace(-1, 1, 65, dtype=torch.float64)
    histogram = soft_histogram(torch.tensor([1.0, -1.0, float(nodes[20])], dtype=torch.float64), nodes)
    expected = torch.zeros(65, dtype=torch.float64)
    expected[[64, 0, 20]] = 1 / 3
    torch.testing.assert_close(histogram, expected, rtol=0, atol=1e-15)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0), min_size=1, max_size=20), st.integers(2, 80))
def test_soft_histogram_is_a_distribution_with_the_values_mean(values: list[float], num_bins: int) -> None:
    nodes = torch.linspace(-1, 1, num_bins, dtype=torch.float64)
    histogram = soft_histogram(torch.tensor(values, dtype=torch.float64), nodes)
    assert (histogram >= 0).all()
    assert float(histogram.sum()) == pytest.approx(1.0, abs=1e-12)
    # Linear interpolation between neighbouring nodes keeps the mean.
    assert float((histogram * nodes).sum()) == pytest.approx(sum(values) / len(values), abs=1e-12)


def test_separated_classes_give_zero_and_swapped_classes_give_one() -> None:
    unit = torch.eye(3, dtype=torch.float64)[:1]
    separated = torch.cat([unit, unit, -unit, -unit])  # positives at cos 1, negatives at cos -1
    labels = torch.tensor([0, 0, 1, 1])
    assert float(HistogramLoss()(separated, labels)) == 0.0
    # Same points, labels across: positive pairs at cos -1, negatives at cos 1 (and -1).
    crossed = torch.tensor([0, 1, 0, 1])
    assert float(HistogramLoss()(separated, crossed)) == pytest.approx(1.0, abs=1e-12)


def test_gradcheck() -> None:
    embeddings, labels = random_batch(8, 4, 3, seed=5, normalize=False)
    assert loss_gradcheck(HistogramLoss(), embeddings, labels)
    assert loss_gradcheck(HistogramLoss(11), embeddings, labels, random_pair_subset(labels, 0.6, seed=2))


@pytest.mark.filterwarnings("ignore:Using a non-tuple sequence:UserWarning")
def test_matches_pytorch_metric_learning_values_and_gradients() -> None:
    # PML's HistogramLoss(n_bins) has n_bins + 1 nodes with delta = 2 / n_bins (so R = n_bins + 1) and
    # uses the unordered pairs of all triplets: the same definition when every anchor has a negative.
    # (PML indexes past its last node for a similarity of exactly 1; random data avoids that.)
    embeddings, labels = random_batch(16, 6, 4, seed=6, normalize=False)
    assert_same_value_and_gradient(HistogramLoss(65), pml_losses.HistogramLoss(n_bins=64), embeddings, labels)


def test_degenerate_inputs_bf16_and_empty_tuples() -> None:
    values = check_pair_loss_degenerate_bf16_and_empty_pairs(HistogramLoss(), abs=0.05)
    assert values["one_class"] == 0 and values["no_positive_pairs"] == 0
    assert values["identical_embeddings"] == pytest.approx(1.0)  # all pairs at cos 1: full overlap


def test_permutation_invariance() -> None:
    embeddings, labels = random_batch(12, 6, 4, seed=8)
    check_permutation_invariance(HistogramLoss(), embeddings, labels)


def test_build_and_bad_input() -> None:
    loss = losses.build("histogram")
    assert loss.num_bins == 65 and loss.uses_tuples
    check_bad_hyper_parameters("histogram", {"num_bins": [1, 0, -3, 2.5, True]})
