"""Reproductions with the best parameters, scored concatenated and separated on the test classes."""

import csv
import json
import logging
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch
from protocol_fixtures import benchmark_spec, reproduce
from training_fixtures import TINY

from dmlbench import config as config_module
from dmlbench.analysis.statistics import mean_interval
from dmlbench.data.splits import train_test_split
from dmlbench.errors import UserInputError
from dmlbench.evaluation import evaluate_many
from dmlbench.protocol.units import reproductions as reproductions_module
from dmlbench.protocol.units.results import RESULTS_COLUMNS, RUNS_COLUMNS, write_results
from dmlbench.training import loop as loop_module
from dmlbench.training.runs import embed_test_split
from dmlbench.training.setup import load_dataset

torch.set_num_threads(1)
optuna.logging.set_verbosity(logging.WARNING)

FAST = [*TINY, "sampler.params={samples_per_class: 4}", "training.max_steps_per_epoch=2",
        "evaluation.metrics=[precision_at_1, map_at_r]"]
PROTOCOL = {"reproductions": 2, "first_seed": 5, "folds": 2, "epochs": 1}


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as stream:
        reader = csv.DictReader(stream)
        return list(reader.fieldnames or []), list(reader)


def test_reproductions_write_results_and_runs_csv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = benchmark_spec(config_module.apply_overrides({}, list(FAST)),
                          {"name": "triplet", "overrides": {"loss.name": "triplet"}}, **PROTOCOL)
    reproduced = reproduce(spec, tmp_path, "triplet", {"loss.params.margin": 0.3})
    write_results({"triplet": reproduced}, tmp_path)
    outcomes = reproduced.outcomes
    assert [(o.reproduction, o.seed, o.reason) for o in outcomes] == [(0, 5, None), (1, 6, None)]

    header, runs = read_csv(tmp_path / "runs.csv")
    assert header == list(RUNS_COLUMNS)
    assert len(runs) == 2 * 2 * 2  # reproductions x modes x metrics
    header, summary = read_csv(tmp_path / "results.csv")
    assert header == list(RESULTS_COLUMNS)
    assert {(row["mode"], row["metric"]) for row in summary} == {
        (mode, metric) for mode in ("concatenated", "separated") for metric in ("precision_at_1", "map_at_r")
    }
    for row in summary:
        values = [float(r["value"]) for r in runs if (r["mode"], r["metric"]) == (row["mode"], row["metric"])]
        interval = mean_interval(values)
        assert int(row["n"]) == 2
        assert float(row["mean"]) == pytest.approx(interval.mean)
        assert float(row["ci_low"]) == pytest.approx(interval.low) and float(row["ci_high"]) == pytest.approx(interval.high)

    # Each run: seed of its reproduction, fold classes only, params recorded; scores = evaluate_many.
    labels = load_dataset(config_module.load(None, list(FAST))).labels.numpy()
    test_classes = set(labels[train_test_split(labels)[1]].tolist())
    for outcome in outcomes:
        embeddings = {}
        for run_dir in map(Path, outcome.run_dirs):
            record = json.loads((run_dir / "run.json").read_text())
            assert (record["stage"], record["reproduction"], record["seed"]) == ("reproduction", outcome.reproduction, outcome.seed)
            assert record["params"] == {"loss.params.margin": 0.3}
            assert not (set(record["train_classes"]) | set(record["val_classes"])) & test_classes
            assert config_module.load(run_dir / "config.yaml").loss.params == {"margin": 0.3}
            embeddings[run_dir.name], test_labels = embed_test_split(run_dir)
        assert set(test_labels.tolist()) == test_classes
        for mode in ("concatenated", "separated"):
            expected = evaluate_many(embeddings, test_labels, mode=mode, metrics=["precision_at_1", "map_at_r"], seed=outcome.seed)
            assert outcome.scores[mode]["map_at_r"] == pytest.approx(expected["map_at_r"])
    concatenated = [outcome.scores["concatenated"]["map_at_r"] for outcome in outcomes]
    assert not np.allclose(concatenated[0], concatenated[1])  # different seeds, different models

    assert reproduced.params == {"loss.params.margin": 0.3}

    # Resuming trains nothing and does not embed the test split again.
    monkeypatch.setattr(loop_module, "train", lambda *a, **k: pytest.fail("trained again"))
    monkeypatch.setattr(reproductions_module, "embed_test_split", lambda *a, **k: pytest.fail("test embedded again"))
    again = reproduce(spec, tmp_path, "triplet", {"loss.params.margin": 0.3})
    assert [o.scores for o in again.outcomes] == [o.scores for o in outcomes]


def test_a_failing_reproduction_is_left_out_of_n(tmp_path: Path) -> None:
    spec = benchmark_spec(config_module.apply_overrides({}, list(FAST)),
                          {"name": "sgd", "overrides": {"optimizer.name": "sgd", "optimizer.lr": 1e30}},
                          reproductions=2, folds=2, epochs=1)
    reproduced = reproduce(spec, tmp_path, "sgd", {})
    assert len(reproduced.outcomes) == 2
    for outcome in reproduced.outcomes:
        assert outcome.scores is None and "NaN" in (outcome.reason or "")
    write_results({"sgd": reproduced}, tmp_path)
    assert read_csv(tmp_path / "results.csv") == (list(RESULTS_COLUMNS), [])
    assert not list(tmp_path.glob("sgd/reproduction_*/test_metrics.json"))


def test_compare_reproductions_pairs_by_seed_on_seeds_every_method_scored() -> None:
    from dmlbench.analysis.statistics import paired_comparison
    from dmlbench.protocol.units.results import MethodReproductions, ReproductionOutcome, compare_reproductions

    def method(name: str, values: dict[int, float | None]) -> MethodReproductions:
        outcomes = [
            ReproductionOutcome(r, seed, [], None if value is None else
                                {"concatenated": {"map_at_r": value}, "separated": {"map_at_r": value / 2}})
            for r, (seed, value) in enumerate(values.items())
        ]
        return MethodReproductions(name, {}, "h", outcomes)

    results = {
        "a": method("a", {0: 0.50, 1: 0.52, 2: 0.49, 3: 0.51}),
        "b": method("b", {0: 0.47, 1: 0.50, 2: None, 3: 0.46}),  # seed 2 failed: left out for everyone
    }
    (comparison,) = compare_reproductions(results, "concatenated", "map_at_r")
    expected = paired_comparison({0: 0.50, 1: 0.52, 3: 0.51}, {0: 0.47, 1: 0.50, 3: 0.46})
    assert comparison.n == 3 and comparison.t_pvalue == pytest.approx(expected.t_pvalue)
    assert comparison.t_pvalue_holm == pytest.approx(expected.t_pvalue)  # a single pair: nothing to correct
    with pytest.raises(UserInputError, match="not computed"):
        compare_reproductions(results, "separated", "nmi")
