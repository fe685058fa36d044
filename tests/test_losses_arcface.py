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
    embeddings: Tensor, labels: Tensor, weights: Tensor, scale: float, margin: float, fallback: bool = True,
) -> float:
    """004 eq. 6 as plain loops, with the angle from acos: s cos(theta_y + m) against s cos theta_c.

    ``fallback``: the ArcFace authors' (insightface's, PML's) cos(theta) - m sin(m) for theta >= pi - m,
    not in eq. 6; without it, eq. 6 as printed."""
    points = [py_unit(x) for x in rows(embeddings)]
    centres = [py_unit(w) for w in rows(weights)]
    total = 0.0
    for x, y in zip(points, labels.tolist()):
        cosines = [max(-1.0, min(1.0, py_dot(x, w))) for w in centres]
        target = math.cos(math.acos(cosines[y]) + margin)
        if fallback and math.acos(cosines[y]) >= math.pi - margin:
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
    # Same softmax over all classes, mean reduction and fallback for theta > pi - m; this batch stays
    # below pi - m. PML takes the margin in degrees. PML's W is [D, C], ours [C, D].
    embeddings, labels = random_batch(9, 5, 4, seed=3, normalize=False)
    ours = losses.build("arcface", num_classes=4, embedding_dim=5).double()
    assert torch.all(target_angles(ours, embeddings, labels) < math.pi - 0.5)
    pml = PMLArcFaceLoss(num_classes=4, embedding_size=5, margin=math.degrees(0.5), scale=16)
    pml.W.data = ours.weights.detach().T.clone()
    assert_same_value_and_gradient(
        ours, pml, embeddings, labels, value_tol=(1e-10, 1e-10), gradient_tol=(1e-7, 1e-9)
    )
    torch.testing.assert_close(ours.weights.grad, pml.W.grad.T, rtol=1e-7, atol=1e-9)


def test_matches_pytorch_metric_learning_beyond_pi_minus_m() -> None:
    # Some target angles beyond pi - m: both use the authors' fallback there, unlike eq. 6 as printed.
    embeddings, labels = random_batch(9, 5, 4, seed=7, normalize=False)
    ours = losses.build("arcface", num_classes=4, embedding_dim=5).double()
    angles = target_angles(ours, embeddings, labels)
    assert torch.any(angles > math.pi - 0.5) and torch.all((angles - (math.pi - 0.5)).abs() > 1e-3)
    pml = PMLArcFaceLoss(num_classes=4, embedding_size=5, margin=math.degrees(0.5), scale=16)
    pml.W.data = ours.weights.detach().T.clone()
    assert_same_value_and_gradient(
        ours, pml, embeddings, labels, value_tol=(1e-10, 1e-10), gradient_tol=(1e-7, 1e-9)
    )
    torch.testing.assert_close(ours.weights.grad, pml.W.grad.T, rtol=1e-7, atol=1e-9)
    with_fallback = reference_arcface(embeddings, labels, ours.weights, 16.0, 0.5)
    as_printed = reference_arcface(embeddings, labels, ours.weights, 16.0, 0.5, fallback=False)
    assert abs(with_fallback - as_printed) > 1e-3
    torch.testing.assert_close(ours(embeddings, labels).item(), with_fallback, rtol=1e-10, atol=1e-10)
    assert loss_gradcheck(ours, embeddings, labels)


def target_logit(margin: float, theta: Tensor) -> Tensor:
    """The unscaled target logit f(theta) of ArcFace with margin ``margin``, as a function of the angle."""
    loss = losses.build("arcface", num_classes=2, embedding_dim=2, margin=margin).double()
    return loss.target_cosine(torch.cos(theta))


