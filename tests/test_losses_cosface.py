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
from pytorch_metric_learning.losses import CosFaceLoss as PMLCosFaceLoss
from torch import Tensor

from dmlbench import losses


def reference_cosface(
    embeddings: Tensor, labels: Tensor, weights: Tensor, scale: float, margin: float,
    classes: list[int] | None = None,
) -> float:
    """Wang et al. 2018 eq. 4 as plain loops: s (cos - m) for the own class, s cos for the others."""
    points = [py_unit(x) for x in rows(embeddings)]
    centres = [py_unit(w) for w in rows(weights)]
    classes = list(range(len(centres))) if classes is None else classes
    total = 0.0
    for x, y in zip(points, labels.tolist()):
        logits = {c: scale * (py_dot(x, centres[c]) - (margin if c == y else 0.0)) for c in classes}
        top = max(logits.values())
        total += -(logits[y] - top - math.log(sum(math.exp(v - top) for v in logits.values())))
    return total / len(points)


@pytest.mark.parametrize(("scale", "margin"), [(64.0, 0.35), (8.0, 0.0), (16.0, 0.2)])
def test_matches_brute_force(scale: float, margin: float) -> None:
    embeddings, labels = random_batch(10, 6, 5, seed=3, normalize=False)
    loss = losses.build("cosface", num_classes=5, embedding_dim=6, scale=scale, margin=margin).double()
    expected = reference_cosface(embeddings, labels, loss.weights, scale, margin)
    torch.testing.assert_close(loss(embeddings, labels).item(), expected, rtol=1e-10, atol=1e-10)


def test_class_subsampling_restricts_the_denominator() -> None:
    embeddings, labels = random_batch(8, 6, 3, seed=1)
    loss = losses.build("cosface", num_classes=10, embedding_dim=6, class_subsample_ratio=0.5).double()
    state = loss.subsample_generator.get_state()
    value = loss(embeddings, labels)
    loss.subsample_generator.set_state(state)
    classes = loss.sample_classes(labels).tolist()
    expected = reference_cosface(embeddings, labels, loss.weights, 64.0, 0.35, classes)
    torch.testing.assert_close(value.item(), expected, rtol=1e-10, atol=1e-10)


def test_matches_pytorch_metric_learning() -> None:
    # Same definition and mean reduction; PML's W is [D, C], ours [C, D].
    embeddings, labels = random_batch(9, 5, 4, seed=7, normalize=False)
    ours = losses.build("cosface", num_classes=4, embedding_dim=5).double()
    pml = PMLCosFaceLoss(num_classes=4, embedding_size=5, margin=0.35, scale=64)
    pml.W.data = ours.weights.detach().T.clone()
    assert_same_value_and_gradient(
        ours, pml, embeddings, labels, value_tol=(1e-10, 1e-10), gradient_tol=(1e-8, 1e-10)
    )
    torch.testing.assert_close(ours.weights.grad, pml.W.grad.T, rtol=1e-8, atol=1e-10)


def test_gradcheck() -> None:
    embeddings, labels = random_batch(6, 4, 3, seed=2, normalize=False)
    loss = losses.build("cosface", num_classes=4, embedding_dim=4, scale=4.0)
    assert loss_gradcheck(loss, embeddings, labels)


def test_degenerate_inputs_and_bf16() -> None:
    check_class_loss_degenerate_and_bf16("cosface", bf16_atol=1.0)


def test_contract_and_bad_hyper_parameters() -> None:
    check_class_loss_contract("cosface")
    check_bad_hyper_parameters("cosface", {"scale": [0], "margin": [-0.1]}, num_classes=4, embedding_dim=8)
