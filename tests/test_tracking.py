"""Experiment tracking (issue 22 §6): MLflow (a local database) and TensorBoard, read back; an
unreachable server is one warning and changes nothing."""

import json
import re
import subprocess
import warnings
from pathlib import Path

import pytest
from test_cli_process import console_script
from training_fixtures import TINY

from dmlbench import config as config_module
from dmlbench.training import records, train

REPO = Path(__file__).resolve().parent.parent


def tiny(*overrides: str) -> config_module.Config:
    return config_module.from_dict({}, [*TINY, "training.max_steps_per_epoch=3", *overrides])


def epochs_without_time(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in entry.items() if k != "seconds"} for entry in records.read_metrics(run_dir)]


def test_mlflow_gets_the_config_tags_and_every_epoch(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = train(tiny("tracking.backend=mlflow", f"tracking.uri={uri}", "tracking.experiment=tests"), tmp_path / "run",
                   progress=False, record={"method": "m", "stage": "search", "trial": 3, "fold": 1})
    recorded = json.loads((result.run_dir / records.RUN_FILE).read_text())["tracking"]
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(recorded["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "m trial 3 fold 1"
    assert run.data.params["loss.name"] == "triplet" and run.data.params["training.epochs"] == "2"
    assert {key: run.data.tags[f"dmlbench.{key}"] for key in ("method", "stage", "trial", "fold")} == {
        "method": "m", "stage": "search", "trial": "3", "fold": "1"}
    history = client.get_metric_history(run.info.run_id, "validation_map_at_r")
    logged = {entry["epoch"]: entry["validation"]["map_at_r"] for entry in records.read_metrics(result.run_dir)}
    assert {metric.step: metric.value for metric in history} == pytest.approx(logged) and sorted(logged) == [0, 1, 2]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2]


@pytest.mark.parametrize("from_environment", [True, False])
def test_mlflow_without_uri_follows_mlflows_own_convention(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           from_environment: bool) -> None:
    """No ``tracking.uri``: ``MLFLOW_TRACKING_URI``, else MLflow's default in the working directory
    (where ``mlflow ui`` looks), read back with a client that names the place itself."""
    import mlflow
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    if from_environment:
        expected = f"sqlite:///{tmp_path / 'elsewhere' / 'team.db'}"
        (tmp_path / "elsewhere").mkdir()
        monkeypatch.setenv("MLFLOW_TRACKING_URI", expected)
    else:
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        expected = mlflow.get_tracking_uri()
        assert expected == f"sqlite:///{tmp_path / 'mlflow.db'}"  # MLflow's default: its database in this folder
    result = train(tiny("tracking.backend=mlflow"), tmp_path / "run", progress=False)
    recorded = json.loads((result.run_dir / records.RUN_FILE).read_text())["tracking"]
    assert recorded["uri"] == expected
    run = MlflowClient(tracking_uri=expected).get_run(recorded["run_id"])
    assert run.info.status == "FINISHED" and run.data.params["loss.name"] == "triplet"
    assert not (tmp_path / "mlruns" / "mlflow.db").exists()


def test_tensorboard_event_files_hold_every_epoch(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = train(tiny("tracking.backend=tensorboard"), tmp_path / "run", progress=False)
    events = EventAccumulator(str(result.run_dir / "tensorboard"))
    events.Reload()
    scalars = {event.step: event.value for event in events.Scalars("validation_map_at_r")}
    logged = {entry["epoch"]: entry["validation"]["map_at_r"] for entry in records.read_metrics(result.run_dir)}
    assert scalars == pytest.approx(logged)


def test_an_unreachable_tracking_server_is_one_warning_and_changes_nothing(tmp_path: Path) -> None:
    untracked = train(tiny(), tmp_path / "plain", progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracked = train(tiny("tracking.backend=mlflow", "tracking.uri=http://127.0.0.1:9"), tmp_path / "tracked",
                        progress=False)
    messages = [str(w.message) for w in caught if "tracking with mlflow" in str(w.message)]
    assert len(messages) == 1 and "the runs go on without it" in messages[0]
    assert tracked.best_validation == untracked.best_validation
    assert epochs_without_time(tracked.run_dir) == epochs_without_time(untracked.run_dir)
    assert "tracking" not in json.loads((tracked.run_dir / records.RUN_FILE).read_text())


def test_a_failed_tracker_is_not_tried_again_by_the_runs_that_share_its_failures(tmp_path: Path) -> None:
    """A benchmark's worker passes one ``TrackerFailures`` to all its runs: an unreachable server is one
    warning for all of them; runs that share nothing (two ``dmlbench train`` processes) warn each."""
    from dmlbench.training.tracking import TrackerFailures

    unreachable = tiny("tracking.backend=mlflow", "tracking.uri=http://127.0.0.1:9")
    for shared, expected in ((True, 1), (False, 2)):
        failures: TrackerFailures = set()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for run in range(2):
                train(unreachable, tmp_path / f"{shared}{run}", progress=False, tracker_failures=failures if shared else None)
        assert sum("tracking with mlflow" in str(w.message) for w in caught) == expected
        assert failures == ({("mlflow", "http://127.0.0.1:9")} if shared else set())


def test_a_tracked_benchmark_has_a_parent_run_with_the_report_and_its_config_hash_is_unchanged(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    output = tmp_path / "out"
    result = subprocess.run([console_script(), "benchmark", str(REPO / "configs" / "smoke.yaml"), "-o", str(output), "-q",
                             "protocol.trials=1", "protocol.reproductions=2", "tracking.backend=mlflow", f"tracking.uri={uri}"],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("dmlbench").experiment_id
    runs = client.search_runs([experiment], max_results=1000)
    (parent,) = [run for run in runs if run.data.tags.get("dmlbench.role") == "benchmark"]
    artifacts = {artifact.path for artifact in client.list_artifacts(parent.info.run_id)}
    assert {"report.md", "report.html", "results.csv", "runs.csv", "benchmark.json"} <= artifacts
    # The figures report.md links to travel with it, so the report reads whole in MLflow.
    linked = set(re.findall(r"\]\(([^)]+\.png)\)", (output / "report.md").read_text()))
    assert {"search.png", "validation_curves.png"} <= linked <= artifacts
    children = [run for run in runs if run is not parent and run.data.tags.get("dmlbench.role") != "benchmark"]
    # 2 methods x (1 trial + 2 reproductions) x 2 folds; each child under the parent
    assert len(children) == 12 and all(run.data.tags["mlflow.parentRunId"] == parent.info.run_id for run in children)
    reproduction = next(run for run in children if run.data.tags["dmlbench.stage"] == "reproduction")
    assert "test_concatenated_map_at_r" in reproduction.data.metrics
    benchmark = json.loads((output / "benchmark.json").read_text())
    untracked = subprocess.run([console_script(), "benchmark", str(REPO / "configs" / "smoke.yaml"), "-o", str(output), "-q",
                                "protocol.trials=1", "protocol.reproductions=2"], capture_output=True, text=True, timeout=600,
                               cwd=tmp_path)
    # The same benchmark without tracking: the same config hash, so it continues (here: nothing left to do).
    assert untracked.returncode == 0 and "wrote the report" in untracked.stderr + untracked.stdout
    assert json.loads((output / "benchmark.json").read_text())["config_hash"] == benchmark["config_hash"]
