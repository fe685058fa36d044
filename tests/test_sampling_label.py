"""Label samplers (spc, classification, random, spc_random) and the shared sampler machinery."""

from __future__ import annotations

import functools
import itertools
import re
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from dmlbench import sampling
from dmlbench.errors import UserInputError
from dmlbench.sampling.spc import max_distinct_class_batches

FAST = settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def labels_from_sizes(sizes: list[int], seed: int = 0) -> torch.Tensor:
    """Labels with class c having sizes[c] images (class ids spread out), in a shuffled order."""
    labels = torch.cat([torch.full((size,), 3 * c + 1, dtype=torch.int64) for c, size in enumerate(sizes)])
    return labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))]


def epoch(sampler, epoch_number: int = 0) -> list[list[int]]:
    sampler.set_epoch(epoch_number)
    return list(sampler)


@functools.lru_cache(maxsize=None)
def brute_force_max_batches(counts: tuple[int, ...], classes_per_batch: int) -> int:
    """Most batches of ``classes_per_batch`` distinct classes, each class c usable counts[c] times,
    by exhaustive search over every choice of classes for the next batch."""
    best = 0
    available = [c for c, k in enumerate(counts) if k > 0]
    for chosen in itertools.combinations(available, classes_per_batch):
        rest = list(counts)
        for c in chosen:
            rest[c] -= 1
        best = max(best, 1 + brute_force_max_batches(tuple(sorted(rest)), classes_per_batch))
    return best


# ---------------------------------------------------------------------------------------- SPC-n


@FAST
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=5),
    classes_per_batch=st.integers(1, 3),
)
def test_max_distinct_class_batches_matches_exhaustive_search(sizes, classes_per_batch):
    counts = torch.tensor(sizes)
    expected = brute_force_max_batches(tuple(sorted(sizes)), classes_per_batch)
    assert max_distinct_class_batches(counts, classes_per_batch) == expected


