import itertools

import torch

from dmlbench.distances import cosine_similarity, euclidean, same_label_mask, squared_euclidean


def brute_force_euclidean(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(len(x), len(y), dtype=torch.float64)
    for i, j in itertools.product(range(len(x)), range(len(y))):
        out[i, j] = sum((float(a) - float(b)) ** 2 for a, b in zip(x[i], y[j])) ** 0.5
    return out


def test_euclidean_matches_brute_force() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(7, 5, generator=generator, dtype=torch.float64)
    y = torch.randn(4, 5, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(euclidean(x, y), brute_force_euclidean(x, y))
    torch.testing.assert_close(euclidean(x), brute_force_euclidean(x, x))
    torch.testing.assert_close(squared_euclidean(x, y), brute_force_euclidean(x, y) ** 2)


def test_self_distance_is_exactly_zero_with_finite_gradient() -> None:
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    duplicated = torch.cat([x, x])
    distances = euclidean(duplicated)
    assert torch.all(distances.diagonal() == 0)
    distances.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_euclidean_gradcheck_away_from_zero() -> None:
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(euclidean, (x, y))


def test_cosine_similarity_of_parallel_vectors_is_one() -> None:
    x = torch.tensor([[1.0, 2.0], [2.0, 4.0], [-1.0, -2.0]])
    similarity = cosine_similarity(x)
    torch.testing.assert_close(similarity[0, 1], torch.tensor(1.0))
    torch.testing.assert_close(similarity[0, 2], torch.tensor(-1.0))


def test_same_label_mask() -> None:
    labels = torch.tensor([0, 1, 0])
    expected = torch.tensor([[True, False, True], [False, True, False], [True, False, True]])
    assert torch.equal(same_label_mask(labels), expected)
