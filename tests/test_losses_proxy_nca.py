import math

import pytest
import torch
import torch.nn.functional as F
from losses_testkit import (
    assert_same_value_and_gradient,
    check_bad_hyper_parameters,
    check_class_loss_contract,
    check_class_loss_degenerate_and_bf16,
    loss_gradcheck,
    py_distance,
    py_unit,
    random_batch,
    rows,
)
from pytorch_metric_learning.losses import ProxyNCALoss as PMLProxyNCALoss

from dmlbench import losses


def reference_proxy_nca(
    embeddings: torch.Tensor, labels: torch.Tensor, proxies: torch.Tensor, scale: float, squared: bool
) -> float:
    """004 eq. 13 as plain loops: d(x, p_y) + log sum_{c != y} exp(-d(x, p_c)), averaged over the batch."""
    points = [[scale * a for a in py_unit(x)] for x in rows(embeddings)]
    centres = [[scale * a for a in py_unit(p)] for p in rows(proxies)]
    total = 0.0
    for x, y in zip(points, labels.tolist()):
        d = [py_distance(x, p) ** (2 if squared else 1) for p in centres]
        total += d[y] + math.log(sum(math.exp(-d[c]) for c in range(len(centres)) if c != y))
    return total / len(points)


@pytest.mark.parametrize("squared", [True, False])
@pytest.mark.parametrize("scale", [1.0, 3.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_brute_force(squared: bool, scale: float, seed: int) -> None:
    embeddings, labels = random_batch(10, 6, 5, seed=seed, normalize=seed == 0)
    loss = losses.build("proxy_nca", num_classes=5, embedding_dim=6, scale=scale, squared=squared, seed=seed).double()
    expected = reference_proxy_nca(embeddings, labels, loss.proxies, scale, squared)
    torch.testing.assert_close(loss(embeddings, labels).item(), expected, rtol=1e-10, atol=1e-10)


def test_default_distance_is_squared_with_scale_three() -> None:
    embeddings, labels = random_batch(8, 6, 4, seed=3)
    loss = losses.build("proxy_nca", num_classes=4, embedding_dim=6).double()
    expected = reference_proxy_nca(embeddings, labels, loss.proxies, scale=3.0, squared=True)
    torch.testing.assert_close(loss(embeddings, labels).item(), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("squared", [True, False])
def test_gradcheck(squared: bool) -> None:
    embeddings, labels = random_batch(6, 4, 3, seed=2, normalize=False)
    loss = losses.build("proxy_nca", num_classes=3, embedding_dim=4, squared=squared)
    assert loss_gradcheck(loss, embeddings, labels)


def test_matches_pytorch_metric_learning_up_to_the_positive_in_the_denominator() -> None:
    # PML's ProxyNCALoss is -log softmax_c(-softmax_scale * ||x^ - p^_c||^2)_{y} over *all* proxies (the
    # positive included), mean over the batch, with x^, p^ unit vectors. Ours (004 eq. 13) leaves the
    # positive out of the denominator and scales the unit vectors by s, i.e. the squared distances by
    # s^2. Per sample, with ours_i = s^2 d_pos + log sum_{c != y} exp(-s^2 d_c):
    # PML_i = ours_i + log(1 + exp(-ours_i)) = softplus(ours_i) when softmax_scale = s^2.
    scale = 2.0
    embeddings, labels = random_batch(9, 5, 4, seed=5, normalize=False)
    ours = losses.build("proxy_nca", num_classes=4, embedding_dim=5, scale=scale).double()
    pml = PMLProxyNCALoss(num_classes=4, embedding_size=5, softmax_scale=scale**2)
    pml.proxies.data = ours.proxies.detach().clone()

    def mapped(e: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        per_sample = torch.stack([ours(e[i : i + 1], y[i : i + 1]) for i in range(len(y))])
        return F.softplus(per_sample).mean()

    assert_same_value_and_gradient(
        mapped, pml, embeddings, labels, value_tol=(1e-10, 1e-12), gradient_tol=(1e-8, 1e-12)
    )
    torch.testing.assert_close(ours.proxies.grad, pml.proxies.grad, rtol=1e-8, atol=1e-12)


def test_degenerate_inputs_and_bf16() -> None:
    check_class_loss_degenerate_and_bf16("proxy_nca", bf16_atol=0.05)


def test_empty_batch_gives_zero_with_graph() -> None:
    loss = losses.build("proxy_nca", num_classes=3, embedding_dim=4)
    embeddings = torch.zeros(0, 4, requires_grad=True)
    value = loss(embeddings, torch.zeros(0, dtype=torch.long))
    assert float(value.detach()) == 0.0 and value.requires_grad


def test_contract_and_bad_hyper_parameters() -> None:
    check_class_loss_contract("proxy_nca")
    bad = {"scale": [0.0], "squared": ["yes"], "seed": [-1]}
    check_bad_hyper_parameters("proxy_nca", bad, num_classes=4, embedding_dim=8)