@FAST
@given(
    sizes=st.lists(st.integers(2, 30), min_size=2, max_size=25),
    samples_per_class=st.integers(1, 4),
    classes_per_batch=st.integers(1, 6),
    seed=st.integers(0, 2**32),
)
def test_spc_properties(sizes, samples_per_class, classes_per_batch, seed):
    sizes = [max(size, samples_per_class) for size in sizes]
    if len(sizes) < classes_per_batch:
        return
    labels = labels_from_sizes(sizes, seed % 97)
    n, b = samples_per_class, samples_per_class * classes_per_batch
    groups = [size // n for size in sizes]
    total = max_distinct_class_batches(torch.tensor(groups), classes_per_batch)
    if total < 1:
        with pytest.raises(UserInputError, match="makes no batch per epoch"):
            sampling.build("spc", labels=labels, batch_size=b, samples_per_class=n, seed=seed)
        return
    batches = epoch(sampling.build("spc", labels=labels, batch_size=b, samples_per_class=n, seed=seed), 3)
    seen: Counter[int] = Counter()
    class_batches: Counter[int] = Counter()
    assert len(batches) == total
    for batch in batches:
        assert len(batch) == b
        counts = Counter(labels[batch].tolist())
        assert len(counts) == classes_per_batch and set(counts.values()) == {n}
        class_batches.update(counts.keys())
        seen.update(batch)
    # No image twice in the epoch.
    assert max(seen.values()) == 1
    # Documented frequency: class c takes part in at most min(k_c, B) batches, and the batches
    # cover all but fewer than C groups of sum_c min(k_c, B).
    for c, k in enumerate(groups):
        assert class_batches[3 * c + 1] <= min(k, total)
    assert sum(min(k, total) for k in groups) - total * classes_per_batch < classes_per_batch


def test_spc_visits_every_group_when_classes_are_equal():
    # 40 classes x 6 images, n = 2, C = 8: 120 groups, 15 batches, every image exactly once.
    labels = labels_from_sizes([6] * 40)
    batches = epoch(sampling.build("spc", labels=labels, batch_size=16, samples_per_class=2, seed=5))
    assert len(batches) == 15
    assert sorted(itertools.chain(*batches)) == list(range(240))


def test_spc_mixes_classes_across_batches():
    # Batches are not a fixed cycle: over a few epochs most pairs of classes meet somewhere.
    labels = labels_from_sizes([4] * 20)
    sampler = sampling.build("spc", labels=labels, batch_size=10, samples_per_class=2, seed=0)
    met = set()
    for e in range(6):
        for batch in epoch(sampler, e):
            met.update(itertools.combinations(sorted(set(labels[batch].tolist())), 2))
    assert len(met) > 0.9 * (20 * 19 // 2)


def test_spc_classes_are_drawn_roughly_uniformly_over_epochs():
    # Equal class sizes: over many epochs every class appears equally often (exactly, by the
    # one-pass design) and each image the same number of times.
    labels = labels_from_sizes([5] * 12)
    sampler = sampling.build("spc", labels=labels, batch_size=8, samples_per_class=2, seed=1)
    images: Counter[int] = Counter()
    for e in range(50):
        for batch in epoch(sampler, e):
            images.update(batch)
    # Each class has 2 groups of 2 (1 image sits out each epoch): images appear 4/5 of the epochs.
    frequencies = np.array([images[i] for i in range(60)]) / 50
    assert abs(frequencies.mean() - 0.8) < 1e-9
    assert frequencies.min() > 0.6 and frequencies.max() < 1.0


def test_classification_sampler_is_one_image_per_class():
    labels = labels_from_sizes([3, 1, 2, 5, 4, 1, 2])
    batches = epoch(sampling.build("classification", labels=labels, batch_size=4, seed=2))
    assert len(batches) == max_distinct_class_batches(torch.tensor([3, 1, 2, 5, 4, 1, 2]), 4)
    for batch in batches:
        assert len(set(labels[batch].tolist())) == 4


# ------------------------------------------------------------------------------------- random


@FAST
@given(n_images=st.integers(5, 200), batch_size=st.integers(1, 5), seed=st.integers(0, 2**31))
def test_random_sampler_is_one_pass_without_replacement(n_images, batch_size, seed):
    labels = torch.arange(n_images) % 7
    batches = epoch(sampling.build("random", labels=labels, batch_size=batch_size, seed=seed))
    assert len(batches) == n_images // batch_size
    assert all(len(batch) == batch_size for batch in batches)
    flat = list(itertools.chain(*batches))
    assert len(flat) == len(set(flat)) == n_images // batch_size * batch_size


# ----------------------------------------------------------------------------------------- SPC-R


@FAST
@given(
    sizes=st.lists(st.integers(2, 12), min_size=1, max_size=30),
    batch_size=st.integers(2, 24),
    seed=st.integers(0, 2**31),
)
def test_spc_random_always_holds_a_positive_pair(sizes, batch_size, seed):
    labels = labels_from_sizes(sizes, seed % 13)
    if len(labels) < batch_size:
        return
    batches = epoch(sampling.build("spc_random", labels=labels, batch_size=batch_size, seed=seed), 1)
    assert len(batches) == len(labels) // (batch_size - 1)
    random_slots: Counter[int] = Counter()
    for batch in batches:
        assert len(batch) == batch_size and len(set(batch)) == batch_size
        counts = Counter(labels[batch].tolist())
        assert max(counts.values()) >= 2
        random_slots.update(batch[:-1])
        spare_exists = any(
            counts[label] < int((labels == label).sum()) for label in set(labels[batch[:-1]].tolist())
        )
        if spare_exists:
            # The last image completes a pair with one of the b - 1 random images.
            assert int(labels[batch[-1]]) in set(labels[batch[:-1]].tolist())
    # The b - 1 random slots visit every image at most once per epoch.
    assert max(random_slots.values()) == 1


def test_spc_random_fallback_when_classes_are_complete_in_the_batch():
    # Three classes of two images, batch of 5: the 4 random slots always contain a complete class.
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    for seed in range(30):
        for batch in epoch(sampling.build("spc_random", labels=labels, batch_size=5, seed=seed)):
            assert len(set(batch)) == 5
            assert max(Counter(labels[batch].tolist()).values()) >= 2


def test_spc_random_last_slot_can_be_any_image():
    # The last slot is drawn among all same-class images outside the batch, not a fixed one
    # (e.g. not always the first image of the class): over many seeds every image shows up there.
    labels = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 3, 3])
    last: Counter[int] = Counter()
    for seed in range(200):
        for batch in epoch(sampling.build("spc_random", labels=labels, batch_size=4, seed=seed)):
            last[batch[-1]] += 1
    assert set(last) == set(range(10))


