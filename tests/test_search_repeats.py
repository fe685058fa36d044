"""``protocol.search_repeats``: the whole search repeated with other search seeds, reported beside the first."""

import csv
import json
from pathlib import Path

import optuna
import pytest
import torch

from cli_runner import run_cli
from dmlbench.protocol.storage import default_url

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parent.parent
# The smoke config at its smallest: one trial per search, both methods listed, one repeated.
TINY = ["protocol.trials=1", "protocol.reproductions=2", "training.max_steps_per_epoch=2"]


def test_two_searches_with_other_seeds_and_their_report_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code, _, err = run_cli(["benchmark", str(REPO / "configs" / "smoke.yaml"), "-o", str(out), "-q", *TINY,
                            "protocol.search_repeats=2", "protocol.search_repeat_methods=[normalized_softmax]"], capsys)
    assert code == 0, err
    storage = default_url(out, 1)
    names = set(optuna.get_all_study_names(storage))
    assert {"normalized_softmax@search1", "reproductions:normalized_softmax@search1"} <= names
    assert "triplet_semihard@search1" not in names  # only the listed method is repeated
    first = optuna.load_study(study_name="normalized_softmax", storage=storage)
    again = optuna.load_study(study_name="normalized_softmax@search1", storage=storage)
    assert first.user_attrs["settings"]["seed"] == 0 and again.user_attrs["settings"]["seed"] == 1
    assert first.trials[0].params != again.trials[0].params  # another seed, another suggestion
    assert (out / "normalized_softmax@search1" / "reproduction_01" / "fold_1" / "run.json").is_file()
    # The leaderboard holds the methods only; the repeats are in their own section and CSV.
    methods = {row["method"] for row in csv.DictReader((out / "results.csv").open())}
    assert methods == {"triplet_semihard", "normalized_softmax", "untrained"}
    assert "normalized_softmax@search1" in json.loads((out / "search.json").read_text())["search_repeats"]
    rows = list(csv.DictReader((out / "search_repeats.csv").open()))
    assert [(row["method"], row["search"], row["search_seed"]) for row in rows] == [
        ("normalized_softmax", "0", "0"), ("normalized_softmax", "1", "1")]
    assert [float(row["best_validation"]) for row in rows] == [first.best_value, again.best_value]
    report = (out / "report.md").read_text()
    assert "## Search repeats" in report and "## Uncertainty over the test classes" in report
    assert "normalized_softmax@search1" in report  # its cost row
    code, _, err = run_cli(["audit", str(out)], capsys)  # the repeats' test openings are reproductions' too
    assert code == 0, err


def test_an_unknown_repeated_method_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["benchmark", str(REPO / "configs" / "smoke.yaml"), "-o", str(tmp_path / "out"), "-q",
                            "protocol.search_repeats=2", "protocol.search_repeat_methods=[nope]"], capsys)
    assert code == 2 and "search_repeat_methods names 'nope'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_best_values_in_the_outer_five_percent_are_flagged_on_the_scale_searched() -> None:
    from protocol_fixtures import benchmark_record

    from dmlbench.report.data import ReportData
    from dmlbench.report.uncertainty import edge_position, range_edge_text

    log_range, linear_range = {"low": 0.02, "high": 0.2, "log": True}, {"low": 0.02, "high": 0.2}
    # 0.19 is 97.8% of the way on the log scale but 94.4% on the linear one; 0.025 is 9.7% against 2.8%.
    assert edge_position(log_range, 0.19) == pytest.approx(0.977723, abs=1e-6)
    assert edge_position(linear_range, 0.19) == pytest.approx(0.17 / 0.18)
    assert edge_position({"choices": ["a", "b"]}, "a") is None and edge_position(log_range, True) is None
    spec = {"methods": [{"name": "m", "search": {"t": log_range, "u": linear_range, "c": {"choices": [1, 2]}}}]}
    trials = {"m": [{"number": 0, "state": "COMPLETE", "value": 0.5, "params": {"t": 0.19, "u": 0.19, "c": 1}},
                    {"number": 1, "state": "COMPLETE", "value": 0.4, "params": {"t": 0.025, "u": 0.025, "c": 2}}]}
    text = range_edge_text(ReportData(Path("."), benchmark_record(spec=spec), ["m"], trials))
    assert "`m` t=0.19 (high end, 98% of the range)" in text and "u=" not in text and "c=" not in text
    trials["m"][1]["value"] = 0.6  # now the best trial is the other one: u at 2.8% of its linear range
    text = range_edge_text(ReportData(Path("."), benchmark_record(spec=spec), ["m"], trials))
    assert "`m` u=0.025 (low end, 3% of the range)" in text and "t=" not in text
    trials["m"] = [{"number": 0, "state": "COMPLETE", "value": 0.5, "params": {"t": 0.06, "u": 0.1}}]
    assert range_edge_text(ReportData(Path("."), benchmark_record(spec=spec), ["m"], trials)).startswith("No best value")


def test_the_new_protocol_keys_enter_the_description_only_when_set(tmp_path: Path) -> None:
    # Benchmarks started before search_repeats and class_bootstrap existed keep their config hash.
    from dmlbench.protocol.benchmark import load_spec
    from dmlbench.protocol.prepare import prepare

    spec = load_spec(REPO / "configs" / "smoke.yaml")
    plain = prepare(spec, tmp_path / "a")
    assert not {"search_repeats", "search_repeat_methods", "class_bootstrap"} & set(plain.description()["protocol"])
    assert plain.repeats == {} and "triplet_semihard@search1" not in plain.study_names()
    repeated = prepare(spec, tmp_path / "b", ["protocol.search_repeats=3", "protocol.class_bootstrap=0"])
    assert repeated.description()["protocol"]["search_repeats"] == 3 and repeated.config_hash != plain.config_hash
    assert {name: settings.seed for name, (_, settings) in repeated.repeats.items()} == {
        "triplet_semihard@search1": 1, "normalized_softmax@search1": 1,
        "triplet_semihard@search2": 2, "normalized_softmax@search2": 2}
    assert "reproductions:normalized_softmax@search2" in repeated.study_names()
