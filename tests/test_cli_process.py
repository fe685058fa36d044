"""The ``dmlbench`` command's exit codes and one-line errors. The installed console script runs as a
separate process, as a user runs it, where the process is the subject (usage errors before the
library loads, ``--help``, Ctrl-C); the other commands run in-process, which gives the same exit code
and output without a new interpreter importing torch each time."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from cli_runner import run_in_process
from training_fixtures import TINY

REPO = Path(__file__).resolve().parent.parent
GLYPHS_CONFIG = str(REPO / "configs" / "glyphs.yaml")


def console_script() -> str:
    """The ``dmlbench`` entry point installed beside this interpreter (the one the README installs)."""
    beside = Path(sys.executable).parent / "dmlbench"
    found = str(beside) if beside.is_file() else shutil.which("dmlbench")
    if found is None:
        pytest.fail("the dmlbench console script is not installed: run `python -m pip install -e .`")
    return found


def run(*arguments: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [console_script(), *arguments], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=environment
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, *message: str) -> None:
    """Exit ``code``, no traceback, and exactly one stderr line holding every part of ``message``."""
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    error_lines = [line for line in result.stderr.splitlines() if all(part in line for part in message)]
    assert len(error_lines) == 1, result.stderr


def read_only_directory(tmp_path: Path) -> Path:
    """A directory this process cannot create files in, also as root (which ignores permission bits)."""
    directory = tmp_path / "read-only"
    directory.mkdir()
    directory.chmod(0o555)
    for candidate in (directory, Path("/sys")):
        if candidate.is_dir() and _cannot_create_in(candidate):
            return candidate
    pytest.skip("no directory on this machine refuses writes from this user")


def _cannot_create_in(directory: Path) -> bool:
    try:
        (directory / "dmlbench-probe").mkdir()
    except OSError:
        return True
    (directory / "dmlbench-probe").rmdir()
    return False


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["nosuch"], ("No such command", "nosuch")),
        (["evaluate", "--bogus"], ("No such option", "--bogus")),
        (["train", "--epochs"], ("No such option", "--epochs")),
        (["train", GLYPHS_CONFIG, "--output"], ("--output", "requires an argument")),
        (["data", "check"], ("Missing argument", "DATASET|CONFIG")),
        (["evaluate", "--k", "many"], ("Invalid value for", "--k'")),
    ],
)
def test_usage_errors_print_usage_and_one_error_line(arguments: list[str], message: tuple[str, ...]) -> None:
    """The wording is the CLI library's (it varies a little between releases); the shape is ours."""
    result = run(*arguments)
    assert_one_line_error(result, 2, *message)
    assert result.stderr.startswith("Usage: dmlbench")


def test_help_and_version_answer_without_the_library() -> None:
    result = run("--help")
    assert result.returncode == 0 and "Usage: dmlbench" in result.stdout
    for command in ("train", "evaluate", "benchmark", "data"):
        assert command in result.stdout
    assert "[[" not in result.stdout and "<bool>" not in result.stdout
    version = run("--version")
    from dmlbench import __version__

    assert version.returncode == 0 and version.stdout.strip() == f"dmlbench {__version__}"


def test_building_the_cli_imports_no_heavy_library() -> None:
    """``--help`` and usage errors must not pay for torch (seconds and hundreds of MB)."""
    code = (
        "import sys, dmlbench.cli as cli; cli._register_commands(); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'torch', 'torchvision', 'numpy', 'scipy', 'sklearn', 'matplotlib', 'faiss', 'pydantic'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_diverged_training_exits_1_with_its_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    result = run_in_process(["train", GLYPHS_CONFIG, *TINY, "optimizer.name=sgd", "optimizer.lr=1e30",
                             "-o", str(run_dir), "-q"], capsys)
    assert_one_line_error(result, 1, "training diverged")
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"


def test_a_benchmark_whose_methods_fail_exits_1_naming_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = {
        # A learning rate that makes every loss NaN: each method's trials fail (the batch itself is fine:
        # a batch the sampler cannot fill is refused before training, exit 2).
        "base": {"training": {"epochs": 1, "max_steps_per_epoch": 2, "batch_size": 16},
                 "optimizer": {"name": "sgd", "lr": 1e30}},
        "protocol": {"folds": 2, "trials": 1, "reproductions": 2, "sampler": "tpe"},
        "methods": [
            {"name": "triplet", "overrides": {"loss.name": "triplet", "miner.name": "semihard"}},
            {"name": "contrastive", "overrides": {"loss.name": "contrastive"}},
        ],
    }
    spec_path = tmp_path / "bench.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    tiny = [override for override in TINY if not override.startswith(("training.epochs", "training.batch_size"))]
    result = run_in_process(["benchmark", str(spec_path), *tiny, "-o", str(tmp_path / "out"), "-q"], capsys)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    for name in ("triplet", "contrastive"):
        assert f"method {name} failed" in result.stderr


