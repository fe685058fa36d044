"""Verification thresholds (FNMR@FMR) against brute force and scikit-learn's ROC."""

import numpy as np
import torch
import pytest
from sklearn.metrics import roc_curve as sklearn_roc_curve

from dmlbench.errors import UserInputError
from dmlbench.evaluation import verification


def _data(seed: int = 0, count: int = 60) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(seed)
    labels = generator.integers(0, 8, size=count)
    centres = generator.normal(size=(8, 5))
    return centres[labels] + 0.8 * generator.normal(size=(count, 5)), labels


def test_all_pairs_match_a_brute_force_loop() -> None:
    embeddings, labels = _data()
    pairs = verification.pair_distances(embeddings, labels)
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    positive, negative = [], []
    for i in range(len(unit)):
        for j in range(i + 1, len(unit)):
            (positive if labels[i] == labels[j] else negative).append(np.sqrt(((unit[i] - unit[j]) ** 2).sum()))
    assert not pairs.sampled
    np.testing.assert_allclose(np.sort(pairs.positive), np.sort(positive), atol=1e-12)
    np.testing.assert_allclose(np.sort(pairs.negative), np.sort(negative), atol=1e-12)


@pytest.mark.parametrize("target", [0.3, 0.05, 0.01, 1e-4])
def test_threshold_is_the_largest_meeting_the_target(target: float) -> None:
    embeddings, labels = _data(1)
    pairs = verification.pair_distances(np.round(embeddings, 1), labels)  # rounding creates tied distances
    point = verification.threshold_at_fmr(pairs, target)
    assert point["fmr"] <= target
    assert point["fmr"] == np.mean(pairs.negative <= point["threshold"])
    assert point["fnmr"] == np.mean(pairs.positive > point["threshold"])
    larger = pairs.negative[pairs.negative > point["threshold"]]
    if len(larger):
        # The next possible threshold (the smallest larger negative distance) would exceed the target.
        assert np.mean(pairs.negative <= larger.min()) > target


def test_roc_matches_scikit_learn() -> None:
    embeddings, labels = _data(2)
    pairs = verification.pair_distances(embeddings, labels)
    fmr, fnmr, thresholds = verification.roc_curve(pairs)
    scores = -np.concatenate([pairs.positive, pairs.negative])
    truth = np.concatenate([np.ones(len(pairs.positive)), np.zeros(len(pairs.negative))])
    false_positive, true_positive, reference = sklearn_roc_curve(truth, scores, drop_intermediate=False)
    ours = dict(zip(np.round(-thresholds, 12), zip(fmr, 1 - fnmr)))
    for threshold, fp, tp in zip(np.round(reference[1:], 12), false_positive[1:], true_positive[1:]):
        assert ours[threshold] == pytest.approx((fp, tp), abs=1e-12)
    rate = verification.equal_error_rate(pairs)
    assert 0.0 < rate < 0.5


def test_sampled_pairs_are_seeded_and_of_the_right_kind() -> None:
    embeddings, labels = _data(3, count=400)
    first = verification.pair_distances(embeddings, labels, max_pairs=500, seed=7)
    second = verification.pair_distances(embeddings, labels, max_pairs=500, seed=7)
    assert first.sampled and len(first.positive) == 500
    np.testing.assert_array_equal(first.positive, second.positive)
    np.testing.assert_array_equal(first.negative, second.negative)
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    distances = np.sqrt(((unit[:, None] - unit[None]) ** 2).sum(-1))
    same = labels[:, None] == labels[None]
    off_diagonal = ~np.eye(len(labels), dtype=bool)
    # Every sampled distance is the distance of some pair of the right kind.
    assert np.isin(np.round(first.positive, 10), np.round(distances[same & off_diagonal], 10)).all()
    assert np.isin(np.round(first.negative, 10), np.round(distances[~same], 10)).all()


def test_one_class_or_no_pairs_is_a_user_error() -> None:
    with pytest.raises(UserInputError, match="negative pairs"):
        verification.pair_distances(np.eye(3), [1, 1, 1])
    with pytest.raises(UserInputError, match="positive pairs"):
        verification.pair_distances(np.eye(3), [0, 1, 2])


def test_triangle_numbering_matches_numpy() -> None:
    from dmlbench.evaluation.verification import _triangle

    for size in (2, 3, 7, 1000):
        rows, columns = np.triu_indices(size, 1)
        index = np.arange(len(rows), dtype=np.int64)
        found = _triangle(index, np.full(len(index), size, dtype=np.int64))
        assert np.array_equal(found[0], rows) and np.array_equal(found[1], columns)
    # Far past float64's exact integers of the square root's argument: a million rows.
    size = 1_000_000
    last = size * (size - 1) // 2 - 1
    i, j = _triangle(np.array([0, size - 2, size - 1, last]), np.full(4, size, dtype=np.int64))
    assert (i.tolist(), j.tolist()) == ([0, 0, 1, size - 2], [1, size - 1, 2, size - 1])


