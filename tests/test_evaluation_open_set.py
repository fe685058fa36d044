"""Open-set identification: enrolment, DIR and FAR on a constructed case, class-bootstrap intervals."""

import math

import numpy as np
import pytest

from dmlbench.errors import UserInputError
from dmlbench.evaluation import open_set


def _on_circle(degrees: list[float]) -> np.ndarray:
    radians = np.deg2rad(degrees)
    return np.stack([np.cos(radians), np.sin(radians)], axis=1)


def _chord(degrees: float) -> float:
    """Euclidean distance between unit vectors ``degrees`` apart."""
    return 2.0 * math.sin(math.radians(degrees) / 2.0)


# Gallery: classes 0-3 at 0, 90, 180, 270 degrees. Known queries: class 0 at 10 (correct, 10 degrees),
# class 1 at 120 (correct, 30), class 2 at 130 (nearest is class 1's item, 40: wrong), class 3 at 250
# (correct, 20). Unknown queries (classes 4, 5): 45 (45 degrees away), 205 (25), 300 (30), 316 (44).
ANGLES = [0, 90, 180, 270, 10, 120, 130, 250, 45, 205, 300, 316]
LABELS = np.array([0, 1, 2, 3, 0, 1, 2, 3, 4, 4, 5, 5])
SPLIT = open_set.OpenSetSplit(
    gallery=np.arange(4), known=np.arange(4, 8), unknown=np.arange(8, 12),
    enrolled_classes=np.arange(4), unknown_classes=np.array([4, 5]),
)


def test_dir_and_far_on_a_constructed_case() -> None:
    found = open_set.nearest_gallery(_on_circle(ANGLES), LABELS, SPLIT)
    np.testing.assert_allclose(found.known_distance, [_chord(10), _chord(30), _chord(40), _chord(20)], atol=1e-12)
    assert found.known_correct.tolist() == [True, True, False, True]
    np.testing.assert_allclose(found.unknown_distance, [_chord(45), _chord(25), _chord(30), _chord(44)], atol=1e-12)
    thresholds = [_chord(15), _chord(27), _chord(35), _chord(50)]
    detection, alarm = open_set.rates(found, thresholds)
    # 15 degrees: class 0 only; 27: classes 0, 3 and the unknown at 25; 35: + class 1 and the unknown at 30;
    # 50: class 2 stays wrong at any threshold, every unknown raises an alarm.
    np.testing.assert_allclose(detection, [0.25, 0.5, 0.75, 0.75])
    np.testing.assert_allclose(alarm, [0.0, 0.25, 0.5, 1.0])
    # FAR at most 0.25: the largest threshold admitting one alarm is the 25-degree unknown's distance.
    assert open_set.threshold_at_far(found, 0.25) == pytest.approx(_chord(25), abs=1e-12)
    assert open_set.threshold_at_far(found, 0.1) < _chord(25)
    curve = open_set.rejection_curve(found)
    assert curve["threshold"] == sorted(curve["threshold"]) and curve["dir"][-1] == 0.75 and curve["far"][-1] == 1.0


def test_enrolment_is_a_seeded_half_of_the_classes() -> None:
    labels = np.repeat(np.arange(11), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    split = open_set.enrol(labels, seed=3)
    assert len(split.enrolled_classes) == 5 and len(split.unknown_classes) == 6
    assert np.intersect1d(split.enrolled_classes, split.unknown_classes).size == 0
    enrolled_items = np.flatnonzero(np.isin(labels, split.enrolled_classes))
    np.testing.assert_array_equal(np.sort(np.concatenate([split.gallery, split.known])), enrolled_items)
    np.testing.assert_array_equal(split.unknown, np.flatnonzero(~np.isin(labels, split.enrolled_classes)))
    for class_id in split.enrolled_classes:
        size = int((labels == class_id).sum())
        assert int((labels[split.gallery] == class_id).sum()) == (size + 1) // 2
    again = open_set.enrol(labels, seed=3)
    np.testing.assert_array_equal(again.gallery, split.gallery)
    assert any(not np.array_equal(open_set.enrol(labels, seed=s).enrolled_classes, split.enrolled_classes) for s in range(4, 9))


def test_enrolment_follows_query_and_gallery_roles() -> None:
    labels = np.repeat(np.arange(6), 4)
    roles = np.tile([False, True, False, True], 6)
    split = open_set.enrol(labels, seed=0, query_mask=roles)
    assert not roles[split.gallery].any() and roles[split.known].all()
    assert set(labels[split.gallery]) == set(split.enrolled_classes.tolist())


def test_class_bootstrap_matches_a_brute_force_loop() -> None:
    found = open_set.nearest_gallery(_on_circle(ANGLES), LABELS, SPLIT)
    thresholds = [_chord(27), _chord(35)]
    dir_replicates, far_replicates = open_set.bootstrap_rates(found, thresholds, 30, seed=6)
    generator = np.random.default_rng([6, open_set._BOOTSTRAP_STREAM])
    known_draws = generator.integers(0, 4, size=(30, 4))
    unknown_draws = generator.integers(0, 2, size=(30, 2))
    known_classes, unknown_classes = [0, 1, 2, 3], [4, 5]
    for replicate in range(30):
        for column, threshold in enumerate(thresholds):
            detected = queries = 0
            for drawn in known_draws[replicate]:
                for row in np.flatnonzero(LABELS[SPLIT.known] == known_classes[drawn]):
                    queries += 1
                    detected += bool(found.known_correct[row]) and found.known_distance[row] <= threshold
            alarms = unknowns = 0
            for drawn in unknown_draws[replicate]:
                for row in np.flatnonzero(LABELS[SPLIT.unknown] == unknown_classes[drawn]):
                    unknowns += 1
                    alarms += found.unknown_distance[row] <= threshold
            assert dir_replicates[replicate, column] == pytest.approx(detected / queries, abs=1e-15)
            assert far_replicates[replicate, column] == pytest.approx(alarms / unknowns, abs=1e-15)


def test_open_set_reports_targets_calibrated_thresholds_and_intervals() -> None:
    generator = np.random.default_rng(0)
    labels = np.repeat(np.arange(20), 6)
    embeddings = np.repeat(generator.normal(size=(20, 8)) * 2, 6, axis=0) + generator.normal(size=(120, 8))
    result = open_set.open_set(embeddings, labels, far_targets=[0.1, 0.001], calibrated={0.01: 0.5}, seed=2, replicates=100)
    assert result["enrolled_classes"] == 10 and result["unknown_queries"] == 60
    first, unreachable = result["at_far"]
    assert first["far"] <= 0.1 and first["reachable"] and not unreachable["reachable"] and unreachable["far"] == 0.0
    calibrated = result["at_calibrated_threshold"][0]
    assert calibrated["target_fmr"] == 0.01 and calibrated["threshold"] == 0.5
    for point in result["at_far"] + result["at_calibrated_threshold"]:
        assert 0.0 <= point["dir_ci"][0] <= point["dir_ci"][1] <= 1.0 and 0.0 <= point["far_ci"][0] <= point["far_ci"][1] <= 1.0
    assert result == open_set.open_set(embeddings, labels, far_targets=[0.1, 0.001], calibrated={0.01: 0.5}, seed=2, replicates=100)


def test_one_class_or_singletons_are_refused() -> None:
    with pytest.raises(UserInputError, match="at least 2 classes"):
        open_set.enrol(np.zeros(5, dtype=np.int64))
    with pytest.raises(UserInputError, match="no enrolled class has both"):
        open_set.enrol(np.arange(6))
