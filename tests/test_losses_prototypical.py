import math

import pytest
import torch
from losses_testkit import (
    check_bf16_autocast,
    check_degenerate_inputs,
    check_permutation_invariance,
    loss_gradcheck,
    py_distance,
    random_batch,
    rows,
)

from dmlbench import losses
from dmlbench.errors import UserInputError

# pytorch-metric-learning has no prototypical loss, so there is no cross-check against it.


def mean(vectors: list[list[float]]) -> list[float]:
    return [sum(column) / len(vectors) for column in zip(*vectors)]


def softmax_nll(distances: dict[int, float], own: int) -> float:
    return distances[own] + math.log(sum(math.exp(-d) for d in distances.values()))


def reference_half(embeddings: torch.Tensor, labels: torch.Tensor) -> float:
    """Seed 000 eq. 13 as loops: per class the first ceil(n/2) samples are supports, the rest queries."""
    points, ys = rows(embeddings), labels.tolist()
    by_class: dict[int, list[int]] = {}
    for index, y in enumerate(ys):
        by_class.setdefault(y, []).append(index)
    prototypes, queries = {}, []
    for y, indices in by_class.items():
        supports = (len(indices) + 1) // 2
        prototypes[y] = mean([points[i] for i in indices[:supports]])
        queries += [(i, y) for i in indices[supports:]]
    if not queries:
        return 0.0
    total = 0.0
    for i, y in queries:
        total += softmax_nll({k: py_distance(points[i], mu) ** 2 for k, mu in prototypes.items()}, y)
    return total / len(queries)


def reference_leave_one_out(embeddings: torch.Tensor, labels: torch.Tensor) -> float:
    """Seed 000 eq. 13 as loops: every sample of a class with >= 2 samples is a query; its own
    prototype leaves it out."""
    points, ys = rows(embeddings), labels.tolist()
    total, count = 0.0, 0
    for i, y in enumerate(ys):
        own = [points[j] for j in range(len(ys)) if ys[j] == y and j != i]
        if not own:
            continue
        class_means = {k: mean([points[j] for j in range(len(ys)) if ys[j] == k]) for k in set(ys)}
        distances = {k: py_distance(points[i], mu) ** 2 for k, mu in class_means.items()}
        distances[y] = py_distance(points[i], mean(own)) ** 2
        total += softmax_nll(distances, y)
        count += 1
    return total / count if count else 0.0


REFERENCES = {"half": reference_half, "leave_one_out": reference_leave_one_out}


@pytest.mark.parametrize("split", ["half", "leave_one_out"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_brute_force(split: str, seed: int) -> None:
    embeddings, labels = random_batch(11, 5, 4, seed=seed, normalize=False)
    loss = losses.build("prototypical", split=split)
    expected = REFERENCES[split](embeddings, labels)
    torch.testing.assert_close(loss(embeddings, labels).item(), expected, rtol=1e-10, atol=1e-12)


def test_half_split_reproduces_an_episode() -> None:
    # Seed 000's episodes: Nc classes, Ns supports then Nq queries per class (Ns = Nq = 3 here).
    embeddings, _ = random_batch(12, 4, 2, seed=5, normalize=False)
    labels = torch.tensor([0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1])
    supports, queries = embeddings[[0, 1, 2, 3, 4, 5]], embeddings[6:]
    prototypes = torch.stack([supports[:3].mean(0), supports[3:].mean(0)])
    logits = -torch.cdist(queries, prototypes) ** 2
    episode = torch.nn.functional.cross_entropy(logits, torch.tensor([0, 0, 0, 1, 1, 1]))
    torch.testing.assert_close(losses.build("prototypical")(embeddings, labels), episode)


@pytest.mark.parametrize("split", ["half", "leave_one_out"])
def test_gradcheck(split: str) -> None:
    embeddings, labels = random_batch(8, 3, 3, seed=2, normalize=False)
    assert loss_gradcheck(losses.build("prototypical", split=split), embeddings, labels)


@pytest.mark.parametrize("split", ["half", "leave_one_out"])
def test_degenerate_inputs_and_bf16(split: str) -> None:
    loss = losses.build("prototypical", split=split)
    values = check_degenerate_inputs(loss)
    assert float(values["no_positive_pairs"]) == 0.0  # singleton classes: prototypes but no queries
    assert float(values["one_class"]) == 0.0  # a softmax over one prototype
    torch.testing.assert_close(float(values["identical_embeddings"]), math.log(2))
    embeddings, labels = random_batch(12, 8, 4, seed=1, dtype=torch.float32)
    value = check_bf16_autocast(loss, embeddings, labels)
    torch.testing.assert_close(value, loss(embeddings, labels).detach(), rtol=0.05, atol=0.05)


def test_leave_one_out_does_not_depend_on_batch_order() -> None:
    embeddings, labels = random_batch(12, 5, 4, seed=3, normalize=False)
    check_permutation_invariance(losses.build("prototypical", split="leave_one_out"), embeddings, labels)


def test_bad_input() -> None:
    with pytest.raises(UserInputError, match="split"):
        losses.build("prototypical", split="random")
    with pytest.raises(UserInputError, match="labels"):
        losses.build("prototypical")(torch.zeros(4, 3), torch.zeros(3, dtype=torch.long))
    with pytest.raises(UserInputError, match="temperature"):
        losses.build("prototypical", temperature=0.1)
