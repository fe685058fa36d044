"""configs/reality_check_{cub200,cars196,sop}.yaml (seed 001's settings on the real datasets) are accepted
by the benchmark on a replica of each dataset's layout: every check ``benchmark`` makes before it trains,
and (slow) the whole ``--dry-run``. The replicas hold enough development classes for the classification
losses' batches of 32 classes in every fold; nothing is downloaded (``model.pretrained=false``, or the
ImageNet weights placed in a private torch hub folder beforehand)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import cadene_weights
import replicas
from cli_runner import run_cli

from dmlbench.protocol.design.benchmark import load_spec
from dmlbench.protocol.design.prepare import prepare

REPO = Path(__file__).resolve().parent.parent
CONFIGS = ("cub200", "cars196", "sop")


def _replica(dataset: str, root: Path) -> Path:
    if dataset == "sop":
        return replicas.sop(root, train_classes=44, test_classes=44, per_class=4)
    return replicas.BUILDERS[dataset](root, classes=88, per_class=4)


def _config(dataset: str) -> Path:
    return REPO / "configs" / f"reality_check_{dataset}.yaml"


@pytest.mark.parametrize("dataset", CONFIGS)
def test_the_reality_check_config_passes_every_check_before_training(dataset: str, tmp_path: Path) -> None:
    overrides = [f"data.root={_replica(dataset, tmp_path)}", "model.pretrained=false"]
    prepared = prepare(load_spec(_config(dataset)), tmp_path / "out", overrides)
    config = next(iter(prepared.plans.values())).config
    assert (config.model.trunk, config.model.embedding_dim, config.model.freeze_bn) == ("bninception", 128, True)
    assert (config.data.image_size, config.data.augmentation, config.training.batch_size) == (227, "reality_check", 32)
    assert (config.optimizer.name, config.optimizer.lr) == ("rmsprop", 1e-6)
    assert (prepared.spec.protocol.folds, prepared.spec.protocol.trials, prepared.spec.protocol.reproductions) == (4, 50, 10)
    assert len(prepared.plans) == 14
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("dataset", CONFIGS)
def test_the_reality_check_config_as_written_finds_its_imagenet_weights(dataset: str, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``model.pretrained: true``: BN-Inception's file read from torch's hub folder (here one in Cadene's
    layout whose name carries its own hash), its hash kept for benchmark.json, 227 px taken by the Caffe pooling."""
    folder = cadene_weights.hub_folder(tmp_path, monkeypatch)
    folder.mkdir(parents=True)
    data = cadene_weights.weight_file(tmp_path / "weights.pth")
    name = cadene_weights.name_carrying_its_hash(data, monkeypatch)
    (folder / name).write_bytes(data)
    monkeypatch.setenv("DMLBENCH_OFFLINE", "1")
    prepared = prepare(load_spec(_config(dataset)), tmp_path / "out", [f"data.root={_replica(dataset, tmp_path)}"])
    assert prepared.weights == [{"file": name, "sha256": hashlib.sha256(data).hexdigest()}]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("dataset", CONFIGS)
def test_the_reality_check_config_dry_runs_on_a_replica(dataset: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A small trunk and budget, so that timing fourteen methods' steps stays under a minute."""
    code, out, err = run_cli(["benchmark", str(_config(dataset)), f"data.root={_replica(dataset, tmp_path)}",
                              "model.pretrained=false", "model.trunk=small_cnn", "model.options={in_channels: 3, width: 8}",
                              "data.image_size=32", "protocol.trials=1", "protocol.startup_trials=1",
                              "protocol.reproductions=2", "-o", str(tmp_path / "out"), "--dry-run"], capsys)
    assert code == 0, err
    assert "14 methods x (1 search trials + 2 reproductions) x 4 folds" in out and "estimate:" in out
