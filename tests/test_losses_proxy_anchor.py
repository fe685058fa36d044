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
from pytorch_metric_learning.losses import ProxyAnchorLoss as PMLProxyAnchorLoss

from dmlbench import losses


def reference_proxy_anchor(
    embeddings: torch.Tensor, labels: torch.Tensor, proxies: torch.Tensor, alpha: float, margin: float
) -> float:
    """Kim et al. 2020 as plain loops over proxies and samples."""
    points = [py_unit(x) for x in rows(embeddings)]
    centres = [py_unit(p) for p in rows(proxies)]
    ys = labels.tolist()
    pull, push, with_positives = 0.0, 0.0, 0
    for c, p in enumerate(centres):
        positives = [py_dot(x, p) for x, y in zip(points, ys) if y == c]
        negatives = [py_dot(x, p) for x, y in zip(points, ys) if y != c]
        if positives:
            with_positives += 1
            pull += math.log(1 + sum(math.exp(-alpha * (s - margin)) for s in positives))
        push += math.log(1 + sum(math.exp(alpha * (s + margin)) for s in negatives))
    return pull / with_positives + push / len(centres)


@pytest.mark.parametrize(("alpha", "margin"), [(32.0, 0.1), (4.0, 0.0), (10.0, 0.3)])
def test_matches_brute_force(alpha: float, margin: float) -> None:
    embeddings, labels = random_batch(10, 6, 5, seed=1, normalize=False)
    loss = losses.build("proxy_anchor", num_classes=5, embedding_dim=6, alpha=alpha, margin=margin).double()
    expected = reference_proxy_anchor(embeddings, labels, loss.proxies, alpha, margin)
    torch.testing.assert_close(loss(embeddings, labels).item(), expected, rtol=1e-10, atol=1e-10)


def test_proxies_without_positives_only_push() -> None:
    # Labels use 2 of 6 classes: the pull term averages over those 2, the push term over all 6.
    embeddings, _ = random_batch(6, 5, 2, seed=3)
    labels = torch.tensor([0, 4, 0, 4, 4, 0])
    loss = losses.build("proxy_anchor", num_classes=6, embedding_dim=5).double()
    expected = reference_proxy_anchor(embeddings, labels, loss.proxies, 32.0, 0.1)
    torch.testing.assert_close(loss(embeddings, labels).item(), expected, rtol=1e-10, atol=1e-10)


def test_matches_pytorch_metric_learning() -> None:
    # Same definition (pull term / proxies with positives, push term / all proxies, cosine similarity),
    # PML stores the proxies as [C, D] too: values and gradients must agree.
    embeddings, labels = random_batch(9, 5, 4, seed=7, normalize=False)
    ours = losses.build("proxy_anchor", num_classes=4, embedding_dim=5).double()
    pml = PMLProxyAnchorLoss(num_classes=4, embedding_size=5, margin=0.1, alpha=32)
    pml.proxies.data = ours.proxies.detach().clone()
    assert_same_value_and_gradient(
        ours, pml, embeddings, labels, value_tol=(1e-10, 1e-10), gradient_tol=(1e-8, 1e-10)
    )
    torch.testing.assert_close(ours.proxies.grad, pml.proxies.grad, rtol=1e-8, atol=1e-10)


def test_gradcheck() -> None:
    embeddings, labels = random_batch(6, 4, 3, seed=2, normalize=False)
    loss = losses.build("proxy_anchor", num_classes=4, embedding_dim=4, alpha=8.0)
    assert loss_gradcheck(loss, embeddings, labels)


def test_degenerate_inputs_and_bf16() -> None:
    check_class_loss_degenerate_and_bf16("proxy_anchor", bf16_atol=0.5)


def test_contract_and_bad_hyper_parameters() -> None:
    check_class_loss_contract("proxy_anchor")
    check_bad_hyper_parameters("proxy_anchor", {"alpha": [0], "margin": [-1.0]}, num_classes=4, embedding_dim=8)
