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
from pytorch_metric_learning.losses import ArcFaceLoss as PMLArcFaceLoss
from torch import Tensor

from dmlbench import losses


def reference_arcface(
    embeddings: Tensor, labels: Tensor, weights: Tensor, scale: float, margin: float, fallback: bool = False,
) -> float:
    """004 eq. 6 as plain loops, with the angle from acos: s cos(theta_y + m) against s cos theta_c.

    ``fallback``: PML's (and insightface's) cos(theta) - m sin(m) for theta > pi - m, not in eq. 6."""
    points = [py_unit(x) for x in rows(embeddings)]
    centres = [py_unit(w) for w in rows(weights)]
    total = 0.0
    for x, y in zip(points, labels.tolist()):
        cosines = [max(-1.0, min(1.0, py_dot(x, w))) for w in centres]
        target = math.cos(math.acos(cosines[y]) + margin)
        if fallback and math.acos(cosines[y]) > math.pi - margin:
            target = cosines[y] - margin * math.sin(margin)
        logits = [scale * (target if k == y else c) for k, c in enumerate(cosines)]
        top = max(logits)
        total += -(logits[y] - top - math.log(sum(math.exp(v - top) for v in logits)))
    return total / len(points)


def target_angles(loss: torch.nn.Module, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    cosine = torch.nn.functional.normalize(embeddings, dim=1) @ torch.nn.functional.normalize(loss.weights, dim=1).T
    return cosine.gather(1, labels.unsqueeze(1)).clamp(-1, 1).acos()


@pytest.mark.parametrize(("scale", "margin"), [(16.0, 0.5), (30.0, 0.2), (4.0, 0.0)])
def test_matches_brute_force(scale: float, margin: float) -> None:
    embeddings, labels = random_batch(10, 6, 5, seed=3, normalize=False)
    loss = losses.build("arcface", num_classes=5, embedding_dim=6, scale=scale, margin=margin).double()
    expected = reference_arcface(embeddings, labels, loss.weights, scale, margin)
    torch.testing.assert_close(loss(embeddings, labels).item(), expected, rtol=1e-10, atol=1e-10)


def test_matches_pytorch_metric_learning() -> None:
    # Same softmax over all classes and mean reduction. PML takes the margin in degrees and, for
    # theta > pi - m, replaces cos(theta + m) by cos(theta) - m sin(m) (no such branch in 004 eq. 6):
    # the batch is checked to stay below pi - m, where both agree. PML's W is [D, C], ours [C, D].
    embeddings, labels = random_batch(9, 5, 4, seed=3, normalize=False)
    ours = losses.build("arcface", num_classes=4, embedding_dim=5).double()
    assert torch.all(target_angles(ours, embeddings, labels) < math.pi - 0.5)
    pml = PMLArcFaceLoss(num_classes=4, embedding_size=5, margin=math.degrees(0.5), scale=16)
    pml.W.data = ours.weights.detach().T.clone()
    assert_same_value_and_gradient(
        ours, pml, embeddings, labels, value_tol=(1e-10, 1e-10), gradient_tol=(1e-7, 1e-9)
    )
    torch.testing.assert_close(ours.weights.grad, pml.W.grad.T, rtol=1e-7, atol=1e-9)


def test_pytorch_metric_learning_differs_only_by_its_fallback_beyond_pi_minus_m() -> None:
    embeddings, labels = random_batch(9, 5, 4, seed=7, normalize=False)
    ours = losses.build("arcface", num_classes=4, embedding_dim=5).double()
    assert torch.any(target_angles(ours, embeddings, labels) > math.pi - 0.5)
    pml = PMLArcFaceLoss(num_classes=4, embedding_size=5, margin=math.degrees(0.5), scale=16)
    pml.W.data = ours.weights.detach().T.clone()
    with_fallback = reference_arcface(embeddings, labels, ours.weights, 16.0, 0.5, fallback=True)
    as_printed = reference_arcface(embeddings, labels, ours.weights, 16.0, 0.5)
    assert abs(with_fallback - as_printed) > 1e-3
    torch.testing.assert_close(pml(embeddings, labels).item(), with_fallback, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours(embeddings, labels).item(), as_printed, rtol=1e-10, atol=1e-10)


def test_gradcheck() -> None:
    embeddings, labels = random_batch(6, 4, 3, seed=2, normalize=False)
    loss = losses.build("arcface", num_classes=4, embedding_dim=4, scale=4.0)
    assert loss_gradcheck(loss, embeddings, labels)


def test_finite_at_cosine_plus_and_minus_one() -> None:
    # Embeddings exactly on (cos = 1) and exactly opposite to (cos = -1) their class centre: acos
    # would have an infinite derivative there; cos(theta + m) is cos m and -cos m.
    loss = losses.build("arcface", num_classes=3, embedding_dim=4).double()
    centres = torch.nn.functional.normalize(loss.weights.detach(), dim=1)
    labels = torch.tensor([0, 1, 2, 0])
    embeddings = torch.cat([centres[[0, 1]], -centres[[2, 0]]]).requires_grad_(True)
    value = loss(embeddings, labels)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(embeddings.grad).all()
    assert torch.isfinite(loss.weights.grad).all()
    expected = reference_arcface(embeddings.detach(), labels, loss.weights, 16.0, 0.5)
    torch.testing.assert_close(value.item(), expected, rtol=1e-6, atol=1e-6)


def test_degenerate_inputs_and_bf16() -> None:
    check_class_loss_degenerate_and_bf16("arcface", bf16_atol=0.3)


def test_contract_and_bad_hyper_parameters() -> None:
    check_class_loss_contract("arcface")
    bad = {"scale": [-16.0], "margin": [-0.1, math.pi]}
    check_bad_hyper_parameters("arcface", bad, num_classes=4, embedding_dim=8)
