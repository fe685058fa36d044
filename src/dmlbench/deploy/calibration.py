"""``calibration.json``: a run's (or embedding files') verification thresholds, written by ``dmlbench
calibrate`` and read by ``evaluate --open-set``, ``index`` and ``query``.

A calibration made from a run records the sha256 of the run's validation-selected checkpoint and of
its config (``training.records.run_hashes``); one made from embedding sets written by ``dmlbench
embed`` takes them from the sets' ``.json``. Whatever applies a calibration checks them first, so a
threshold is never used with another model's distances.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dmlbench import files, provenance
from dmlbench.deploy.embeddings import prefix_of, side_file
from dmlbench.deploy.model import open_run
from dmlbench.errors import ParameterError, UserInputError
from dmlbench.evaluation.calibration import DEFAULT_REPLICATES, calibrate, check_reachable, check_targets
from dmlbench.training import records
from dmlbench.training.run_evaluation import RunEvaluation

FORMAT = "dmlbench calibration"
HASH_KEYS = ("model_sha256", "config_sha256")


def parse_targets(text: str) -> tuple[float, ...]:
    """``--fmr 1e-3,1e-4`` as checked target rates."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ParameterError("fmr", f"must be comma-separated numbers in (0, 1), got {text!r}") from None
    if not values:
        raise ParameterError("fmr", "needs at least one target false match rate, e.g. 1e-3,1e-4")
    return check_targets(values)


def calibrate_run(run_dir: Path, targets: Sequence[float], *, seed: int = 0, replicates: int = DEFAULT_REPLICATES) -> dict[str, Any]:
    """Thresholds chosen on the run's validation classes, measured on its test classes."""
    targets = check_targets(targets)
    run = RunEvaluation(open_run(run_dir))
    # Too few validation classes for a target is said before anything is embedded.
    check_reachable(np.asarray(run.run.dataset.labels)[run.run.splits.validation], targets, "validation split")
    validation_embeddings, validation_labels = run.embedded("validation")
    test_embeddings, test_labels = run.embedded("test")
    result = calibrate(validation_embeddings, validation_labels, test_embeddings, test_labels, targets,
                       seed=seed, replicates=replicates)
    source = {"run": str(Path(run_dir).resolve()), "calibration": "the run's validation classes",
              "test": "the run's test classes"}
    return _document(source, records.run_hashes(Path(run_dir)), result)


def calibrate_files(
    embeddings: Path, labels: Path, test_embeddings: Path, test_labels: Path, targets: Sequence[float], *,
    seed: int = 0, replicates: int = DEFAULT_REPLICATES,
) -> dict[str, Any]:
    """Thresholds chosen on ``embeddings`` (calibration classes), measured on ``test_embeddings``."""
    targets = check_targets(targets)
    calibration_labels = files.load_array(labels, "labels")
    check_reachable(calibration_labels, targets, "calibration set")
    hashes = [embedding_hashes(path) for path in (embeddings, test_embeddings)]
    if None not in hashes and hashes[0] != hashes[1]:
        raise UserInputError(f"{embeddings} and {test_embeddings} were made by different models (their .json hashes differ)")
    rows, test_rows = files.load_array(embeddings, "embeddings"), files.load_array(test_embeddings, "test embeddings")
    if rows.ndim == test_rows.ndim == 2 and rows.shape[1] != test_rows.shape[1]:
        # Distances between rows of different models mean nothing; without this the 8-d test rows
        # would be measured against a threshold chosen on 16-d ones.
        raise ParameterError("embeddings", f"{embeddings} holds {rows.shape[1]}-dimensional rows but `test_embeddings` "
                             f"{test_embeddings} {test_rows.shape[1]}-dimensional ones: give both from the same model")
    result = calibrate(rows, calibration_labels, test_rows, files.load_array(test_labels, "test labels"), targets,
                       seed=seed, replicates=replicates)
    source = {"calibration": str(embeddings.resolve()), "test": str(test_embeddings.resolve())}
    return _document(source, hashes[0] if None not in hashes else None, result)