# --------------------------------------------------------------------------- shared machinery


@pytest.mark.parametrize(
    "name, options",
    [("spc", {"samples_per_class": 2}), ("classification", {}), ("random", {}), ("spc_random", {})],
)
def test_same_seed_same_batches_and_epochs_differ(name, options):
    labels = labels_from_sizes([6] * 30)
    make = lambda seed: sampling.build(name, labels=labels, batch_size=12, seed=seed, **options)  # noqa: E731
    first, again = make(7), make(7)
    assert epoch(first, 2) == epoch(again, 2)
    assert epoch(first, 2) == epoch(first, 2)  # iterating twice gives the same epoch
    assert epoch(first, 2) != epoch(first, 3)
    assert epoch(first, 2) != epoch(make(8), 2)


def test_batches_do_not_depend_on_data_loader_workers():
    labels = labels_from_sizes([5] * 24)
    dataset = TensorDataset(torch.arange(len(labels)))
    runs = []
    for workers in (0, 2):
        sampler = sampling.build("spc", labels=labels, batch_size=8, samples_per_class=2, seed=11)
        sampler.set_epoch(4)
        loader = DataLoader(dataset, batch_sampler=sampler, num_workers=workers)
        runs.append([batch[0].tolist() for batch in loader])
    assert runs[0] == runs[1] == epoch(sampling.build("spc", labels=labels, batch_size=8, seed=11), 4)


@pytest.mark.parametrize("name", ["spc", "spc_random", "random", "classification"])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ranks_slices_concatenate_to_the_single_process_batches(name, world_size):
    """The global batch is the configured one for any number of processes: rank r keeps the r-th
    contiguous slice of every single-process batch, and every rank takes the same number of steps."""
    labels = labels_from_sizes([4] * 50)
    single = epoch(sampling.build(name, labels=labels, batch_size=12, seed=3), 1)
    shards = [
        epoch(sampling.build(name, labels=labels, batch_size=12, seed=3, rank=r, world_size=world_size), 1)
        for r in range(world_size)
    ]
    assert all(len(shard) == len(single) for shard in shards)
    for step, batch in enumerate(single):
        assert list(itertools.chain(*(shard[step] for shard in shards))) == batch
        assert {len(shard[step]) for shard in shards} == {12 // world_size}


def test_a_batch_that_does_not_split_over_the_ranks_is_refused():
    with pytest.raises(UserInputError, match=r"batch_size=10 cannot be split evenly over world_size=4"):
        sampling.build("spc", labels=labels_from_sizes([4] * 50), batch_size=10, rank=0, world_size=4)


def test_labels_may_be_numpy_or_lists():
    sizes = [3] * 10
    labels = labels_from_sizes(sizes)
    reference = epoch(sampling.build("spc", labels=labels, batch_size=6, samples_per_class=3, seed=0))
    for variant in (labels.numpy(), labels.tolist(), labels.numpy().astype(np.int32)):
        assert epoch(sampling.build("spc", labels=variant, batch_size=6, samples_per_class=3, seed=0)) == reference


def test_registry_lists_every_sampler():
    assert set(sampling.SAMPLERS.names()) == {
        "spc", "spc_random", "random", "classification", "greedy_coreset", "ddm", "frd"
    }


def test_a_class_of_one_image_is_never_told_to_use_one_sample_per_class():
    """samples_per_class=1 has no positive pair: a batch of singletons teaches a pair or tuple loss nothing."""
    with pytest.raises(UserInputError) as error:
        sampling.build("spc", labels=labels_from_sizes([1, 6, 4]), batch_size=8, samples_per_class=2)
    assert re.fullmatch(r"samples_per_class=2 is larger than some classes: class \d+ has 1 image; a batch needs at "
                        r"least 2 images of a class to form a positive pair, so leave the classes with fewer out "
                        r"\(or give them more images\)", str(error.value)), str(error.value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(name="spc", batch_size=10, samples_per_class=5),
         "samples_per_class=5 is larger than some classes: class 1 has 2 images, class 7 has 4 images; "
         r"set sampler.params.samples_per_class=2 \(the smallest class has 2 images\)"),
        (dict(name="spc", batch_size=10, samples_per_class=4), "batch_size=10 is not divisible by samples_per_class=4"),
        (dict(name="spc", batch_size=12, samples_per_class=1),
         "needs 12 distinct classes per batch, but the training set has only 3"),
        (dict(name="spc", batch_size=4, samples_per_class=0), "samples_per_class must be an integer > 0"),
        (dict(name="spc", batch_size=0), "batch_size must be an integer > 0"),
        (dict(name="random", batch_size=100), r"batch_size=100 is larger than the training set \(12 images\)"),
        (dict(name="random", batch_size=4, seed=-1), "seed must be an integer >= 0"),
        (dict(name="random", batch_size=4, rank=2, world_size=2),
         r"rank must be an integer in \[0, world_size=2\)"),
        (dict(name="random", batch_size=6, world_size=4), "cannot be split evenly over world_size=4"),
        (dict(name="spc_random", batch_size=1), "batch_size >= 2"),
        (dict(name="sps", batch_size=4), "unknown sampler 'sps'; did you mean 'spc'"),
        (dict(name="random", batch_size=4, samples_per_class=2),
         "sampler 'random' has no parameter 'samples_per_class'"),
    ],
)
def test_bad_input_is_one_clear_line(kwargs, message):
    labels = labels_from_sizes([2, 6, 4])
    name = kwargs.pop("name")
    with pytest.raises(UserInputError, match=message) as error:
        sampling.build(name, labels=labels, **kwargs)
    assert "\n" not in str(error.value)