def test_all_positive_pairs_and_negatives_sampled_without_replacement() -> None:
    """Few positive pairs among many negatives (a test set of many small classes): every positive pair
    is used, the negatives are drawn without replacement, and the summary says which."""
    from dmlbench.evaluation.verification import _positive_pairs, _sampled_negatives, _triangle

    generator = torch.Generator().manual_seed(0)
    labels = np.repeat(np.arange(300), 3)  # 900 rows: 900 positive pairs, 403,650 - 900 negative
    embeddings = torch.randn(len(labels), 8, generator=generator, dtype=torch.float64)
    pairs = verification.pair_distances(embeddings, labels, max_pairs=5_000, seed=4)
    assert (pairs.positive_total, pairs.negative_total) == (900, 900 * 899 // 2 - 900)
    assert len(pairs.positive) == 900 and not pairs.positive_sampled
    assert len(pairs.negative) == 5_000 and pairs.negative_sampled
    summary = verification.verification(embeddings, labels, max_pairs=5_000, seed=4)
    assert (summary["positive_pairs"], summary["positive_pairs_total"], summary["negative_pairs"]) == (900, 900, 5_000)
    # The same draw, by index: distinct pairs, all of different labels.
    rng = np.random.default_rng(4)
    left, right = _positive_pairs(labels, None, rng)
    assert len(set(zip(left.tolist(), right.tolist()))) == 900 and (labels[left] == labels[right]).all()
    draws = np.random.default_rng(4)
    chosen = verification._distinct(draws, 900 * 899 // 2, 5_000, lambda d: np.ones(len(d), dtype=bool))
    assert len(np.unique(chosen)) == 5_000
    i, j = _triangle(chosen, np.full(len(chosen), 900, dtype=np.int64))
    assert (i < j).all() and (j < 900).all()
    negative = _sampled_negatives(torch.nn.functional.normalize(embeddings, dim=1), labels, 5_000, np.random.default_rng(1))
    assert len(negative) == 5_000


def test_sampled_positive_pairs_are_distinct_and_uniform_over_classes() -> None:
    from dmlbench.evaluation.verification import _positive_pairs

    labels = np.repeat([0, 1], [40, 10])  # 780 + 45 positive pairs
    left, right = _positive_pairs(labels, 500, np.random.default_rng(0))
    pairs = set(zip(left.tolist(), right.tolist()))
    assert len(pairs) == 500 and (labels[left] == labels[right]).all() and (left < right).all()
    share_small = float(np.mean(labels[left] == 1))
    assert abs(share_small - 45 / 825) < 0.03  # each pair equally likely: class 1 holds 45 of 825


def test_a_sample_of_most_pairs_is_uniform_and_needs_no_rejection_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sample of more than half the pairs of a kind (the default glyphs run's 2,048 validation images
    have 2,064,384 negative pairs for a limit of 2 million) is a uniform subset of their enumeration:
    the rejection rounds of ``_distinct`` would mostly redraw pairs already held (about 240 rounds
    there). Each pair is then included with probability count / available, within binomial bounds."""
    from scipy import stats

    from dmlbench.evaluation.verification import _positive_pairs, _sampled_negative_rows

    def no_rounds(*args: object, **kwargs: object) -> np.ndarray:
        raise AssertionError("a dense sample went through the rejection rounds")

    monkeypatch.setattr(verification, "_distinct", no_rounds)
    labels = np.array([0, 0, 1, 1, 2, 2, 3])  # 21 pairs: 3 positive, 18 negative
    negative_index = {pair: k for k, pair in enumerate((i, j) for i in range(7) for j in range(i + 1, 7)
                                                       if labels[i] != labels[j])}
    included = np.zeros(len(negative_index), dtype=np.int64)
    seeds = 3_000
    for seed in range(seeds):
        left, right = _sampled_negative_rows(labels, 10, np.random.default_rng(seed))
        assert (left < right).all() and (labels[left] != labels[right]).all()
        assert np.all(np.diff(left * 7 + right) > 0)  # distinct, in pair order like the sparse path
        included[[negative_index[pair] for pair in zip(left.tolist(), right.tolist())]] += 1
    low, high = stats.binom.ppf([1e-5, 1 - 1e-5], seeds, 10 / 18)
    assert included.sum() == 10 * seeds and ((included >= low) & (included <= high)).all(), included
    left, right = _positive_pairs(np.repeat([0, 1], [6, 4]), 12, np.random.default_rng(0))  # 12 of 21
    assert len(set(zip(left.tolist(), right.tolist()))) == 12
    # pair_rows and pair_distances take the same dense sample, as they do the sparse one.
    generator = np.random.default_rng(3)
    dense_labels = np.repeat(np.arange(20), 5)  # 4,950 pairs: 200 positive, 4,750 negative
    embeddings = generator.normal(size=(len(dense_labels), 4))
    pairs = verification.pair_distances(embeddings, dense_labels, max_pairs=4_000, seed=7)
    rows = verification.pair_rows(dense_labels, max_pairs=4_000, seed=7)
    assert pairs.negative_sampled and len(pairs.negative) == 4_000 == len(set(zip(rows.negative_left, rows.negative_right)))
    np.testing.assert_array_equal(verification.row_distances(embeddings, rows.negative_left, rows.negative_right),
                                  pairs.negative)
