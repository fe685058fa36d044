"""``dmlbench train`` + ``evaluate`` on a replica of every file format with a ResNet-50 (random weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import replicas
from cli_runner import run_cli

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "glyphs.yaml"

# Replicas with five train/validation classes, so that validation (2 classes) and training (3) both work.
LARGER = {
    "cub200": lambda root: replicas.cub200(root, classes=10, per_class=2),
    "cars196": lambda root: replicas.cars196(root, classes=10, per_class=2),
    "sop": lambda root: replicas.sop(root, train_classes=5),
    "inshop": lambda root: replicas.inshop(root, extra_train=3),
    "folder": lambda root: replicas.folder(root, classes=10, per_class=2),
    "csv": lambda root: replicas.csv(root, extra_train=3),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LARGER))
def test_train_and_evaluate_on_replica(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = LARGER[name](tmp_path / "data")
    run_dir = tmp_path / "run"
    code, _, err = run_cli([
        "train", str(CONFIG), "--output", str(run_dir), "-q", f"data.name={name}", f"data.root={root}", "data.image_size=32",
        "data.validation_fraction=0.4", "data.augmentation=base", "model.trunk=resnet50", "model.embedding_dim=8",
        "training.epochs=1", "training.batch_size=4", "sampler.params={samples_per_class: 2}", "training.max_steps_per_epoch=1",
        "evaluation.metrics=[precision_at_1, map_at_r]", "evaluation.selection_metric=map_at_r",
    ], capsys)
    assert code == 0, err
    record = json.loads((run_dir / "run.json").read_text())
    assert record["unreadable_images"] == 0
    results_path = tmp_path / "test.json"
    code, _, err = run_cli(["evaluate", str(run_dir), "--json", str(results_path)], capsys)
    assert code == 0, err
    results = json.loads(results_path.read_text())
    queries = {"inshop": 3, "csv": 2}.get(name)  # query/gallery: only the queries are scored
    if queries is not None:
        assert results["num_queries"] == queries
    else:
        assert results["num_queries"] == record["split_sizes"]["test"]
