import math

import pytest
import torch
from losses_testkit import (
    assert_same_value_and_gradient,
    check_bad_hyper_parameters,
    check_class_loss_contract,
    check_class_loss_degenerate_and_bf16,
    loss_gradcheck,
    py_distance,
    py_dot,
    py_unit,
    random_batch,
    rows,
)
from pytorch_metric_learning.losses import SoftTripleLoss as PMLSoftTripleLoss
from torch import Tensor

from dmlbench import losses


def reference_softtriple(
    embeddings: Tensor, labels: Tensor, centers: Tensor, scale: float, gamma: float, margin: float,
    tau: float,
) -> float:
    """004 eq. 16-18 as plain loops (eq. 16 with the phi^T psi factor; eq. 18 over unordered pairs)."""
    points = [py_unit(x) for x in rows(embeddings)]
    classes = [[py_unit(c) for c in per_class] for per_class in centers.detach().double().tolist()]
    base = 0.0
    for x, y in zip(points, labels.tolist()):
        similarity = []
        for per_class in classes:
            cosines = [py_dot(x, c) for c in per_class]
            weights = [math.exp(c / gamma) for c in cosines]
            similarity.append(sum(w * c for w, c in zip(weights, cosines)) / sum(weights))
        logits = [scale * (s - (margin if k == y else 0.0)) for k, s in enumerate(similarity)]
        base += -(logits[y] - math.log(sum(math.exp(v) for v in logits)))
    base /= len(points)
    k = len(classes[0])
    spread = sum(
        py_distance(per_class[a], per_class[b]) for per_class in classes for a in range(k) for b in range(a + 1, k)
    )
    return base + (tau * spread / (len(classes) * k * (k - 1)) if k > 1 else 0.0)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"centers_per_class": 3, "scale": 20.0, "gamma": 0.5, "margin": 0.1, "tau": 1.0},
        {"centers_per_class": 1, "tau": 0.5},
        {"centers_per_class": 3, "tau": 0.0},  # no regulariser: the branch that skips it
    ],
)
def test_matches_brute_force(options: dict) -> None:
    embeddings, labels = random_batch(10, 6, 5, seed=4, normalize=False)
    loss = losses.build("softtriple", num_classes=5, embedding_dim=6, **options).double()
    settings = {"scale": 8.0, "gamma": 0.1, "margin": 0.01, "tau": 0.2} | {
        key: value for key, value in options.items() if key != "centers_per_class"
    }
    expected = reference_softtriple(embeddings, labels, loss.centers, **settings)
    torch.testing.assert_close(loss(embeddings, labels).item(), expected, rtol=1e-10, atol=1e-10)


def test_matches_pytorch_metric_learning_without_the_regulariser() -> None:
    # PML's SoftTripleLoss has no centre regulariser (eq. 18's second term): compare with tau = 0.
    # PML stores the centres as fc [D, C*K], class-major; ours are [C, K, D], so fc = ours.reshape(C*K, D).T.
    embeddings, labels = random_batch(9, 5, 4, seed=7, normalize=False)
    ours = losses.build("softtriple", num_classes=4, embedding_dim=5, tau=0.0).double()
    pml = PMLSoftTripleLoss(num_classes=4, embedding_size=5, centers_per_class=2, la=8.0, gamma=0.1, margin=0.01)
    pml.fc.data = ours.centers.detach().reshape(8, 5).T.clone()
    assert_same_value_and_gradient(
        ours, pml, embeddings, labels, value_tol=(1e-10, 1e-10), gradient_tol=(1e-8, 1e-10)
    )
    torch.testing.assert_close(ours.centers.grad, pml.fc.grad.T.reshape(4, 2, 5), rtol=1e-8, atol=1e-10)


def test_gradcheck() -> None:
    embeddings, labels = random_batch(6, 4, 3, seed=2, normalize=False)
    loss = losses.build("softtriple", num_classes=3, embedding_dim=4, gamma=0.5, tau=1.0)
    assert loss_gradcheck(loss, embeddings, labels)


def test_identical_centres_keep_the_regulariser_gradient_finite() -> None:
    # sqrt(2 - 2 psi1^T psi2) has an infinite derivative where two centres of a class coincide.
    loss = losses.build("softtriple", num_classes=3, embedding_dim=4).double()
    with torch.no_grad():
        loss.centers[:, 1] = loss.centers[:, 0]
    embeddings, labels = random_batch(6, 4, 3, seed=1)
    value = loss(embeddings, labels)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(loss.centers.grad).all()
    expected = reference_softtriple(embeddings, labels, loss.centers, 8.0, 0.1, 0.01, 0.2)
    torch.testing.assert_close(value.item(), expected, rtol=1e-10, atol=1e-10)


def test_degenerate_inputs_and_bf16() -> None:
    check_class_loss_degenerate_and_bf16("softtriple", bf16_atol=0.1)


def test_contract_and_bad_hyper_parameters() -> None:
    check_class_loss_contract("softtriple")
    bad = {"centers_per_class": [0], "scale": [0.0], "gamma": [0.0], "margin": [-0.01], "tau": [-0.2]}
    check_bad_hyper_parameters("softtriple", bad, num_classes=4, embedding_dim=8)