def test_spc_random_rejects_single_image_classes():
    with pytest.raises(UserInputError, match="class 7 has 1 image"):
        sampling.build("spc_random", labels=[7, 1, 1, 2, 2], batch_size=3)


@pytest.mark.parametrize("labels", [[[0, 1], [1, 0]], [0.5, 1.0], [], [True, False]])
def test_bad_labels(labels):
    with pytest.raises(UserInputError, match="labels must be"):
        sampling.build("random", labels=labels, batch_size=1)


def test_set_epoch_validates():
    sampler = sampling.build("random", labels=[0, 1, 2, 3], batch_size=2)
    with pytest.raises(UserInputError, match="epoch must be an integer >= 0"):
        sampler.set_epoch(-1)


def test_spc_matches_pytorch_metric_learning_m_per_class(monkeypatch):
    """Cross-check with pytorch-metric-learning's ``MPerClassSampler`` (the same SPC-n idea).

    Mapping: ``m`` = ``samples_per_class``, and PML's flat index stream cut every ``batch_size``
    indices = our batches. Differences, by design: PML draws b/m classes uniformly per batch and
    images with replacement across batches (an image may recur before others are seen; a class
    smaller than m is padded with repeats); we deal each image at most once per epoch (classes in
    proportion to their size) and refuse classes smaller than n. With equal class sizes both give
    every class the same inclusion rate C / L per batch, which is what is compared here.
    """
    from pytorch_metric_learning.samplers import MPerClassSampler
    from pytorch_metric_learning.utils import common_functions

    monkeypatch.setattr(common_functions, "NUMPY_RANDOM", np.random.RandomState(0))
    labels = labels_from_sizes([8] * 20)
    ours = epoch(sampling.build("spc", labels=labels, batch_size=10, samples_per_class=2, seed=0))
    flat = list(MPerClassSampler(labels, m=2, batch_size=10, length_before_new_iter=10 * 400))
    theirs = [flat[i : i + 10] for i in range(0, len(flat), 10)]
    rates = []
    for batches in (ours, theirs):
        inclusion: Counter[int] = Counter()
        for batch in batches:
            counts = Counter(labels[batch].tolist())
            assert len(counts) == 5 and set(counts.values()) == {2}
            inclusion.update(counts.keys())
        rates.append(np.array([inclusion[3 * c + 1] for c in range(20)]) / len(batches))
    # Ours is exactly uniform within one epoch (4 groups of each class in 16 batches) ...
    np.testing.assert_allclose(rates[0], 5 / 20)
    assert len(ours) == 16 and len(set(itertools.chain(*ours))) == 160
    # ... PML is uniform in expectation (400 batches: standard error ~0.02).
    np.testing.assert_allclose(rates[1], 5 / 20, atol=0.08)
