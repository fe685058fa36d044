"""Where a number came from: the source commit a process records, the device benchmark.json names."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dmlbench import provenance
from dmlbench.protocol.design.benchmark import load_spec
from dmlbench.protocol.design.prepare import prepare
from dmlbench.protocol.run.record import write_benchmark_file
from dmlbench.training import placement


@pytest.fixture
def fresh_commit() -> Iterator[None]:
    provenance.git_commit.cache_clear()
    yield
    provenance.git_commit.cache_clear()


def test_a_process_records_the_commit_it_started_with(fresh_commit: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkout moving on under a long-running worker (a commit, an edit) does not change the
    commit its later runs record: git is asked once per process."""
    answers = iter(["aaaa\n", "", "bbbb\n", " M src/dmlbench/x.py\n"])  # HEAD, status; then a commit and an edit
    calls: list[list[str]] = []

    def git(arguments: list[str], **options: object) -> subprocess.CompletedProcess[str]:
        calls.append(arguments)
        return subprocess.CompletedProcess(arguments, 0, stdout=next(answers), stderr="")

    monkeypatch.setattr(provenance.subprocess, "run", git)
    assert provenance.git_commit() == "aaaa"
    assert provenance.git_commit() == "aaaa"
    assert [call[:2] for call in calls] == [["git", "rev-parse"], ["git", "status"]]


def test_the_commit_is_this_checkouts_head(fresh_commit: None) -> None:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(provenance.__file__).parent, capture_output=True, text=True)
    except OSError:
        pytest.skip("no git")
    if head.returncode != 0:
        pytest.skip("not a git checkout (an installed package)")
    assert provenance.git_commit().removesuffix("+dirty") == head.stdout.strip()


def test_package_versions_are_read_once_and_handed_out_as_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    provenance._installed_versions.cache_clear()
    try:
        first = provenance.package_versions()
        monkeypatch.setattr(provenance.metadata, "version", lambda package: "9.9.9")  # an upgrade meanwhile
        first["torch"] = "changed by a caller"
        again = provenance.package_versions()
        assert again["torch"] != "9.9.9" and again["torch"] != "changed by a caller"
        assert set(again) == {"python", *provenance.RECORDED_PACKAGES}
    finally:
        provenance._installed_versions.cache_clear()


@pytest.mark.parametrize(("cuda", "device", "name"), [(False, "cpu", None), (True, "cuda", "Test GPU")])
def test_benchmark_file_names_the_device_its_runs_train_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           cuda: bool, device: str, name: str | None) -> None:
    """``training.device: auto`` where CUDA is present: benchmark.json records CUDA, as each run.json
    does (it once recorded ``cpu`` for a benchmark whose runs trained on an H200)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _device=None: "Test GPU")
    monkeypatch.setattr(placement, "reproducible_cuda", lambda: None)  # it sets process-wide flags
    smoke = Path(__file__).resolve().parent.parent / "configs" / "smoke.yaml"
    write_benchmark_file(prepare(load_spec(smoke), tmp_path))
    environment = json.loads((tmp_path / "benchmark.json").read_text())["environment"]
    assert (environment["device"], environment["device_name"]) == (device, name)
