import itertools
import math
from collections import Counter
from collections.abc import Callable

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
from dmlbench.losses.facility_location import (
    assign_to_medoids,
    batched_nmi,
    greedy_loss_augmented_medoids,
    nearest_other_medoid,
    nmi_after_moves,
    swap_moves,
    swap_refined_medoids,
)

# pytorch-metric-learning has no structured clustering loss, so there is no cross-check against it.


def plain_nmi(truth: list[int], predicted: list[int]) -> float:
    """sklearn's arithmetic NMI from the definition, in plain float64 Python (sklearn's own call costs
    ~1 ms, too slow for exhaustive searches); checked against sklearn below."""
    size, joint = len(truth), Counter(zip(truth, predicted))
    true_sizes, predicted_sizes = Counter(truth), Counter(predicted)
    if len(true_sizes) == len(predicted_sizes) == 1:
        return 1.0
    information = sum(
        c / size * math.log(size * c / (true_sizes[t] * predicted_sizes[p])) for (t, p), c in joint.items()
    )
    if information <= 0:
        return 0.0

    def entropy(counts: Counter) -> float:
        return -sum(c / size * math.log(c / size) for c in counts.values())

    return information / ((entropy(true_sizes) + entropy(predicted_sizes)) / 2)


class Reference:
    """Seed 000 eq. 10-12 with Song et al.'s greedy loss-augmented inference and swap refinement, as
    plain loops."""

    def __init__(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor,
        margin_multiplier: float,
        nmi: Callable[[list[int], list[int]], float] = normalized_mutual_info_score,
    ) -> None:
        points = rows(embeddings)
        self.nmi = nmi
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
        nmi = self.nmi(self.labels, self.assignment(medoids))
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

    def refined(self, medoids: list[int]) -> list[int]:
        """Passes over the positions; at each, the best strictly improving swap (first j on ties)."""
        medoids, current = list(medoids), self.augmented(medoids)
        for _ in range(10):
            swapped = False
            for p in range(len(medoids)):
                best, best_score = -1, current + 1e-10 * (abs(current) + 1.0)
                for j in range(self.size):
                    if j not in medoids:
                        score = self.augmented(medoids[:p] + [j] + medoids[p + 1 :])
                        if score > best_score:
                            best, best_score = j, score
                if best >= 0:
                    medoids[p], current, swapped = best, best_score, True
            if not swapped:
                break
        return medoids

    def exhaustive(self) -> float:
        """Eq. 11's max over all |S| = |Y| subsets, by enumeration."""
        subsets = itertools.combinations(range(self.size), len(set(self.labels)))
        return max(self.augmented(list(subset)) for subset in subsets)

    def oracle(self) -> float:
        total = 0.0
        for k in set(self.labels):
            members = [i for i in range(self.size) if self.labels[i] == k]
            total += max(-sum(self.d[i][j] for i in members) for j in members)
        return total

    def loss(self, refine: bool = True) -> float:
        medoids = self.refined(self.greedy()) if refine else self.greedy()
        return max(0.0, self.augmented(medoids) - self.oracle())


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
    greedy = greedy_loss_augmented_medoids(distances, class_index, gamma)
    assert greedy.tolist() == reference.greedy()
    loss = losses.build("facility_location", margin_multiplier=gamma, refine=False)
    torch.testing.assert_close(loss(embeddings, labels).item(), reference.loss(False), rtol=1e-10, atol=1e-10)
    # The default, with the swap refinement: same medoids in the same order, and the loss.
    refined = swap_refined_medoids(distances, class_index, gamma, greedy)
    assert refined.tolist() == reference.refined(reference.greedy())
    loss = losses.build("facility_location", margin_multiplier=gamma)
    torch.testing.assert_close(loss(embeddings, labels).item(), reference.loss(), rtol=1e-10, atol=1e-10)


def test_greedy_never_beats_the_exhaustive_maximum() -> None:
    # Eq. 11's max over all |S| = |Y| subsets, by enumeration on a tiny batch: greedy is a lower bound.
    for seed in range(2):
        embeddings, labels = random_batch(7, 3, 3, seed=seed, normalize=False)
        reference = Reference(embeddings, labels, 1.0)
        assert reference.augmented(reference.greedy()) <= reference.exhaustive() + 1e-12


def test_refinement_reaches_the_exhaustive_maximum_far_more_often_than_greedy() -> None:
    # 40 random batches of 6-9 points in 2-3 classes: the objective of greedy and refined medoid sets
    # (brute force, float64, sklearn's NMI) against the maximum over all |S| = |Y| subsets.
    generator = torch.Generator().manual_seed(0)
    greedy_hits = refined_hits = 0
    for _ in range(40):
        size = int(torch.randint(6, 10, (1,), generator=generator))
        classes = int(torch.randint(2, 4, (1,), generator=generator))
        others = torch.randint(0, classes, (size - classes,), generator=generator)
        labels = torch.cat([torch.arange(classes), others])  # every class present, ids in [0, classes)
        embeddings = torch.randn(size, 3, generator=generator, dtype=torch.float64)
        reference = Reference(embeddings, labels, 1.0, nmi=plain_nmi)
        distances = torch.cdist(embeddings, embeddings)
        greedy = greedy_loss_augmented_medoids(distances, labels, 1.0)
        refined = swap_refined_medoids(distances, labels, 1.0, greedy)
        best = reference.exhaustive()
        greedy_score, refined_score = reference.augmented(greedy.tolist()), reference.augmented(refined.tolist())
        with_sklearn = Reference(embeddings, labels, 1.0)
        assert with_sklearn.augmented(refined.tolist()) == pytest.approx(refined_score, abs=1e-12)
        assert greedy_score <= refined_score <= best + 1e-12
        greedy_hits += greedy_score >= best - 1e-12
        refined_hits += refined_score >= best - 1e-12
    # Measured: greedy 23 of 40, refined 37 of 40.
    assert refined_hits >= 34 and refined_hits - greedy_hits >= 10


