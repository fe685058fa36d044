"""Experiment tracking beside ``metrics.jsonl``: MLflow or TensorBoard (``tracking:`` in a config).

A tracker follows one training run: its parameters (the flattened config), its tags (the protocol's
method, stage, trial or reproduction, fold, and the benchmark's config hash), every epoch's loss and
validation scores, the test scores of a reproduction and the final status. Tracking is a view of the
run, never part of it: a tracking server that cannot be reached (or any other failure of the
tracker) is one warning line, the tracker switches itself off, and the run goes on unchanged.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dmlbench.config import TrackingConfig
from dmlbench.training.records import TENSORBOARD_DIR


def default_mlflow_uri() -> str:
    """Where MLflow itself tracks when ``tracking.uri`` is unset: ``MLFLOW_TRACKING_URI``, else
    MLflow's default (``sqlite:///mlflow.db`` in the working directory, or an existing ``./mlruns``),
    so that ``mlflow ui`` started in the same folder shows the runs."""
    try:
        from mlflow.tracking import get_tracking_uri
    except ImportError:  # the tracker's first call warns that MLflow is missing and switches tracking off
        return os.environ.get("MLFLOW_TRACKING_URI") or "MLflow's default"
    return str(get_tracking_uri())


class Tracker:
    """Does nothing: ``tracking.backend: none`` (the default), and what a failed tracker becomes."""

    def start(self, run_dir: Path, params: Mapping[str, Any], tags: Mapping[str, Any]) -> dict[str, Any]:
        """Open the run; returns what ``run.json`` records under ``tracking`` (to reopen it later)."""
        return {}

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Scores of one step (an epoch; the test scores at the last one)."""

    def finish(self, status: str) -> None:
        """Close the run with the run record's status."""


# The trackers that failed, by backend and destination: each warned about once and not tried again
# by the runs that share the set (a benchmark's worker passes its own to every run it trains, since an
# unreachable server would otherwise cost each of them its time-out).
TrackerFailures = set[tuple[str, str]]


