import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from losses_testkit import (
    check_bf16_autocast,
    check_degenerate_inputs,
    check_permutation_invariance,
    loss_gradcheck,
    py_distance,
    random_batch,
    rows,
)
from sklearn.metrics import normalized_mutual_info_score

from dmlbench import losses
from dmlbench.errors import UserInputError
from dmlbench.losses.facility_location import batched_nmi, greedy_loss_augmented_medoids

# pytorch-metric-learning has no structured clustering loss, so there is no cross-check against it.


class Reference:
    """Seed 000 eq. 10-12 with Song et al.'s greedy loss-augmented inference, as plain loops."""

    def __init__(self, embeddings: torch.Tensor, labels: torch.Tensor, margin_multiplier: float) -> None:
        points = rows(embeddings)
        self.size = len(points)
        self.labels = labels.tolist()
        self.gamma = margin_multiplier
        self.d = [[py_distance(p, q) for q in points] for p in points]

    def facility(self, medoids: list[int]) -> float:
        return -sum(min(self.d[i][j] for j in medoids) for i in range(self.size))

    def assignment(self, medoids: list[int]) -> list[int]:
        clusters = []
        for i in range(self.size):
            if i in medoids:
                clusters.append(medoids.index(i))
                continue
            distances = [self.d[i][j] for j in medoids]
            clusters.append(distances.index(min(distances)))  # first minimum: the earlier medoid
        return clusters

    def augmented(self, medoids: list[int]) -> float:
        nmi = normalized_mutual_info_score(self.labels, self.assignment(medoids))
        return self.facility(medoids) + self.gamma * (1.0 - nmi)

    def greedy(self) -> list[int]:
        chosen: list[int] = []
        for _ in range(len(set(self.labels))):
            best, best_score = -1, float("-inf")
            for j in range(self.size):
                if j not in chosen and self.augmented(chosen + [j]) > best_score:
                    best, best_score = j, self.augmented(chosen + [j])
            chosen.append(best)
        return chosen

    def oracle(self) -> float:
        total = 0.0
        for k in set(self.labels):
            members = [i for i in range(self.size) if self.labels[i] == k]
            total += max(-sum(self.d[i][j] for i in members) for j in members)
        return total

    def loss(self) -> float:
        return max(0.0, self.augmented(self.greedy()) - self.oracle())


def test_batched_nmi_matches_sklearn() -> None:
    generator = torch.Generator().manual_seed(0)
    truth = torch.randint(0, 4, (15,), generator=generator)
    predicted = torch.randint(0, 5, (30, 15), generator=generator)
    predicted[0] = 0  # one predicted cluster: NMI 0
    predicted[1] = truth  # perfect
    predicted[2] = torch.arange(15)  # singletons
    predicted[3] = (truth + 1) % 4  # relabelled: still perfect
    expected = torch.tensor(
        [normalized_mutual_info_score(truth.tolist(), row.tolist()) for row in predicted], dtype=torch.float64
    )
    torch.testing.assert_close(batched_nmi(predicted, truth), expected, rtol=1e-12, atol=1e-12)
    one_class = torch.zeros(6, dtype=torch.long)
    both_single = batched_nmi(torch.zeros(1, 6, dtype=torch.long), one_class)
    assert float(both_single) == normalized_mutual_info_score([0] * 6, [0] * 6) == 1.0


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4)), min_size=1, max_size=12))
def test_batched_nmi_matches_sklearn_on_any_labelling(pairs: list[tuple[int, int]]) -> None:
    truth = torch.tensor([t for t, _ in pairs])
    _, truth = torch.unique(truth, return_inverse=True)  # ids in [0, K) as the loss passes them
    predicted = torch.tensor([[p for _, p in pairs]])
    expected = normalized_mutual_info_score(truth.tolist(), predicted[0].tolist())
    assert abs(float(batched_nmi(predicted, truth)) - expected) < 1e-12


@pytest.mark.parametrize(
    ("seed", "size", "classes", "gamma"), [(0, 7, 3, 1.0), (1, 12, 4, 1.0), (2, 10, 3, 5.0), (3, 9, 3, 0.0)]
)
def test_matches_brute_force_greedy(seed: int, size: int, classes: int, gamma: float) -> None:
    embeddings, labels = random_batch(size, 4, classes, seed=seed, normalize=seed % 2 == 0)
    reference = Reference(embeddings, labels, gamma)
    distances = torch.cdist(embeddings, embeddings)
    _, class_index = torch.unique(labels, return_inverse=True)
    assert greedy_loss_augmented_medoids(distances, class_index, gamma).tolist() == reference.greedy()
    loss = losses.build("facility_location", margin_multiplier=gamma)
    torch.testing.assert_close(loss(embeddings, labels).item(), reference.loss(), rtol=1e-10, atol=1e-10)


def test_greedy_never_beats_the_exhaustive_maximum() -> None:
    # Eq. 11's max over all |S| = |Y| subsets, by enumeration on a tiny batch: greedy is a lower bound.
    for seed in range(2):
        embeddings, labels = random_batch(7, 3, 3, seed=seed, normalize=False)
        reference = Reference(embeddings, labels, 1.0)
        subsets = itertools.combinations(range(7), len(set(labels.tolist())))
        exhaustive = max(reference.augmented(list(subset)) for subset in subsets)
        assert reference.augmented(reference.greedy()) <= exhaustive + 1e-12


def test_well_separated_classes_give_zero_loss() -> None:
    # Tight clusters far apart: the greedy picks each class's medoid, NMI = 1 and F(S) = F~.
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]], dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2])
    noise = 0.01 * torch.randn(9, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    embeddings = (centres[labels] + noise).requires_grad_(True)
    value = losses.build("facility_location")(embeddings, labels)
    value.backward()
    assert float(value.detach()) == 0.0 and torch.count_nonzero(embeddings.grad) == 0


def test_gradcheck() -> None:
    # With distinct random points the inferred medoids are constant under gradcheck's perturbations.
    embeddings, labels = random_batch(8, 3, 3, seed=5, normalize=False)
    loss = losses.build("facility_location")
    assert float(loss(embeddings, labels)) > 0
    assert loss_gradcheck(loss, embeddings, labels)


def test_degenerate_inputs_bf16_and_batch_order() -> None:
    loss = losses.build("facility_location")
    values = check_degenerate_inputs(loss)
    assert float(values["one_class"]) == 0.0  # |Y| = 1: the best single medoid is the oracle's
    assert float(values["no_positive_pairs"]) == 0.0  # every point its own medoid
    embeddings, labels = random_batch(12, 8, 4, seed=1, dtype=torch.float32)
    check_bf16_autocast(loss, embeddings, labels)
    check_permutation_invariance(loss, *random_batch(12, 4, 4, seed=9, normalize=False))


def test_bad_input() -> None:
    with pytest.raises(UserInputError, match="margin_multiplier"):
        losses.build("facility_location", margin_multiplier=-1.0)
    with pytest.raises(UserInputError, match="embeddings"):
        losses.build("facility_location")(torch.zeros(4), torch.zeros(4, dtype=torch.long))
