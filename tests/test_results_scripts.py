"""The scripts under results/ that derive the README's cross-study figures from committed CSV files."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from scipy import stats


def _script(name: str) -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "results" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compare_rankings_writes_tau_and_both_rankings(tmp_path: Path) -> None:
    means = {"first": {"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.6, "untrained": 0.1},
             "second": {"a": 0.7, "b": 0.9, "c": 0.6, "d": 0.5, "e": 0.95, "untrained": 0.1}}
    for study, methods in means.items():
        (tmp_path / study).mkdir()
        rows = ["method,reproduction,mode,metric,value"]
        rows += [f"{name},{r},concatenated,precision_at_1,{value + 0.01 * r}" for name, value in methods.items() for r in range(3)]
        (tmp_path / study / "runs.csv").write_text("\n".join(rows) + "\n")
    output = tmp_path / "tau.csv"
    main = _script("compare_rankings").main
    assert main([str(tmp_path / "first"), str(tmp_path / "second"), "-o", str(output), "--resamples", "200"]) == 0
    (row,) = list(csv.DictReader(output.open()))
    assert row["methods"] == "4"
    assert float(row["kendall_tau"]) == pytest.approx(stats.kendalltau([4, 3, 2, 1], [3, 4, 2, 1]).statistic, abs=1e-4)
    assert row["first_ranking"] == "a > b > c > d" and row["second_ranking"] == "b > a > c > d"


def test_convergence_counts_early_stops_best_evaluations_and_late_gains(tmp_path: Path) -> None:
    # Two runs of 6 epochs validated every 2: evaluations 0..3. Run 0 stops early after evaluation 2
    # with its best at 1; run 1 runs to the end and gains 0.1 after evaluation 1 (best at 3).
    (tmp_path / "benchmark.json").write_text(json.dumps(
        {"protocol": {"epochs": 6}, "spec": {"base": {"training": {"epochs": 99, "eval_every": 2}}}}))
    curves = {0: [0.1, 0.5, 0.4], 1: [0.1, 0.3, 0.35, 0.4]}
    rows = ["method,stage,unit,fold,evaluation,metric,value"]
    rows += [f"m,reproduction,{unit},0,{e},map_at_r,{v}" for unit, curve in curves.items() for e, v in enumerate(curve)]
    rows += ["m,reproduction,0,0,0,precision_at_1,0.9"]  # another metric, not counted
    (tmp_path / "validation_curves.csv").write_text("\n".join(rows) + "\n")
    output = tmp_path / "convergence.csv"
    assert _script("convergence").main([str(tmp_path), "--after", "1", "-o", str(output)]) == 0
    (row,) = list(csv.DictReader(output.open()))
    assert (row["runs"], row["stopped_early"], row["evaluations_mean"], row["best_evaluation_mean"]) == ("2", "1", "2.5", "2.0")
    assert (row["gain_after_mean"], row["gain_after_max"]) == ("5.00", "10.00")