def test_ctrl_c_exits_130_and_the_run_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    # Far more epochs than a run can finish before the signal: under load the tiny run once completed
    # 50 epochs between the test seeing epoch 1 and sending SIGINT, and exited 0.
    command = [console_script(), "train", GLYPHS_CONFIG, *TINY, "training.epochs=100000", "-o", str(run_dir), "-q"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):  # the untrained model and epoch 1
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "training did not reach epoch 1"
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    try:
        _, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("SIGINT did not stop the run within 120 s")
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "dmlbench train --resume -o" in stderr
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"

    # Finish quickly: shorten the stored run to 2 epochs before resuming it.
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["training"]["epochs"] = 2
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    resumed = run_in_process(["train", "--resume", "-o", str(run_dir), "-q"], capsys)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"


def test_resume_of_a_completed_run_says_so_and_changes_nothing(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    trained = run_in_process(["train", GLYPHS_CONFIG, *TINY, "training.epochs=1", "-o", str(run_dir), "-q"], capsys)
    assert trained.returncode == 0, trained.stderr
    before = {path.name: path.read_bytes() for path in run_dir.iterdir()}
    result = run_in_process(["train", "--resume", "-o", str(run_dir), "-q"], capsys)
    assert result.returncode == 0 and "already complete" in result.stdout
    assert {path.name: path.read_bytes() for path in run_dir.iterdir()} == before


def test_output_paths_that_cannot_be_written_are_one_line_errors(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    existing_file = tmp_path / "file"
    existing_file.write_text("keep me")
    result = run_in_process(["train", GLYPHS_CONFIG, *TINY, "-o", str(existing_file), "-q"], capsys)
    assert_one_line_error(result, 2, str(existing_file))
    assert existing_file.read_text() == "keep me"

    read_only = read_only_directory(tmp_path)
    result = run_in_process(["train", GLYPHS_CONFIG, *TINY, "-o", str(read_only / "run"), "-q"], capsys)
    assert_one_line_error(result, 2, str(read_only / "run"))

    embeddings, labels = tmp_path / "e.npy", tmp_path / "l.npy"
    np.save(embeddings, np.eye(4, dtype=np.float32))
    np.save(labels, np.array([0, 0, 1, 1]))
    result = run_in_process(["evaluate", "--embeddings", str(embeddings), "--labels", str(labels),
                             "--json", str(read_only / "x.json")], capsys)
    assert_one_line_error(result, 2, str(read_only / "x.json"))


def test_a_device_this_machine_lacks_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    result = run_in_process(["train", GLYPHS_CONFIG, *TINY, "training.device=cuda", "-o", str(tmp_path / "run"), "-q"],
                            capsys)
    assert_one_line_error(result, 2, "no CUDA device")
    assert not (tmp_path / "run").exists()


def test_bad_files_are_named_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here\n")
    assert_one_line_error(run_in_process(["train", str(empty), "-o", str(tmp_path / "run")], capsys), 2, "is empty")

    noise = tmp_path / "noise.npy"
    noise.write_bytes(np.random.default_rng(0).bytes(256))
    labels = tmp_path / "l.npy"
    np.save(labels, np.arange(4))
    result = run_in_process(["evaluate", "--embeddings", str(noise), "--labels", str(labels)], capsys)
    assert_one_line_error(result, 2, "is not a .npy array")
    assert "pickled" not in result.stderr


def test_data_check_of_a_config_checks_what_it_trains_on(capsys: pytest.CaptureFixture[str]) -> None:
    by_config = run_in_process(["data", "check", GLYPHS_CONFIG, "data.options.max_classes=24", "--json", "-"], capsys)
    by_name = run_in_process(["data", "check", "glyphs", "max_classes=24", "--json", "-"], capsys)
    assert by_config.returncode == 0 and by_name.returncode == 0, by_config.stderr + by_name.stderr
    checked = json.loads(by_config.stdout)
    assert checked == json.loads(by_name.stdout)  # one source of defaults: the dataset's own

    from dmlbench import config as config_module
    from dmlbench.training.setup import load_dataset

    trained_on = load_dataset(config_module.load(GLYPHS_CONFIG, ["data.options.max_classes=24"]))
    assert checked["content_hash"] == trained_on.content_hash