def test_refinement_undoes_a_greedy_centre_medoid() -> None:
    # Two tight classes on a line and one class-1 point in the middle: greedy first picks that centre
    # (the best single medoid), which no second medoid repairs; one swap reaches the unique optimum.
    embeddings = torch.tensor([[-2.1], [-2.0], [-1.9], [0.05], [1.9], [2.0], [2.1]], dtype=torch.float64)
    labels = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    reference = Reference(embeddings, labels, 1.0, nmi=plain_nmi)
    scores = sorted(
        (reference.augmented(list(subset)), subset) for subset in itertools.combinations(range(7), 2)
    )
    (second, _), (best, best_subset) = scores[-2:]
    assert best > second + 0.05  # a unique optimum: {-1.9, 2.0}
    distances = torch.cdist(embeddings, embeddings)
    greedy = greedy_loss_augmented_medoids(distances, labels, 1.0)
    assert 3 in greedy.tolist() and reference.augmented(greedy.tolist()) < best - 1.0
    refined = swap_refined_medoids(distances, labels, 1.0, greedy)
    assert sorted(refined.tolist()) == list(best_subset)
    assert Reference(embeddings, labels, 1.0).augmented(refined.tolist()) == pytest.approx(best, abs=1e-12)
    assert swap_refined_medoids(distances, labels, 1.0, greedy, max_passes=0).tolist() == greedy.tolist()
    # Greedy's augmented score is below the oracle's, so its loss is 0; the refined one is not.
    assert float(losses.build("facility_location", refine=False)(embeddings, labels)) == 0.0
    value = losses.build("facility_location")(embeddings, labels)
    assert float(value) == pytest.approx(best - reference.oracle(), abs=1e-12) and float(value) > 0.3


def test_swap_assignments_keep_the_tie_rules() -> None:
    # Points on a small integer grid, some repeated: many equal distances and zero-distance pairs.
    # Every swap's vectorised assignment is assign_to_medoids of the swapped set.
    generator = torch.Generator().manual_seed(3)
    embeddings = torch.randint(0, 3, (14, 2), generator=generator).double()
    embeddings[10:] = embeddings[:4]
    distances = torch.cdist(embeddings, embeddings)
    for medoids in (torch.tensor([4, 0, 9]), torch.tensor([10, 0, 7, 2]), torch.tensor([5])):
        newcomers = torch.tensor([j for j in range(14) if j not in medoids.tolist()])
        for position in range(len(medoids)):
            nearest_other = nearest_other_medoid(distances, medoids, position)
            held, moved = swap_moves(distances, medoids, position, newcomers, nearest_other)
            for row, j in enumerate(newcomers.tolist()):
                trial = medoids.clone()
                trial[position] = j
                assert torch.equal(torch.where(moved[row], position, held), assign_to_medoids(distances, trial))


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4)), min_size=1, max_size=14),
    st.lists(st.lists(st.booleans(), min_size=14, max_size=14), min_size=1, max_size=5),
)
def test_nmi_after_moves_is_the_nmi_of_the_moved_clustering(pairs: list[tuple[int, int]], rows: list[list[bool]]) -> None:
    # The incremental NMI against batched_nmi (itself checked against sklearn) of the clustering it describes:
    # moves out of every cluster, of whole clusters, of nothing and of everything.
    _, truth = torch.unique(torch.tensor([t for t, _ in pairs]), return_inverse=True)
    base = torch.tensor([p for _, p in pairs])
    moved = torch.tensor(rows)[:, : len(pairs)]
    moved = torch.cat([moved, torch.zeros_like(moved[:1]), torch.ones_like(moved[:1]), (base == base[0]).unsqueeze(0)])
    direct = batched_nmi(torch.where(moved, int(base.max()) + 1, base.unsqueeze(0)), truth)
    torch.testing.assert_close(nmi_after_moves(base, truth, moved), direct, rtol=1e-12, atol=1e-12)


def test_refinement_never_lowers_the_loss() -> None:
    # The oracle term is the same, the augmented max can only grow.
    for seed in range(4):
        embeddings, labels = random_batch(40, 8, 6, seed=seed)
        refined = losses.build("facility_location")(embeddings, labels)
        greedy = losses.build("facility_location", refine=False)(embeddings, labels)
        assert float(refined) >= float(greedy)


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
    with pytest.raises(UserInputError, match="refine"):
        losses.build("facility_location", refine="yes")
    with pytest.raises(UserInputError, match="embeddings"):
        losses.build("facility_location")(torch.zeros(4), torch.zeros(4, dtype=torch.long))
