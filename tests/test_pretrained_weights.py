"""``model.pretrained: true``: torchvision's ImageNet checkpoint downloaded into torch's hub cache when
absent (from a server on 127.0.0.1 named by ``DMLBENCH_MIRROR``), its sha256 checked against the prefix
its file name carries, recorded in run.json; ``--offline`` names the file to place; a benchmark whose
runs started from other weights is refused."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torchvision

import replicas
from cli_runner import run_cli
from fetch_server import Served, server  # noqa: F401  (server: a fixture)

from dmlbench.errors import UserInputError
from dmlbench.protocol.design.prepare import _check_weights


def _googlenet_file(path: Path) -> bytes:
    torch.save(torchvision.models.googlenet(weights=None, aux_logits=False, init_weights=False).state_dict(), path)
    return path.read_bytes()


@pytest.fixture
def hub(server: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A private torch hub folder, torchvision's GoogLeNet checkpoint list replaced by one file whose
    name carries the sha256 prefix of a small state_dict, that file on the server; (checkpoints folder, name)."""
    data = _googlenet_file(tmp_path / "weights.pth")
    name = f"googlenet-{hashlib.sha256(data).hexdigest()[:8]}.pth"
    server.files[name] = data
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("DMLBENCH_MIRROR", server.url)
    monkeypatch.delenv("DMLBENCH_OFFLINE", raising=False)
    monkeypatch.setattr(torchvision.models, "GoogLeNet_Weights",
                        [SimpleNamespace(url=f"https://download.pytorch.org/models/{name}")])
    return tmp_path / "torch" / "hub" / "checkpoints", name


def _train(tmp_path: Path, *extra: str) -> list[str]:
    data_root = replicas.cub200(tmp_path / "replica", classes=8, per_class=4)
    return [*extra, "train", "configs/glyphs.yaml", "data.name=cub200", f"data.root={data_root}", "data.image_size=32",
            "data.options={workers: 1}", "data.validation_fraction=0.5", "model.embedding_dim=16", "training.epochs=1",
            "training.batch_size=8", "evaluation.metrics=[map_at_r]", "model.trunk=googlenet", "model.pretrained=true",
            "-o", str(tmp_path / "run"), "-q"]


def test_pretrained_true_downloads_the_checkpoint_into_the_hub_cache_and_run_json_records_its_hash(
        hub: tuple[Path, str], server: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder, name = hub
    code, _, err = run_cli(_train(tmp_path), capsys)
    assert code == 0, err
    digest = hashlib.sha256(server.files[name]).hexdigest()
    assert (folder / name).read_bytes() == server.files[name]
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["pretrained_weights"]
    assert recorded == {"file": name, "sha256": digest}
    assert [asked for asked, _ in server.requests] == [name]  # once: later builds find it in the cache


def test_a_checkpoint_whose_sha256_does_not_start_with_its_name_is_refused_and_not_kept(
        hub: tuple[Path, str], server: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder, name = hub
    server.files[name] = server.files[name][:-100]  # truncated on the way
    code, _, err = run_cli(_train(tmp_path), capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "does not start with the" in err and "model.pretrained=true (googlenet)" in err
    assert not (folder / name).exists() and not list(folder.glob("*.part"))


def test_offline_with_no_weights_names_the_file_to_place(
        hub: tuple[Path, str], server: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder, name = hub
    code, _, err = run_cli(_train(tmp_path, "--offline"), capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"offline: {folder / name} is missing" in err and not server.requests


def test_a_benchmark_whose_runs_used_other_weights_is_refused(tmp_path: Path) -> None:
    used = [{"file": "resnet50-0676ba61.pth", "sha256": "0676ba61" + "0" * 56}]
    prepared = SimpleNamespace(output_dir=tmp_path, weights=used)
    _check_weights(prepared, None)  # recorded before weights were: accepted, and recorded now
    _check_weights(prepared, used)
    with pytest.raises(UserInputError, match="started from resnet50-0676ba61.pth .sha256 0676ba610000.*random weights"):
        _check_weights(SimpleNamespace(output_dir=tmp_path, weights=[]), used)