def embedding_hashes(path: Path) -> dict[str, str] | None:
    """The model and config hashes an embedding set's ``.json`` records (``dmlbench embed``), or ``None``."""
    meta_file = side_file(prefix_of(path), ".json")
    if not meta_file.is_file():
        return None
    return index_hashes(files.read_json(meta_file))


def index_hashes(meta: dict[str, Any]) -> dict[str, str] | None:
    """Model and config hashes from an embedding set's meta (sets older than ``config_sha256``: the
    config file of the run they name, where it still exists)."""
    model = meta.get("checkpoint_sha256")
    config = meta.get("config_sha256")
    if config is None and meta.get("run") and (Path(meta["run"]) / records.CONFIG_FILE).is_file():
        config = files.file_sha256(Path(meta["run"]) / records.CONFIG_FILE)
    if model is None or config is None:
        return None
    return {"model_sha256": model, "config_sha256": config}


def load_calibration(path: Path) -> dict[str, Any]:
    """A ``calibration.json`` written by ``dmlbench calibrate``, or one line saying why it is not one."""
    if not path.is_file():
        raise UserInputError(f"calibration file {path} does not exist")
    try:
        document = files.read_json(path)
    except (ValueError, UnicodeDecodeError):
        raise UserInputError(f"calibration file {path} is not JSON") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT or not isinstance(document.get("targets"), list):
        raise UserInputError(f"{path} is not a calibration written by dmlbench calibrate")
    return document


def check_same_model(calibration: dict[str, Any], hashes: dict[str, str] | None, calibration_name: str, what: str) -> None:
    """Refuse a calibration of another model than ``what`` (or one whose model cannot be told)."""
    if any(key not in calibration for key in HASH_KEYS):
        raise UserInputError(f"calibration {calibration_name} records no model hash (made from embedding files without "
                             f"their .json), so it cannot be checked against {what}")
    if hashes is None:
        raise UserInputError(f"{what} records no model and config hashes to check calibration {calibration_name} against")
    for key in HASH_KEYS:
        if calibration[key] != hashes[key]:
            kind = key.split("_")[0]
            raise UserInputError(f"calibration {calibration_name} is of another model than {what} ({kind} sha256 "
                                 f"{calibration[key][:12]} vs {hashes[key][:12]})")


def select_target(calibration: dict[str, Any], fmr: float | None, calibration_name: str) -> dict[str, Any]:
    """The calibration's operating point at target ``fmr``; without one, its only target."""
    points = calibration["targets"]
    listed = ", ".join(f"{point['target_fmr']:g}" for point in points)
    if fmr is None:
        if len(points) != 1:
            raise ParameterError("fmr", f"is needed: calibration {calibration_name} has several targets ({listed}); choose one")
        return points[0]
    for point in points:
        if np.isclose(point["target_fmr"], fmr, rtol=1e-9, atol=0.0):
            return point
    raise UserInputError(f"calibration {calibration_name} has no target FMR {fmr:g} (it has {listed})")


def run_thresholds(calibration_path: Path, run_dir: Path) -> dict[float, float]:
    """The thresholds (target FMR -> threshold) of ``calibration_path``, refused unless it calibrated the run in
    ``run_dir`` (the same model and config hashes)."""
    calibration = load_calibration(calibration_path)
    check_same_model(calibration, records.run_hashes(run_dir), str(calibration_path), f"run {run_dir}")
    return {float(point["target_fmr"]): float(point["threshold"]) for point in calibration["targets"]}


def _document(source: dict[str, Any], hashes: dict[str, str] | None, result: dict[str, Any]) -> dict[str, Any]:
    return {"format": FORMAT, "created": provenance.now(), "source": source, **(hashes or {}), **result}
