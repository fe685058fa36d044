"""Embedded samplers (greedy_coreset, ddm, frd): selection rules against plain-loop float64
references, the memory-bank protocol, and bad input."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.linalg
import scipy.stats
import torch
from torch.utils.data import DataLoader, TensorDataset

from dmlbench import sampling
from dmlbench.errors import UserInputError
from dmlbench.sampling.coreset import covering_radius
from dmlbench.sampling.ddm import distance_histograms, histogram_wasserstein
from dmlbench.sampling.frd import frechet_distances
from dmlbench.sampling.memory import group_points, random_candidates


def clustered(num_classes: int, per_class: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels and unit-norm embeddings scattered around one random centre per class."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    labels = labels[torch.randperm(len(labels), generator=generator)]
    centres = torch.randn(num_classes, dim, generator=generator, dtype=torch.float64)
    noise = 0.6 * torch.randn(len(labels), dim, generator=generator, dtype=torch.float64)
    return labels, torch.nn.functional.normalize(centres[labels] + noise, dim=1)


def loop_distance(a, b) -> float:
    return math.sqrt(sum((float(x) - float(y)) ** 2 for x, y in zip(a, b)))


def reference_greedy_coreset(bank, big_batch: list[list[int]], num_groups: int, first_group: int) -> list[int]:
    """Greedy k-center over the big batch's points with whole groups as the unit, straight from
    the definition; returns *dataset* indices via an explicit position -> index table."""
    position_to_index = [index for group in big_batch for index in group]
    n = len(big_batch[0])
    group_of = [position // n for position in range(len(position_to_index))]
    points = [bank[index] for index in position_to_index]
    chosen_groups = [first_group]
    while len(chosen_groups) < num_groups:
        centres = [p for p in range(len(points)) if group_of[p] in chosen_groups]
        best_position, best_distance = None, -1.0
        for p in range(len(points)):
            if group_of[p] in chosen_groups:
                continue
            nearest = min(loop_distance(points[p], points[c]) for c in centres)
            if nearest > best_distance:  # strict: ties keep the lower position
                best_position, best_distance = p, nearest
        chosen_groups.append(group_of[best_position])
    return [position_to_index[g * n + j] for g in chosen_groups for j in range(n)]


def build(name: str, labels, bank=None, **options):
    sampler = sampling.build(name, labels=labels, **options)
    if bank is not None:
        sampler.initialize_memory(bank)
    return sampler


def shuffled_big_batch(sampler, seed: int) -> torch.Tensor:
    """A big batch ``[b*/n, n]`` whose positions differ from the dataset indices they hold."""
    groups = sampler.epoch_groups(torch.Generator().manual_seed(seed))
    order = torch.randperm(len(groups), generator=torch.Generator().manual_seed(seed + 1))
    return groups[order[: sampler.groups_per_big_batch]]


# ------------------------------------------------------------------------------------ coreset


@pytest.mark.parametrize("samples_per_class", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_coreset_index_mapping_matches_brute_force_greedy(samples_per_class, seed):
    n = samples_per_class
    labels, bank = clustered(num_classes=12, per_class=6, dim=5, seed=seed)
    sampler = build("greedy_coreset", labels, bank, batch_size=4 * n, big_batch_size=10 * n,
                    samples_per_class=n, seed=seed)
    big_batch = shuffled_big_batch(sampler, seed)
    batch = sampler.select(big_batch, torch.Generator().manual_seed(seed))
    first = int(torch.randint(10, (1,), generator=torch.Generator().manual_seed(seed)))
    expected = reference_greedy_coreset(bank.tolist(), big_batch.tolist(), 4, first)
    assert batch.tolist() == expected


def test_coreset_ties_and_duplicate_embeddings():
    # A bank with many identical embeddings: ties go to the lower big-batch position and no
    # group is picked twice even when every remaining point is at distance 0 from the selection.
    labels = torch.arange(20).repeat_interleave(2)
    bank = torch.zeros(40, 3, dtype=torch.float64)
    bank[::7, 0] = 1.0
    sampler = build("greedy_coreset", labels, bank, batch_size=12, big_batch_size=30)
    big_batch = shuffled_big_batch(sampler, 4)
    batch = sampler.select(big_batch, torch.Generator().manual_seed(0))
    first = int(torch.randint(15, (1,), generator=torch.Generator().manual_seed(0)))
    assert batch.tolist() == reference_greedy_coreset(bank.tolist(), big_batch.tolist(), 6, first)
    assert len(set(batch.tolist())) == 12


def test_coreset_radius_is_within_twice_the_optimal_k_center():
    # Exhaustive k-center over all 3-subsets of a 10-point big batch (n = 1): greedy farthest-point
    # selection is a 2-approximation, measured through the sampler's dataset indices.
    for seed in range(5):
        labels, bank = clustered(num_classes=10, per_class=2, dim=2, seed=seed)
        sampler = build("greedy_coreset", labels, bank, batch_size=3, big_batch_size=10,
                        samples_per_class=1, seed=seed)
        big_batch = shuffled_big_batch(sampler, seed)
        points = bank[big_batch.reshape(-1)]
        optimum = min(
            max(min(loop_distance(p, points[c]) for c in subset) for p in points)
            for subset in itertools.combinations(range(10), 3)
        )
        batch = sampler.select(big_batch, torch.Generator().manual_seed(seed))
        radius = float(covering_radius(points, bank[batch]))
        assert optimum - 1e-12 <= radius <= 2 * optimum + 1e-12


def test_covering_radius_matches_loops():
    generator = torch.Generator().manual_seed(0)
    points = torch.randn(9, 4, generator=generator, dtype=torch.float64)
    centres = torch.randn(3, 4, generator=generator, dtype=torch.float64)
    expected = max(min(loop_distance(p, c) for c in centres) for p in points)
    assert float(covering_radius(points, centres)) == pytest.approx(expected, rel=1e-12)


def test_coreset_follows_the_memory_bank():
    # After an update moves one group far away, the greedy rule picks it right after the start.
    labels, bank = clustered(num_classes=20, per_class=4, dim=8, seed=3)
    sampler = build("greedy_coreset", labels, bank, batch_size=8, big_batch_size=40)
    big_batch = shuffled_big_batch(sampler, 0)
    first = int(torch.randint(20, (1,), generator=torch.Generator().manual_seed(1)))
    far_group = big_batch[(first + 7) % 20]
    sampler.update_memory(far_group, torch.full((2, 8), 50.0, dtype=torch.float64))
    batch = sampler.select(big_batch, torch.Generator().manual_seed(1))
    assert batch[2:4].tolist() == far_group.tolist()


# ---------------------------------------------------------------------------------------- DDM


def test_distance_histograms_match_numpy():
    values = torch.rand(3, 200, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2 + 0.5
    low, high = float(values.min()), float(values.max())
    histograms = distance_histograms(values, low, high, 17)
    for row, histogram in zip(values, histograms):
        expected, _ = np.histogram(row.numpy(), bins=17, range=(low, high))
        np.testing.assert_allclose(histogram.numpy(), expected / 200, atol=1e-15)


def test_histogram_wasserstein_matches_scipy():
    generator = torch.Generator().manual_seed(1)
    first = torch.rand(4, 11, generator=generator, dtype=torch.float64)
    second = torch.rand(11, generator=generator, dtype=torch.float64)
    first, second = first / first.sum(-1, keepdim=True), second / second.sum()
    centres = 0.3 + 0.25 * (np.arange(11) + 0.5)
    ours = histogram_wasserstein(first, second, 0.25)
    for row, value in zip(first, ours):
        assert float(value) == pytest.approx(
            scipy.stats.wasserstein_distance(centres, centres, row.numpy(), second.numpy()), rel=1e-12
        )


def reference_ddm_scores(points: list[list[float]], candidates: list[list[int]], bins: int) -> list[float]:
    def pair_distances(members):
        return [loop_distance(points[i], points[j]) for i, j in itertools.combinations(members, 2)]

    big = pair_distances(range(len(points)))
    low, high = min(big), max(big)
    width = (high - low) / bins

    def histogram(values):
        counts = [0] * bins
        for v in values:
            counts[min(int((v - low) / width), bins - 1)] += 1
        return [c / len(values) for c in counts]

    centres = [low + width * (k + 0.5) for k in range(bins)]
    big_histogram = histogram(big)
    return [
        scipy.stats.wasserstein_distance(centres, centres, histogram(pair_distances(c)), big_histogram)
        for c in candidates
    ]


@pytest.mark.parametrize("samples_per_class", [1, 2])
def test_ddm_picks_the_candidate_with_the_smallest_histogram_w1(samples_per_class):
    n = samples_per_class
    labels, bank = clustered(num_classes=15, per_class=4, dim=6, seed=5)
    sampler = build("ddm", labels, bank, batch_size=6 * n, big_batch_size=20 * n, samples_per_class=n,
                    num_candidates=7, num_bins=9)
    big_batch = shuffled_big_batch(sampler, 2)
    points = bank[big_batch.reshape(-1)]
    candidates = random_candidates(20, 6, 7, torch.Generator().manual_seed(3))
    positions = group_points(candidates, n)
    expected = reference_ddm_scores(points.tolist(), positions.tolist(), 9)
    np.testing.assert_allclose(sampler.mismatch(points, positions).numpy(), expected, rtol=1e-9, atol=1e-12)
    batch = sampler.select(big_batch, torch.Generator().manual_seed(3))
    best = int(np.argmin(expected))
    assert batch.tolist() == big_batch[candidates[best]].reshape(-1).tolist()


# ---------------------------------------------------------------------------------------- FRD


def reference_frechet(x: np.ndarray, y: np.ndarray) -> float:
    mean_x, mean_y = x.mean(0), y.mean(0)
    cov_x, cov_y = np.cov(x, rowvar=False), np.cov(y, rowvar=False)
    root = scipy.linalg.sqrtm(cov_x @ cov_y).real
    return float(((mean_x - mean_y) ** 2).sum() + np.trace(cov_x + cov_y - 2 * root))


@pytest.mark.parametrize("set_size, dim", [(6, 4), (5, 9)])
def test_frechet_distance_matches_scipy_sqrtm(set_size, dim):
    generator = torch.Generator().manual_seed(set_size)
    reference = torch.randn(40, dim, generator=generator, dtype=torch.float64) * torch.linspace(0.5, 2, dim)
    sets = torch.randn(3, set_size, dim, generator=generator, dtype=torch.float64) + 0.3
    ours = frechet_distances(reference, sets)
    for one, value in zip(sets, ours):
        assert float(value) == pytest.approx(reference_frechet(reference.numpy(), one.numpy()), rel=1e-7, abs=1e-9)


def test_frechet_distance_of_a_set_to_itself_is_zero():
    x = torch.randn(30, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert float(frechet_distances(x, x.unsqueeze(0))[0]) == pytest.approx(0.0, abs=1e-10)


def test_frd_picks_the_candidate_with_the_smallest_frechet_distance():
    labels, bank = clustered(num_classes=15, per_class=4, dim=6, seed=6)
    sampler = build("frd", labels, bank, batch_size=12, big_batch_size=40, num_candidates=9)
    big_batch = shuffled_big_batch(sampler, 7)
    points = bank[big_batch.reshape(-1)]
    candidates = random_candidates(20, 6, 9, torch.Generator().manual_seed(8))
    expected = [
        reference_frechet(points.numpy(), points[group_points(c, 2)].numpy()) for c in candidates
    ]
    batch = sampler.select(big_batch, torch.Generator().manual_seed(8))
    assert batch.tolist() == big_batch[candidates[int(np.argmin(expected))]].reshape(-1).tolist()


# ------------------------------------------------------------------ better than random batches


def pair_values(points: torch.Tensor) -> torch.Tensor:
    rows, cols = torch.triu_indices(len(points), len(points), 1)
    return torch.cdist(points, points)[rows, cols]


@pytest.mark.parametrize("name", ["greedy_coreset", "ddm", "frd"])
def test_selected_batch_beats_the_median_random_batch(name):
    # The statistic each sampler optimises, for its batch vs 51 uniformly random batches (of whole
    # groups) of the same big batch: the sampler's batch must beat the random median.
    labels, bank = clustered(num_classes=40, per_class=12, dim=16, seed=9)
    sampler = build(name, labels, bank, batch_size=16, big_batch_size=128,
                    **({} if name == "greedy_coreset" else {"num_candidates": 20}))
    bins = 50
    for step in range(4):
        big_batch = shuffled_big_batch(sampler, 10 * step)
        big_points = bank[big_batch.reshape(-1)]
        big_values = pair_values(big_points)
        low, high = float(big_values.min()), float(big_values.max())
        big_histogram = distance_histograms(big_values, low, high, bins)

        def statistic(batch_points: torch.Tensor) -> float:
            if name == "greedy_coreset":
                return float(covering_radius(big_points, batch_points))
            if name == "frd":
                return float(frechet_distances(big_points, batch_points.unsqueeze(0))[0])
            histogram = distance_histograms(pair_values(batch_points), low, high, bins)
            return float(histogram_wasserstein(histogram, big_histogram, (high - low) / bins))

        chosen = sampler.select(big_batch, torch.Generator().manual_seed(step))
        random_scores = [
            statistic(bank[big_batch[subset].reshape(-1)])
            for subset in random_candidates(64, 8, 51, torch.Generator().manual_seed(100 + step))
        ]
        assert statistic(bank[chosen]) < float(np.median(random_scores))


# ------------------------------------------------------------------ memory-bank iteration protocol


def run_epoch(sampler, bank: torch.Tensor) -> list[list[int]]:
    batches = []
    for batch in sampler:
        batches.append(batch)
        # A stand-in for training: the embeddings of the batch drift.
        sampler.update_memory(batch, bank[batch] * 0.9 + 0.1)
    return batches


@pytest.mark.parametrize("name", ["greedy_coreset", "ddm", "frd"])
def test_epoch_structure_and_determinism(name):
    labels, bank = clustered(num_classes=30, per_class=7, dim=8, seed=1)
    batches = run_epoch(build(name, labels, bank.clone(), batch_size=12, big_batch_size=48, seed=4), bank)
    assert len(batches) == len(labels) // 12
    for batch in batches:
        assert len(set(batch)) == 12
        for g in range(6):  # groups of 2 images of one class
            assert labels[batch[2 * g]] == labels[batch[2 * g + 1]]
    again = run_epoch(build(name, labels, bank.clone(), batch_size=12, big_batch_size=48, seed=4), bank)
    assert again == batches
    other = run_epoch(build(name, labels, bank.clone(), batch_size=12, big_batch_size=48, seed=5), bank)
    assert other != batches


@pytest.mark.parametrize("name", ["greedy_coreset", "ddm", "frd"])
def test_ranks_with_the_same_bank_take_slices_of_the_single_process_batch(name):
    """Ranks whose banks are kept equal (the trainer writes the gathered global batch into every
    rank's bank) distil the single-process batch and each keeps its contiguous slice."""
    labels, bank = clustered(num_classes=30, per_class=8, dim=8, seed=2)
    single = run_epoch(build(name, labels, bank.clone(), batch_size=12, big_batch_size=40, seed=0), bank)
    samplers = [
        build(name, labels, bank.clone(), batch_size=12, big_batch_size=40, seed=0, rank=r, world_size=3)
        for r in range(3)
    ]
    iterators = [iter(sampler) for sampler in samplers]
    for step, batch in enumerate(single):
        slices = [next(iterator) for iterator in iterators]
        assert [index for part in slices for index in part] == batch, step
        for sampler in samplers:
            sampler.update_memory(batch, bank[batch] * 0.9 + 0.1)
    for iterator in iterators:
        assert next(iterator, None) is None


def test_data_loader_with_workers_is_refused():
    labels, bank = clustered(num_classes=30, per_class=6, dim=4, seed=0)
    sampler = build("ddm", labels, bank, batch_size=8, big_batch_size=32)
    loader = DataLoader(TensorDataset(torch.arange(len(labels))), batch_sampler=sampler, num_workers=2)
    with pytest.raises(UserInputError, match="num_workers=0"):
        for _ in loader:
            pass


def test_single_process_loader_with_updates_works():
    labels, bank = clustered(num_classes=30, per_class=6, dim=4, seed=0)
    sampler = build("greedy_coreset", labels, bank, batch_size=8, big_batch_size=32)
    steps = 0
    for (indices,) in DataLoader(TensorDataset(torch.arange(len(labels))), batch_sampler=sampler):
        sampler.update_memory(indices, bank[indices])
        steps += 1
    assert steps == len(sampler) == len(labels) // 8


def test_missing_update_and_missing_initialisation_are_refused():
    labels, bank = clustered(num_classes=30, per_class=6, dim=4, seed=0)
    sampler = build("frd", labels, None, batch_size=8, big_batch_size=32)
    with pytest.raises(UserInputError, match="needs initialize_memory"):
        next(iter(sampler))
    sampler.initialize_memory(bank)
    iterator = iter(sampler)
    next(iterator)
    with pytest.raises(UserInputError, match="before update_memory"):
        next(iterator)


def test_update_memory_overwrites_rows():
    labels, bank = clustered(num_classes=30, per_class=6, dim=4, seed=0)
    sampler = build("ddm", labels, bank, batch_size=8, big_batch_size=32)
    sampler.update_memory(torch.tensor([3, 7]), torch.ones(2, 4, dtype=torch.float64))
    assert torch.equal(sampler.memory[[3, 7]], torch.ones(2, 4, dtype=torch.float64))
    assert torch.equal(sampler.memory[4], bank[4])
    bank[4] = 9.0  # the bank is a copy, not a view of the caller's tensor
    assert not torch.equal(sampler.memory[4], bank[4])


@pytest.mark.parametrize(
    "options, message",
    [
        ({"big_batch_size": 1024}, r"needs 512 disjoint groups .* gives only 90; lower big_batch_size"),
        ({"big_batch_size": 64, "world_size": 3, "rank": 0}, r"batch_size=8 cannot be split evenly over world_size=3"),
        ({"big_batch_size": 8}, "big_batch_size=8 must be larger than batch_size=8"),
        ({"big_batch_size": 33}, "big_batch_size=33 is not divisible by samples_per_class=2"),
        ({"samples_per_class": 7, "batch_size": 14, "big_batch_size": 28},
         # 6 would fit the classes, but batch sizes 14 and 28 take 2 (their largest common divisor up to 6).
         r"samples_per_class=7 is larger than some classes: class \d+ has 6 images.*; "
         r"set sampler.params.samples_per_class=2 \(the smallest class has 6 images\)"),
        ({"num_candidates": 0, "big_batch_size": 32}, "num_candidates must be an integer > 0"),
    ],
)
def test_bad_options(options, message):
    labels, _ = clustered(num_classes=30, per_class=6, dim=4, seed=0)
    with pytest.raises(UserInputError, match=message):
        sampling.build("frd", labels=labels, **{"batch_size": 8, **options})


def test_bad_num_bins():
    labels, _ = clustered(num_classes=30, per_class=6, dim=4, seed=0)
    with pytest.raises(UserInputError, match="num_bins must be an integer > 0"):
        sampling.build("ddm", labels=labels, batch_size=8, big_batch_size=32, num_bins=0)


def test_bad_memory_inputs():
    labels, bank = clustered(num_classes=30, per_class=6, dim=4, seed=0)
    sampler = sampling.build("greedy_coreset", labels=labels, batch_size=8, big_batch_size=32)
    with pytest.raises(UserInputError, match=r"shape \[180, D\]"):
        sampler.initialize_memory(bank[:10])
    bad = bank.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(UserInputError, match="finite"):
        sampler.initialize_memory(bad)
    sampler.initialize_memory(bank)
    with pytest.raises(UserInputError, match=r"shape \[2, 4\]"):
        sampler.update_memory([1, 2], torch.zeros(2, 5))
    with pytest.raises(UserInputError, match=r"indices must lie in \[0, 180\)"):
        sampler.update_memory([1, 180], torch.zeros(2, 4))


def test_needs_embeddings_flags():
    labels, _ = clustered(num_classes=30, per_class=6, dim=4, seed=0)
    flags = {
        name: sampling.build(name, labels=labels, batch_size=10 if name == "spc_random" else 8,
                             **({"big_batch_size": 32} if name in {"greedy_coreset", "ddm", "frd"} else {})
                             ).needs_embeddings
        for name in sampling.SAMPLERS.names()
    }
    assert flags == {"spc": False, "spc_random": False, "random": False, "classification": False,
                     "greedy_coreset": True, "ddm": True, "frd": True}
