"""Thresholds chosen on calibration classes, applied to test classes, with class-bootstrap intervals."""

import itertools

import numpy as np
import pytest

from dmlbench.errors import UserInputError
from dmlbench.evaluation import calibration
from dmlbench.evaluation.verification import pair_distances, threshold_at_fmr


def _clusters(classes: int, per_class: int, dim: int, seed: int, spread: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(seed)
    centres = generator.normal(size=(classes, dim)) * spread
    labels = np.repeat(np.arange(classes), per_class)
    return centres[labels] + generator.normal(size=(len(labels), dim)), labels


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_class_pairs_are_every_pair_with_its_classes() -> None:
    embeddings, labels = _clusters(5, 4, 3, seed=0)
    labels = labels * 7 + 3  # classes are reported by their position among the sorted labels
    found = calibration.class_pairs(embeddings, labels)
    unit = _unit(embeddings)
    expected_positive, expected_negative = [], []
    for i, j in itertools.combinations(range(len(labels)), 2):
        distance = float(np.sqrt(((unit[i] - unit[j]) ** 2).sum()))
        a, b = sorted(((labels[i] - 3) // 7, (labels[j] - 3) // 7))
        (expected_positive if a == b else expected_negative).append((a, b, round(distance, 12)))
    positive = [(c, c, round(d, 12)) for c, d in zip(found.positive_class.tolist(), found.positive.tolist())]
    negative = [(a, b, round(d, 12)) for (a, b), d in zip(found.negative_classes.tolist(), found.negative.tolist())]
    assert sorted(positive) == sorted(expected_positive)
    assert sorted(negative) == sorted(expected_negative)


@pytest.mark.parametrize("max_pairs", [10**6, 25])
def test_class_pairs_hold_the_pairs_verification_uses(max_pairs: int) -> None:
    embeddings, labels = _clusters(6, 7, 4, seed=1)
    found = calibration.class_pairs(embeddings, labels, max_pairs=max_pairs, seed=5)
    reference = pair_distances(embeddings, labels, max_pairs=max_pairs, seed=5)
    np.testing.assert_allclose(np.sort(found.positive), np.sort(reference.positive), rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.sort(found.negative), np.sort(reference.negative), rtol=0, atol=1e-12)
    assert (found.positive_total, found.negative_total) == (reference.positive_total, reference.negative_total)


def _brute_force_replicate(unit: np.ndarray, labels: np.ndarray, drawn: list[int], threshold: float) -> tuple[float, float]:
    """FMR and FNMR of one class resample by enumerating its items: each drawn copy a cluster of its
    own, pairs between two copies of one class left out."""
    classes = np.unique(labels)
    items = [(copy, int(classes[c]), row) for copy, c in enumerate(drawn) for row in np.flatnonzero(labels == classes[c])]
    accepted = impostors = rejected = genuine = 0
    for (copy_a, class_a, row_a), (copy_b, class_b, row_b) in itertools.combinations(items, 2):
        distance = float(np.sqrt(((unit[row_a] - unit[row_b]) ** 2).sum()))
        if copy_a == copy_b:
            genuine += 1
            rejected += distance > threshold
        elif class_a != class_b:
            impostors += 1
            accepted += distance <= threshold
    return (accepted / impostors if impostors else np.nan), (rejected / genuine if genuine else np.nan)


def test_class_bootstrap_matches_a_brute_force_loop() -> None:
    generator = np.random.default_rng(2)
    labels = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 4])  # class 4: one item, no genuine pair
    embeddings = generator.normal(size=(len(labels), 3)) + np.repeat(generator.normal(size=(5, 3)), [3, 2, 4, 2, 1], axis=0)
    pairs = calibration.class_pairs(embeddings, labels)
    thresholds = [float(np.quantile(pairs.negative, 0.1)), float(np.median(pairs.positive))]
    draws = calibration.draw_classes(5, 40, seed=11)
    fmr, fnmr = calibration.bootstrap_rates(pairs, thresholds, draws)
    unit = _unit(embeddings)
    for replicate, drawn in enumerate(draws.tolist()):
        for column, threshold in enumerate(thresholds):
            expected_fmr, expected_fnmr = _brute_force_replicate(unit, labels, drawn, threshold)
            np.testing.assert_allclose([fmr[replicate, column], fnmr[replicate, column]], [expected_fmr, expected_fnmr],
                                       rtol=1e-12, atol=1e-12)


def test_the_same_seed_draws_the_same_resamples() -> None:
    first = calibration.draw_classes(9, 50, seed=4)
    np.testing.assert_array_equal(first, calibration.draw_classes(9, 50, seed=4))
    assert not np.array_equal(first, calibration.draw_classes(9, 50, seed=5))
    assert first.shape == (50, 9) and first.min() >= 0 and first.max() <= 8
    val, val_labels = _clusters(12, 6, 4, seed=3)
    test, test_labels = _clusters(10, 6, 4, seed=4)
    runs = [calibration.calibrate(val, val_labels, test, test_labels, [0.05], seed=8, replicates=100) for _ in range(2)]
    assert runs[0]["targets"] == runs[1]["targets"]


def test_the_threshold_never_reads_a_test_pair() -> None:
    val, val_labels = _clusters(12, 6, 4, seed=5)
    test, test_labels = _clusters(10, 6, 4, seed=6)
    # A planted test set: every class collapsed onto one point, so that the in-sample optimum moves.
    planted = np.repeat(test[::6], 6, axis=0) + 1e-3 * np.random.default_rng(7).normal(size=test.shape)
    honest = calibration.calibrate(val, val_labels, test, test_labels, [0.05, 0.01], replicates=50)
    moved = calibration.calibrate(val, val_labels, planted, test_labels, [0.05, 0.01], replicates=50)
    expected = [threshold_at_fmr(pair_distances(val, val_labels), target)["threshold"] for target in (0.05, 0.01)]
    assert [point["threshold"] for point in honest["targets"]] == expected
    assert [point["threshold"] for point in moved["targets"]] == expected
    assert all(a["in_sample_threshold"] != b["in_sample_threshold"] for a, b in zip(honest["targets"], moved["targets"]))


def test_realised_rates_are_those_of_the_fixed_threshold_on_the_test_pairs() -> None:
    val, val_labels = _clusters(15, 5, 6, seed=8)
    test, test_labels = _clusters(12, 5, 6, seed=9)
    result = calibration.calibrate(val, val_labels, test, test_labels, [0.02], replicates=200)
    point = result["targets"][0]
    reference = pair_distances(test, test_labels)
    assert point["test_fmr"] == pytest.approx(np.mean(reference.negative <= point["threshold"]), abs=1e-15)
    assert point["test_fnmr"] == pytest.approx(np.mean(reference.positive > point["threshold"]), abs=1e-15)
    assert point["in_sample_threshold"] == threshold_at_fmr(reference, 0.02)["threshold"]
    assert point["calibration_fmr"] <= 0.02
    for key in ("test_fmr_ci", "test_fnmr_ci"):
        low, high = point[key]
        assert 0.0 <= low <= high <= 1.0
    assert result["bootstrap"]["replicates"] == 200 and result["seed"] == 0


@pytest.mark.parametrize("target", [0.0, 1.0, -0.1, 2.0])
def test_a_target_outside_zero_one_is_refused(target: float) -> None:
    with pytest.raises(UserInputError, match=r"must lie in \(0, 1\)"):
        calibration.check_targets([0.01, target])


def test_too_few_calibration_pairs_for_a_target_is_refused() -> None:
    val, val_labels = _clusters(4, 10, 4, seed=10)  # 600 impostor pairs
    test, test_labels = _clusters(4, 10, 4, seed=11)
    calibration.calibrate(val, val_labels, test, test_labels, [1.0 / 600], replicates=10)
    with pytest.raises(UserInputError, match="600 impostor pairs; a target FMR of 0.001 needs at least 1,000"):
        calibration.calibrate(val, val_labels, test, test_labels, [1e-2, 1e-3], replicates=10)
    with pytest.raises(UserInputError, match="1 classes and 0 impostor pairs"):
        calibration.calibrate(val[:10], val_labels[:10], test, test_labels, [0.1], replicates=10)
