import math

import pytest
import torch
from losses_testkit import (
    assert_same_value_and_gradient,
    check_bad_hyper_parameters,
    check_class_loss_contract,
    check_class_loss_degenerate_and_bf16,
    loss_gradcheck,
    py_dot,
    py_unit,
    random_batch,
    rows,
)
from pytorch_metric_learning.losses import (
    NormalizedSoftmaxLoss as PMLNormalizedSoftmaxLoss,
)
from torch import Tensor

from dmlbench import losses


def reference_normalized_softmax(
    embeddings: Tensor, labels: Tensor, weights: Tensor, temperature: float, classes: list[int] | None = None,
) -> float:
    """Seed 002 eq. 1 as plain loops; ``classes`` restricts the denominator (class subsampling)."""
    points = [py_unit(x) for x in rows(embeddings)]
    centres = [py_unit(w) for w in rows(weights)]
    classes = list(range(len(centres))) if classes is None else classes
    total = 0.0
    for x, y in zip(points, labels.tolist()):
        logits = {c: py_dot(x, centres[c]) / temperature for c in classes}
        top = max(logits.values())
        total += -(logits[y] - top - math.log(sum(math.exp(v - top) for v in logits.values())))
    return total / len(points)


@pytest.mark.parametrize("temperature", [0.05, 0.5])
def test_matches_brute_force(temperature: float) -> None:
    embeddings, labels = random_batch(10, 6, 5, seed=2, normalize=False)
    loss = losses.build("normalized_softmax", num_classes=5, embedding_dim=6, temperature=temperature).double()
    expected = reference_normalized_softmax(embeddings, labels, loss.weights, temperature)
    torch.testing.assert_close(loss(embeddings, labels).item(), expected, rtol=1e-10, atol=1e-10)


def test_matches_pytorch_metric_learning() -> None:
    # Same definition (mean cross-entropy over cos / T with normalised embeddings and weights); PML
    # stores the weights as W [D, C], ours as [C, D], so W = ours.T.
    embeddings, labels = random_batch(9, 5, 4, seed=7, normalize=False)
    ours = losses.build("normalized_softmax", num_classes=4, embedding_dim=5).double()
    pml = PMLNormalizedSoftmaxLoss(num_classes=4, embedding_size=5, temperature=0.05)
    pml.W.data = ours.weights.detach().T.clone()
    assert_same_value_and_gradient(
        ours, pml, embeddings, labels, value_tol=(1e-10, 1e-10), gradient_tol=(1e-8, 1e-10)
    )
    torch.testing.assert_close(ours.weights.grad, pml.W.grad.T, rtol=1e-8, atol=1e-10)


def test_class_subsampling_uses_batch_classes_plus_random_others() -> None:
    embeddings, labels = random_batch(8, 6, 3, seed=1)  # classes 0..2 of 12
    loss = losses.build("normalized_softmax", num_classes=12, embedding_dim=6, class_subsample_ratio=0.5, seed=3)
    loss = loss.double()
    drawn = []
    for _ in range(3):
        state = loss.subsample_generator.get_state()
        value = loss(embeddings, labels)
        loss.subsample_generator.set_state(state)
        classes = loss.sample_classes(labels).tolist()
        drawn.append(classes)
        assert len(classes) == 6 and set(labels.tolist()) <= set(classes)
        expected = reference_normalized_softmax(embeddings, labels, loss.weights, 0.05, classes)
        torch.testing.assert_close(value.item(), expected, rtol=1e-10, atol=1e-10)
    assert len({tuple(c) for c in drawn}) > 1, "every step should draw a new subset"

    again = losses.build("normalized_softmax", num_classes=12, embedding_dim=6, class_subsample_ratio=0.5, seed=3)
    assert [again.sample_classes(labels).tolist() for _ in range(3)] == drawn

    loss.eval()
    full = reference_normalized_softmax(embeddings, labels, loss.weights, 0.05)
    torch.testing.assert_close(loss(embeddings, labels).item(), full, rtol=1e-10, atol=1e-10)


def test_class_subsampling_frequency_matches_binomial() -> None:
    # 2 batch classes of 20, ratio 0.5: 8 of the 18 others are drawn, each with probability 4/9.
    loss = losses.build("normalized_softmax", num_classes=20, embedding_dim=4, class_subsample_ratio=0.5, seed=0)
    labels = torch.tensor([3, 3, 11, 11])
    draws = 900
    counts = torch.zeros(20)
    for _ in range(draws):
        counts[loss.sample_classes(labels)] += 1
    assert counts[3] == counts[11] == draws
    others = counts[[c for c in range(20) if c not in (3, 11)]]
    p = 8 / 18
    tolerance = 4.5 * math.sqrt(draws * p * (1 - p))
    assert torch.all((others - draws * p).abs() < tolerance), others


def test_subsampling_generator_is_saved_in_the_state_dict() -> None:
    options = dict(num_classes=30, embedding_dim=4, class_subsample_ratio=0.2)
    loss = losses.build("normalized_softmax", seed=5, **options)
    labels = torch.tensor([0, 1, 1, 0])
    loss.sample_classes(labels)
    resumed = losses.build("normalized_softmax", seed=9, **options)
    resumed.load_state_dict(loss.state_dict())
    assert torch.equal(resumed.weights, loss.weights)
    assert resumed.sample_classes(labels).tolist() == loss.sample_classes(labels).tolist()


@pytest.mark.parametrize("ratio", [1.0, 0.4])
def test_gradcheck(ratio: float) -> None:
    # With ratio 0.4 of 5 classes the 3 batch classes already fill the denominator: the subset path
    # is exercised without randomness between gradcheck's evaluations.
    embeddings, labels = random_batch(6, 4, 3, seed=2, normalize=False)
    loss = losses.build(
        "normalized_softmax", num_classes=5, embedding_dim=4, temperature=0.5, class_subsample_ratio=ratio
    )
    assert loss_gradcheck(loss, embeddings, labels)


def test_degenerate_inputs_and_bf16() -> None:
    check_class_loss_degenerate_and_bf16("normalized_softmax", bf16_atol=0.2)


def test_contract_and_bad_hyper_parameters() -> None:
    check_class_loss_contract("normalized_softmax")
    bad = {"temperature": [0, -0.05, float("nan")], "class_subsample_ratio": [0.0, 1.5]}
    check_bad_hyper_parameters("normalized_softmax", bad, num_classes=4, embedding_dim=8)
