"""Evaluating a finished run on its test split: once, beside the untrained model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dmlbench import config as config_module
from dmlbench import evaluation
from dmlbench.errors import UserInputError
from dmlbench.training import records
from dmlbench.training.embed import embed, resolve_device
from dmlbench.training.setup import build_model, load_dataset, make_splits


def load_run_config(run_dir: Path) -> config_module.Config:
    return config_module.load(run_dir / records.CONFIG_FILE)


def evaluate_run(run_dir: str | Path, **evaluate_kwargs: Any) -> dict[str, Any]:
    """Test metrics of the run's best (validation-selected) checkpoint and of the untrained model.

    The test split is embedded once: the result is stored in the run directory and returned as
    stored on later calls with the same options.
    """
    run_dir = Path(run_dir)
    run_record = records.require_run_dir(run_dir)
    if run_record.get("status") != "completed":
        raise UserInputError(f"run {run_dir} is not completed (status: {run_record.get('status')})")
    stored_path = run_dir / records.TEST_METRICS_FILE
    options = {key: _jsonable(value) for key, value in sorted(evaluate_kwargs.items())}
    if stored_path.exists():
        stored = records.read_json(stored_path)
        if stored.get("options") == options:
            return stored["results"]
    checkpoint = run_dir / records.BEST_CHECKPOINT
    if not checkpoint.is_file():
        raise UserInputError(f"run {run_dir} has no {records.BEST_CHECKPOINT}")
    config = load_run_config(run_dir)
    dataset = load_dataset(config)
    if dataset.content_hash != run_record["dataset"]["content_hash"]:
        raise UserInputError(f"dataset {config.data.name!r} differs from the one run {run_dir} was trained on")
    test_set = dataset.subset(make_splits(config, dataset).test)
    device = resolve_device(config.training.device)
    evaluate_kwargs.setdefault("seed", config.seed)

    untrained = build_model(config).to(device)
    untrained_embeddings, labels = embed(untrained, test_set, config.evaluation.batch_size, device)
    trained = build_model(config).to(device)
    trained.load_state_dict(torch.load(checkpoint, map_location=device, weights_only=False)["model"])
    trained_embeddings, _ = embed(trained, test_set, config.evaluation.batch_size, device)

    results = dict(evaluation.evaluate(trained_embeddings, labels, **evaluate_kwargs))
    results["untrained"] = dict(evaluation.evaluate(untrained_embeddings, labels, **evaluate_kwargs))
    records.write_json(stored_path, {"evaluated": records.now(), "options": options, "results": results})
    return results


def _jsonable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
