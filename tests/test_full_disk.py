"""A disk that fills up: one line naming the path, exit 1, nothing stored as a failure, and the same
command finishes exactly as an undisturbed run once there is space (a real tmpfs, mounted as root)."""

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cli_runner import run_in_process
from test_cli_process import GLYPHS_CONFIG, console_script
from training_fixtures import TINY

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "configs" / "smoke.yaml"


class SmallDisk:
    """A tmpfs of ``size`` bytes; ``fill(leave)`` takes all but ``leave`` bytes, ``free()`` gives them back."""

    def __init__(self, size: int) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="dmlbench-small-disk-"))
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(self.path)],
                                 capture_output=True, text=True)
        if mounted.returncode != 0:
            self.path.rmdir()
            pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
        self.filler = self.path / "filler"

    def fill(self, leave: int) -> None:
        free = os.statvfs(self.path).f_bavail * os.statvfs(self.path).f_frsize
        with open(self.filler, "ab") as stream:
            stream.write(b"\0" * max(0, free - leave))

    def free(self) -> None:
        self.filler.unlink()

    def unmount(self) -> None:
        subprocess.run(["umount", str(self.path)], check=True)
        self.path.rmdir()


@pytest.fixture
def small_disk() -> Iterator[SmallDisk]:
    disk = SmallDisk(64 << 20)
    yield disk
    disk.unmount()


def dmlbench(*arguments: str) -> subprocess.CompletedProcess[str]:
    """The console script in a process of its own: the command that meets the full disk (a process
    that maps a file on a full tmpfs can die of SIGBUS, which must not take pytest with it)."""
    return subprocess.run([console_script(), *arguments], capture_output=True, text=True, timeout=600, cwd=REPO)


def assert_disk_full_line(result: subprocess.CompletedProcess[str], where: Path) -> None:
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    assert "No space left on device" in lines[0] and str(where) in lines[0], lines[0]


def strip(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in path.read_text().splitlines()]


def test_train_on_a_full_disk_stops_with_one_line_and_resumes_to_the_same_run(
        small_disk: SmallDisk, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reference = tmp_path / "reference"
    trained = run_in_process(["train", GLYPHS_CONFIG, *TINY, "training.epochs=3", "-o", str(reference), "-q"], capsys)
    assert trained.returncode == 0, trained.stderr
    run_dir = small_disk.path / "run"
    small_disk.fill(leave=300_000)  # room for the start of the run, not for its three epochs
    result = dmlbench("train", GLYPHS_CONFIG, *TINY, "training.epochs=3", "-o", str(run_dir), "-q")
    assert_disk_full_line(result, small_disk.path)
    assert "dmlbench train --resume -o" in result.stderr
    assert not list(run_dir.glob(".*.tmp")), "a temporary file was left behind"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] != "failed"
    small_disk.free()
    resumed = run_in_process(["train", "--resume", "-o", str(run_dir), "-q"], capsys)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"
    assert strip(run_dir / "metrics.jsonl") == strip(reference / "metrics.jsonl")


# Slow (minutes): a training run and an embedding on a full disk stay in the default suite.
@pytest.mark.slow
def test_benchmark_on_a_full_disk_stores_no_failure_writes_no_report_and_finishes_identically(
    small_disk: SmallDisk, tmp_path: Path
) -> None:
    reference = tmp_path / "reference"
    assert dmlbench("benchmark", str(SMOKE), "-o", str(reference), "-q").returncode == 0
    output = small_disk.path / "bench"
    small_disk.fill(leave=1_500_000)
    result = dmlbench("benchmark", str(SMOKE), "-o", str(output), "-q")
    assert_disk_full_line(result, small_disk.path)
    assert "nothing was stored as a failure" in result.stderr and f"-o {output}" in result.stderr
    assert not (output / "report.md").exists() and not (output / "results.csv").exists()
    small_disk.free()
    again = dmlbench("benchmark", str(SMOKE), "-o", str(output), "-q")
    assert again.returncode == 0, again.stderr[-3000:]
    for name in ("results.csv", "runs.csv"):
        assert (output / name).read_bytes() == (reference / name).read_bytes(), name


def test_embed_on_a_full_disk_stops_with_one_line_not_sigbus(small_disk: SmallDisk, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    trained = run_in_process(["train", GLYPHS_CONFIG, *TINY, "training.epochs=1", "-o", str(run_dir), "-q"], capsys)
    assert trained.returncode == 0, trained.stderr
    target = small_disk.path / "emb"
    small_disk.fill(leave=20_000)  # the embeddings of the test split need more
    result = dmlbench("embed", str(run_dir), "--data", "glyphs", "-o", str(target), "-q")
    assert_disk_full_line(result, small_disk.path)
    small_disk.free()
    again = run_in_process(["embed", str(run_dir), "--data", "glyphs", "-o", str(target), "-q"], capsys)
    assert again.returncode == 0, again.stderr
    rows = np.load(str(target) + ".npy")
    assert rows.ndim == 2 and np.isfinite(rows).all()
