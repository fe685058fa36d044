"""Search spaces that can be searched (``analysis.search_ranges``): chosen values piling up at a range's edge over a
method's searches, and parameter values that train bit-identical models, in the report and ``dmlbench plan --pilot``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cli_runner import run_cli
from dmlbench.analysis.search_ranges import EdgeCount, edge_counts, same_models

REPO = Path(__file__).resolve().parent.parent


def test_a_parameter_chosen_at_one_edge_in_a_share_of_the_searches_is_counted_on_the_scale_searched():
    spaces = {"m": {"t": {"low": 0.02, "high": 0.2, "log": True}, "u": {"low": 0.0, "high": 1.0}, "c": {"choices": [1, 2]}}}
    chosen = {"m": [{"t": 0.19, "u": 0.5, "c": 1}, {"t": 0.195, "u": 0.01, "c": 2}, {"t": 0.05, "u": 0.6, "c": 1},
                    {"t": 0.1, "u": 0.7, "c": 2}]}
    # t: 0.19 and 0.195 are within 5% of the top on the log scale (2 of 4 searches); u: 0.01 at the bottom (1 of 4).
    assert edge_counts(spaces, chosen) == [EdgeCount("m", "t", "high", 2, 4), EdgeCount("m", "u", "low", 1, 4)]
    assert edge_counts(spaces, chosen, share=0.5) == [EdgeCount("m", "t", "high", 2, 4)]
    assert edge_counts(spaces, chosen, share=0.3) == [EdgeCount("m", "t", "high", 2, 4)]
    assert edge_counts(spaces, {"m": [{"t": 0.06, "u": 0.5}]}) == []


def test_trials_with_different_parameters_and_one_model_are_grouped_per_search():
    trials = {"a": [({"x": 1.5}, "d1"), ({"x": 1.7}, "d1"), ({"x": 0.5}, "d2"), ({"x": 1.5}, "d1")],
              "a@search1": [({"x": 1.5}, "d3"), ({"x": 1.7}, "d4")]}
    (found,) = same_models(trials)
    assert found.method == "a" and found.digest == "d1" and found.params == ((("x", 1.5),), (("x", 1.7),))


def test_the_report_names_contrastive_margins_that_train_the_same_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Distance-weighted sampling keeps negatives closer than 1.4 only, so with every margin above 1.4 each hinge is
    active whatever the margin: two such trials train bit-identical weights, which the report names."""
    config = yaml.safe_load((REPO / "configs" / "smoke.yaml").read_text())
    config["methods"] = [{"name": "contrastive", "overrides": {"loss.name": "contrastive", "miner.name": "distance_weighted"},
                          "search": {"loss.params.margin": {"low": 1.5, "high": 1.9}}},
                         {"name": "triplet", "overrides": {"loss.name": "triplet", "miner.name": "semihard"},
                          "search": {"loss.params.margin": {"low": 0.05, "high": 0.5}}}]
    config["protocol"].update(trials=2, sampler="tpe")
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    code, _, err = run_cli(["benchmark", str(path), "-o", str(out), "-q", "training.max_steps_per_epoch=2"], capsys)
    assert code == 0, err
    report = (out / "report.md").read_text()
    assert "trained bit-identical models" in report and "`contrastive`: loss.params.margin=" in report
    assert "`triplet`" not in report.split("trained bit-identical models")[1].split("\n")[0]


def test_plan_names_the_committed_study_s_vacuous_margins(capsys: pytest.CaptureFixture[str]) -> None:
    """The 29-search study's contrastive searches 0, 8, 9 and 22 chose margins above 1.4 and trained the same models
    (identical reproductions on the shared seeds). Its normalised softmax chose the top 5% of its temperature range
    (log scale) in 4 of 29 searches, below the 15% that flags a range."""
    code, out, err = run_cli(["plan", "--pilot", str(REPO / "results" / "search_luck_method_glyphs")], capsys)
    assert code == 0, err
    notes = [line for line in out.splitlines() if line.startswith("search ranges: ")]
    assert not any("normalized_softmax" in line for line in notes)
    same = next(line for line in notes if "scored identically" in line)
    assert same.count("loss.params.margin=") == 4 and "contrastive:" in same
