import pytest
import torch
from losses_testkit import (
    check_bad_hyper_parameters,
    check_class_loss_contract,
    check_class_loss_degenerate_and_bf16,
    loss_gradcheck,
    py_distance,
    py_unit,
    random_batch,
    rows,
)

from dmlbench import losses

# pytorch-metric-learning has no proxy triplet loss, so there is no cross-check against it.


def reference_proxy_triplet(
    embeddings: torch.Tensor, labels: torch.Tensor, proxies: torch.Tensor, margin: float, squared: bool
) -> float:
    """Seed 000 eq. 1 with proxies, as plain loops over every (sample, negative proxy) triplet."""
    points = [py_unit(x) for x in rows(embeddings)]
    centres = [py_unit(p) for p in rows(proxies)]
    hinges = []
    for x, y in zip(points, labels.tolist()):
        d = [py_distance(x, p) ** (2 if squared else 1) for p in centres]
        hinges += [max(0.0, d[y] - d[c] + margin) for c in range(len(centres)) if c != y]
    return sum(hinges) / len(hinges)


@pytest.mark.parametrize("squared", [True, False])
@pytest.mark.parametrize("margin", [0.0, 0.3, 1.0])
def test_matches_brute_force(squared: bool, margin: float) -> None:
    embeddings, labels = random_batch(10, 6, 5, seed=4, normalize=False)
    loss = losses.build("proxy_triplet", num_classes=5, embedding_dim=6, margin=margin, squared=squared).double()
    expected = reference_proxy_triplet(embeddings, labels, loss.proxies, margin, squared)
    torch.testing.assert_close(loss(embeddings, labels).item(), expected, rtol=1e-10, atol=1e-12)


def test_default_is_squared_distance_with_margin_one() -> None:
    embeddings, labels = random_batch(8, 6, 4, seed=6)
    loss = losses.build("proxy_triplet", num_classes=4, embedding_dim=6).double()
    expected = reference_proxy_triplet(embeddings, labels, loss.proxies, margin=1.0, squared=True)
    torch.testing.assert_close(loss(embeddings, labels).item(), expected, rtol=1e-10, atol=1e-12)


def test_gradcheck() -> None:
    # margin 0.5 keeps every hinge away from its kink on this batch, where the loss is smooth.
    embeddings, labels = random_batch(6, 4, 3, seed=2, normalize=False)
    loss = losses.build("proxy_triplet", num_classes=3, embedding_dim=4, margin=0.5)
    assert loss_gradcheck(loss, embeddings, labels)


def test_satisfied_triplets_give_zero_loss_and_gradient() -> None:
    # Embeddings on their own proxies: d_pos = 0 and d_neg = 2 - 2 cos >= margin for a small margin.
    loss = losses.build("proxy_triplet", num_classes=3, embedding_dim=4, margin=0.01).double()
    labels = torch.tensor([0, 1, 2, 1])
    embeddings = loss.proxies.detach()[labels].clone().requires_grad_(True)
    value = loss(embeddings, labels)
    value.backward()
    assert float(value.detach()) == 0.0
    assert torch.count_nonzero(embeddings.grad) == 0


def test_degenerate_inputs_and_bf16() -> None:
    check_class_loss_degenerate_and_bf16("proxy_triplet", bf16_atol=0.05)


def test_contract_and_bad_hyper_parameters() -> None:
    check_class_loss_contract("proxy_triplet")
    check_bad_hyper_parameters("proxy_triplet", {"margin": [-0.1]}, num_classes=4, embedding_dim=8)