@pytest.mark.parametrize("margin", [0.0, 0.2, 0.5, 1.0, math.pi / 2, 2.3])
def test_target_logit_is_non_increasing_with_one_downward_step_at_pi_minus_m(margin: float) -> None:
    theta = torch.linspace(0, math.pi, 20001, dtype=torch.float64)
    logit = target_logit(margin, theta)
    steps = logit.diff()
    assert torch.all(steps <= 1e-15)
    # Continuous away from pi - m: cos(theta + m) and cos(theta) - m sin(m) are 1-Lipschitz in theta.
    step = math.pi / 20000
    kink = int((math.pi - margin) / step)  # the grid interval containing pi - m
    away = torch.cat([steps[: max(kink - 1, 0)], steps[kink + 2 :]])
    assert torch.all(away.abs() <= step * (1 + 1e-9))
    # At pi - m itself the authors' fallback is not continuous: one-sided limits -1 and -cos m - m sin m.
    near = torch.tensor([math.pi - margin - 1e-9, math.pi - margin + 1e-9], dtype=torch.float64)
    below, beyond = target_logit(margin, near).tolist()
    assert below == pytest.approx(-1.0, abs=1e-8)
    assert beyond == pytest.approx(-math.cos(margin) - margin * math.sin(margin), abs=1e-8)
    assert below - beyond == pytest.approx(math.cos(margin) + margin * math.sin(margin) - 1, abs=1e-8)
    assert below - beyond >= -1e-8


def test_the_fallback_step_goes_up_for_margins_beyond_2_331() -> None:
    # cos m + m sin m < 1: the documented limit of the authors' fallback (such margins are not used).
    near = torch.tensor([math.pi - 2.5 - 1e-9, math.pi - 2.5 + 1e-9], dtype=torch.float64)
    below, beyond = target_logit(2.5, near)
    assert beyond > below


def test_target_logit_gradient_is_finite_and_decreasing_around_pi_minus_m() -> None:
    margin = 0.5
    kink = math.pi - margin
    theta = torch.tensor(
        [0.3, 1.5, kink - 0.1, kink - 1e-3, kink + 1e-3, kink + 0.1, math.pi - 0.05, math.pi - 1e-3],
        dtype=torch.float64,
        requires_grad=True,
    )
    assert torch.autograd.gradcheck(lambda t: target_logit(margin, t), (theta,), eps=1e-7, atol=1e-6, rtol=1e-5)
    (gradient,) = torch.autograd.grad(target_logit(margin, theta).sum(), theta)
    expected = torch.where(theta < kink, -torch.sin(theta + margin), -torch.sin(theta))
    assert torch.isfinite(gradient).all() and torch.all(gradient < 0)
    torch.testing.assert_close(gradient, expected.detach(), rtol=1e-6, atol=1e-9)
    # In the cosine: d f / d cos theta > 0 on both sides, 1 on the fallback side.
    cosine = torch.cos(theta.detach()).requires_grad_(True)
    loss = losses.build("arcface", num_classes=2, embedding_dim=2, margin=margin).double()
    (by_cosine,) = torch.autograd.grad(loss.target_cosine(cosine).sum(), cosine)
    assert torch.all(by_cosine > 0) and torch.all(by_cosine[theta.detach() > kink] == 1.0)


def test_unchanged_below_pi_minus_m() -> None:
    # The margin branch is the former value cos t cos m - sin t sin m, bit for bit, and cos(t + m).
    for margin in (0.2, 0.5, 1.0):
        theta = torch.linspace(0, math.pi - margin - 1e-6, 2001, dtype=torch.float64)
        cosine = torch.cos(theta)
        sine = (1.0 - cosine * cosine).clamp_min(torch.finfo(torch.float64).eps).sqrt()
        former = cosine * math.cos(margin) - sine * math.sin(margin)
        assert torch.equal(target_logit(margin, theta), former)
        torch.testing.assert_close(target_logit(margin, theta), torch.cos(theta + margin), rtol=0, atol=1e-7)
    embeddings, labels = random_batch(9, 5, 4, seed=3, normalize=False)
    loss = losses.build("arcface", num_classes=4, embedding_dim=5).double()
    assert torch.all(target_angles(loss, embeddings, labels) < math.pi - 0.5)
    as_printed = reference_arcface(embeddings, labels, loss.weights, 16.0, 0.5, fallback=False)
    torch.testing.assert_close(loss(embeddings, labels).item(), as_printed, rtol=1e-10, atol=1e-10)


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
