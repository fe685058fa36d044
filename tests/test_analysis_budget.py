"""The expected best score after n trials (Dodge et al. 2019) against brute-force enumeration in float64."""

import itertools
from pathlib import Path

import numpy as np
import pytest

from dmlbench.analysis.budget import budget_curve, expected_best


@pytest.mark.parametrize("trials", [1, 2, 3])
def test_the_expected_best_is_the_mean_over_every_draw_with_replacement(trials: int) -> None:
    scores = [0.31, 0.35, 0.35, 0.29, 0.40]
    draws = [max(choice) for choice in itertools.product(scores, repeat=trials)]
    mean, sd = expected_best(scores, trials)
    assert mean == pytest.approx(float(np.mean(draws)), abs=1e-15)
    assert sd == pytest.approx(float(np.std(draws)), abs=1e-12)


def test_the_curve_rises_to_the_best_trial_and_keeps_the_searchs_own_order() -> None:
    scores = [0.30, 0.38, 0.33, 0.36]
    curve = budget_curve(scores)
    assert [point.trials for point in curve] == [1, 2, 3, 4]
    assert [point.running_best for point in curve] == [0.30, 0.38, 0.38, 0.38]
    assert curve[0].expected_best == pytest.approx(np.mean(scores))
    assert all(a.expected_best < b.expected_best for a, b in zip(curve, curve[1:]))
    assert curve[-1].expected_best < max(scores)
    assert expected_best(scores, 1000)[0] == pytest.approx(max(scores), abs=1e-9)
    with pytest.raises(ValueError):
        expected_best([], 1)


def test_the_report_flags_a_search_dimension_that_trained_identical_models() -> None:
    """Trials whose margins differ but whose scores are identical to the last digit (the semihard window that
    ignored the loss margin) are named with the parameter that differed; equal scores of equal parameters,
    and different scores, are not."""
    from types import SimpleNamespace

    from dmlbench.report.uncertainty import budget_table, identical_trials_text

    def trial(number: int, value: float, margin: float) -> dict:
        return {"number": number, "state": "COMPLETE", "value": value, "params": {"loss.params.margin": margin}}

    # No checkpoints in output_dir: the trials are told apart by their validation scores.
    data = SimpleNamespace(methods=["triplet", "contrastive"], repeats={"triplet": ["triplet@search1"]},
                           output_dir=Path("/nonexistent"), trials={
        "triplet": [trial(0, 0.3654, 0.25), trial(1, 0.3654, 0.44), trial(2, 0.31, 0.1)],
        "triplet@search1": [trial(0, 0.35, 0.3), trial(1, 0.36, 0.4)],
        "contrastive": [trial(0, 0.40, 1.0), trial(1, 0.40, 1.0)],
    })
    text = identical_trials_text(data)
    assert "`triplet`: 2 trials with different loss.params.margin scored exactly 36.5400" in text
    assert "contrastive" not in text and "search1" not in text
    rows = budget_table(data)
    assert [(row[0], row[1], row[2]) for row in rows] == [
        ("triplet", 0, 1), ("triplet", 0, 2), ("triplet", 0, 3), ("triplet", 1, 1), ("triplet", 1, 2),
        ("contrastive", 0, 1), ("contrastive", 0, 2)]
    assert float(rows[2][4]) == pytest.approx(expected_best([0.3654, 0.3654, 0.31], 3)[0])