class _Guarded(Tracker):
    """Every call of a real tracker: a failure is one warning and the end of tracking for every run
    that shares ``failures`` (``None``: for this tracker)."""

    backend = ""

    def __init__(self, settings: TrackingConfig, destination: str, failures: TrackerFailures | None = None) -> None:
        self.settings, self.destination = settings, destination
        self.failures: TrackerFailures = set() if failures is None else failures

    def _guard(self, action: str, call: Any, *args: Any) -> Any:
        key = (self.backend, self.destination)
        if key in self.failures:
            return None
        try:
            return call(*args)
        except Exception as error:  # a tracker never fails the run
            self.failures.add(key)
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            warnings.warn(f"tracking with {self.backend} at {_without_password(self.destination)} stopped ({action}: "
                          f"{first[:300]}); the runs go on without it", stacklevel=2)
            return None

    def start(self, run_dir: Path, params: Mapping[str, Any], tags: Mapping[str, Any]) -> dict[str, Any]:
        return self._guard("start", self._start, run_dir, params, tags) or {}

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._guard("log", self._log, metrics, step)

    def finish(self, status: str) -> None:
        self._guard("finish", self._finish, status)

    def _start(self, run_dir: Path, params: Mapping[str, Any], tags: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _log(self, metrics: Mapping[str, float], step: int) -> None:
        raise NotImplementedError

    def _finish(self, status: str) -> None:
        raise NotImplementedError


class MLflowTracker(_Guarded):
    """One MLflow run per training run, in experiment ``tracking.experiment`` at ``tracking.uri``
    (a server URL for a team, or a database; unset: MLflow's own choice, ``default_mlflow_uri``)."""

    backend = "mlflow"

    def __init__(self, settings: TrackingConfig, run_id: str | None = None, failures: TrackerFailures | None = None) -> None:
        self.uri = settings.uri or default_mlflow_uri()
        super().__init__(settings, self.uri, failures)
        self.run_id = run_id
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            logging.getLogger("mlflow").setLevel(logging.WARNING)  # its database-migration notes on stderr
            # A server that does not answer costs one short attempt, not MLflow's minutes of retries
            # (a user's own settings of these variables win).
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
            from mlflow.tracking import MlflowClient

            if self.uri.startswith("sqlite:///"):
                Path(self.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def experiment_id(self) -> str:
        client = self.client()
        found = client.get_experiment_by_name(self.settings.experiment)
        if found is not None:
            return str(found.experiment_id)
        location = None
        if self.settings.uri and self.uri.startswith("sqlite:///"):
            # A database named in the config keeps its artifacts beside it; without one MLflow places them.
            location = (Path(self.uri.removeprefix("sqlite:///")).parent / "artifacts").as_uri()
        try:
            return str(client.create_experiment(self.settings.experiment, artifact_location=location))
        except Exception:  # another worker created it first
            return str(client.get_experiment_by_name(self.settings.experiment).experiment_id)

    def _start(self, run_dir: Path, params: Mapping[str, Any], tags: Mapping[str, Any]) -> dict[str, Any]:
        from mlflow.entities import Param, RunTag

        client = self.client()
        if self.run_id is None:
            run = client.create_run(self.experiment_id(), run_name=run_dir.name if not tags else _run_name(run_dir, tags))
            self.run_id = run.info.run_id
            client.log_batch(self.run_id, params=[Param(key, _text(value)[:6000]) for key, value in params.items()],
                             tags=[RunTag(f"dmlbench.{key}", _text(value)) for key, value in tags.items()]
                             + [RunTag("dmlbench.run_dir", str(run_dir))])
        else:
            client.update_run(self.run_id, status="RUNNING")
        return {"backend": "mlflow", "uri": _without_password(self.uri), "run_id": self.run_id}

    def _log(self, metrics: Mapping[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        self.client().log_batch(self.run_id, metrics=[Metric(key, float(value), stamp, step) for key, value in metrics.items()])

    def _finish(self, status: str) -> None:
        self.client().set_terminated(self.run_id, status={"completed": "FINISHED", "interrupted": "KILLED"}.get(status, "FAILED"))

    def report(self, output_dir: Path, files: list[Path], config_hash: str) -> None:
        """The benchmark's report files as artifacts of a parent run, which every training run
        tagged with the benchmark's config hash (whichever worker ran it) becomes a child of."""
        self._guard("report", self._report, output_dir, files, config_hash)

    def _report(self, output_dir: Path, files: list[Path], config_hash: str) -> None:
        client = self.client()
        experiment = self.experiment_id()
        parent = client.create_run(experiment, run_name=f"benchmark {output_dir.name}",
                                   tags={"dmlbench.config_hash": config_hash, "dmlbench.role": "benchmark",
                                         "dmlbench.output_dir": str(output_dir)})
        for path in files:
            client.log_artifact(parent.info.run_id, str(path))
        children = client.search_runs([experiment], filter_string=f"tags.`dmlbench.config_hash` = '{config_hash}'",
                                      max_results=50000)
        for child in children:
            if child.info.run_id != parent.info.run_id:
                client.set_tag(child.info.run_id, "mlflow.parentRunId", parent.info.run_id)
        client.set_terminated(parent.info.run_id, status="FINISHED")


class TensorBoardTracker(_Guarded):
    """Event files in ``RUN_DIR/tensorboard`` (torch's ``SummaryWriter``; the ``tensorboard`` extra)."""

    backend = "tensorboard"

    def __init__(self, settings: TrackingConfig, failures: TrackerFailures | None = None) -> None:
        super().__init__(settings, "run directories", failures)
        self.writer: Any = None

    def _start(self, run_dir: Path, params: Mapping[str, Any], tags: Mapping[str, Any]) -> dict[str, Any]:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR))
        for name, values in (("config", params), ("tags", tags)):
            if values:  # a reopened run (its test scores) has them already
                self.writer.add_text(name, "\n".join(f"    {key}: {_text(value)}" for key, value in values.items()), 0)
        self.writer.flush()
        return {"backend": "tensorboard", "log_dir": str(run_dir / TENSORBOARD_DIR)}

    def _log(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, float(value), step)
        self.writer.flush()

    def _finish(self, status: str) -> None:
        self.writer.close()


def tracker(settings: TrackingConfig, recorded: Mapping[str, Any] | None = None,
            failures: TrackerFailures | None = None) -> Tracker:
    """The tracker of ``settings``; ``recorded`` (a ``run.json``'s ``tracking``) reopens an MLflow run;
    ``failures``: the trackers that already failed for the runs this one goes with."""
    if settings.backend == "mlflow":
        return MLflowTracker(settings, (recorded or {}).get("run_id"), failures)
    if settings.backend == "tensorboard":
        return TensorBoardTracker(settings, failures)
    return Tracker()


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"loss": {"name": "x"}}`` -> ``{"loss.name": "x"}`` (the dotted keys of overrides)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def log_test_scores(run_dir: Path, settings: TrackingConfig, scores: Mapping[str, Mapping[str, float]],
                    failures: TrackerFailures | None = None) -> None:
    """A reproduction's test scores (per mode) on one of its fold runs, which the tracker then closes."""
    from dmlbench.training import records

    if settings.backend == "none":
        return
    record = records.read_run_record(run_dir)
    track = tracker(settings, record.get("tracking"), failures)
    track.start(run_dir, {}, {})
    track.log({f"test_{mode}_{metric}": value for mode, values in scores.items() for metric, value in values.items()},
              int(record.get("epochs_run") or 0))
    track.finish(str(record.get("status")))


def epoch_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """An epoch record of ``metrics.jsonl`` as tracker metrics: ``loss`` and ``validation_<metric>``."""
    metrics = {"loss": float(record["loss"])} if "loss" in record else {}
    metrics.update({f"validation_{key}": float(value) for key, value in (record.get("validation") or {}).items()})
    return metrics


def _run_name(run_dir: Path, tags: Mapping[str, Any]) -> str:
    unit = f"trial {tags['trial']}" if "trial" in tags else f"reproduction {tags['reproduction']}" if "reproduction" in tags else ""
    parts = [str(tags.get("method", "")), unit, f"fold {tags['fold']}" if "fold" in tags else ""]
    return " ".join(part for part in parts if part) or run_dir.name


def _text(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def _without_password(uri: str) -> str:
    from urllib.parse import urlsplit

    password = urlsplit(uri).password
    return uri if password is None else uri.replace(f":{password}@", "@", 1)
