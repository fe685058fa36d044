"""Circle loss with pair-wise labels (Sun et al. 2020)."""

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
    numerical_gradient,
    pair_lists,
    py_dot,
    py_unit,
    random_batch,
    random_pair_subset,
    rows,
    value_and_gradient,
)
from pytorch_metric_learning import losses as pml_losses

from dmlbench import losses
from dmlbench.losses.circle import CircleLoss


def py_logsumexp(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(value - top) for value in values))


def reference_circle_per_anchor(
    embeddings, labels, margin=0.4, gamma=80.0, positive_pairs=None, negative_pairs=None, weights_from=None
) -> list[float]:
    """log(1 + sum_n exp(gamma a_n (s_n - m)) sum_p exp(-gamma a_p (s_p - 1 + m))) per anchor; a_p, a_n
    are computed from ``weights_from`` (default: the embeddings themselves)."""
    x = [py_unit(row) for row in rows(embeddings)]
    frozen = x if weights_from is None else [py_unit(row) for row in rows(weights_from)]
    y = labels.tolist()
    positive_pairs, negative_pairs = given_or_all_pairs(y, positive_pairs, negative_pairs)
    per_anchor = []
    for i in range(len(y)):
        # Exponents, summed in log space below: gamma = 256 overflows exp() in float64.
        positive_exponents, negative_exponents = [], []
        for j in range(len(y)):
            if j == i:
                continue
            s, s_frozen = py_dot(x[i], x[j]), py_dot(frozen[i], frozen[j])
            if (i, j) in positive_pairs:
                positive_exponents.append(-gamma * max(0.0, 1 + margin - s_frozen) * (s - (1 - margin)))
            if (i, j) in negative_pairs:
                negative_exponents.append(gamma * max(0.0, s_frozen + margin) * (s - margin))
        if not positive_exponents or not negative_exponents:
            per_anchor.append(0.0)
            continue
        log_product = py_logsumexp(positive_exponents) + py_logsumexp(negative_exponents)
        # log(1 + e^t), stable for large t
        per_anchor.append(max(log_product, 0.0) + math.log1p(math.exp(-abs(log_product))))
    return per_anchor


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("margin", "gamma"), [(0.4, 80.0), (0.25, 256.0), (0.1, 4.0)])
def test_matches_loop_reference(seed: int, margin: float, gamma: float) -> None:
    embeddings, labels = random_batch(12, 6, 4, seed=seed, normalize=False)
    expected = sum(reference_circle_per_anchor(embeddings, labels, margin, gamma)) / len(labels)
    assert float(CircleLoss(margin, gamma)(embeddings, labels)) == pytest.approx(expected, rel=1e-10)


def test_matches_loop_reference_on_mined_pairs() -> None:
    embeddings, labels = random_batch(12, 6, 3, seed=3)
    pairs = random_pair_subset(labels, keep=0.4, seed=3)
    positive_pairs, negative_pairs = pair_lists(pairs)
    expected = sum(reference_circle_per_anchor(embeddings, labels, 0.4, 80.0, positive_pairs, negative_pairs)) / 12
    assert float(CircleLoss()(embeddings, labels, pairs)) == pytest.approx(expected, rel=1e-10)


def test_gradient_treats_the_weights_as_constants() -> None:
    # The paper's gradient holds alpha_p, alpha_n fixed, so torch.autograd.gradcheck of the full function
    # does not apply; instead compare with central finite differences (float64) of the loop reference
    # whose weights are frozen at the evaluation point.
    embeddings, labels = random_batch(8, 4, 3, seed=5, normalize=False)
    _, gradient = value_and_gradient(CircleLoss(0.25, 8.0), embeddings, labels)

    def frozen(e: torch.Tensor) -> float:
        return sum(reference_circle_per_anchor(e, labels, 0.25, 8.0, weights_from=embeddings)) / len(labels)

    torch.testing.assert_close(gradient, numerical_gradient(frozen, embeddings), rtol=1e-6, atol=1e-8)


def test_matches_pytorch_metric_learning_up_to_the_reduction() -> None:
    # PML's CircleLoss (m, gamma, same definition, weights detached) averages over the anchors with a
    # non-zero loss (AvgNonZeroReducer); here the mean runs over all b anchors: ours = PML * nonzero / b.
    embeddings, labels = random_batch(12, 6, 4, seed=6, normalize=False)
    labels[0] = 9  # a singleton anchor has loss 0, so the two reductions differ
    nonzero = sum(value > 0 for value in reference_circle_per_anchor(embeddings, labels))
    assert nonzero == 11
    pml = pml_losses.CircleLoss(m=0.4, gamma=80)
    assert_same_value_and_gradient(CircleLoss(), pml, embeddings, labels, scale=nonzero / 12)


def test_degenerate_inputs_bf16_and_empty_tuples() -> None:
    values = check_pair_loss_degenerate_bf16_and_empty_pairs(CircleLoss(), rel=0.05)
    assert values["one_class"] == 0 and values["no_positive_pairs"] == 0


def test_permutation_invariance() -> None:
    embeddings, labels = random_batch(12, 6, 4, seed=8)
    check_permutation_invariance(CircleLoss(), embeddings, labels)


def test_build_and_bad_input() -> None:
    loss = losses.build("circle")
    assert (loss.margin, loss.gamma) == (0.4, 80.0) and loss.uses_tuples
    check_bad_hyper_parameters("circle", {"margin": [-0.1, 1.0], "gamma": [0]})
