"""Stop signals: SIGINT and SIGTERM are never lost, never tear a file, and end a run as ``interrupted``."""

import json
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml

from dmlbench import files
from test_cli_process import GLYPHS_CONFIG, console_script, run
from training_fixtures import TINY

HEADER = 8


def _payload(index: int, size: int) -> bytes:
    return size.to_bytes(HEADER, "little") + bytes([index % 251]) * size


def _whole(path: Path) -> bool:
    data = path.read_bytes()
    size = int.from_bytes(data[:HEADER], "little")
    return len(data) == HEADER + size and len(set(data[HEADER:])) <= 1


@pytest.fixture
def stop_handlers() -> None:
    """The command line's handlers for the test, pytest's own afterwards."""
    restore = files.install_stop_handlers()
    yield
    restore()


@pytest.mark.parametrize("ignored_at_start", [False, True])
def test_a_signal_at_any_moment_of_atomic_writes_is_honoured_and_tears_no_file(
    tmp_path: Path, ignored_at_start: bool
) -> None:
    """Hundreds of signals at random moments around atomic writes (inside them and between them):
    every one raises ``Stopped`` with its signal, and the file is always one whole write."""
    rng = random.Random(1234)
    target = tmp_path / "record.bin"
    files.atomic_write(target, lambda stream: stream.write(_payload(0, 10)))
    previous = {signum: signal.getsignal(signum) for signum in files.STOP_SIGNALS}
    try:
        for trial in range(200):
            if ignored_at_start:
                # A background job of a non-interactive shell starts with SIGINT ignored: the
                # command line's handlers still take it (the cause of the lost Ctrl-C of CI).
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            restore = files.install_stop_handlers()
            signum = rng.choice(files.STOP_SIGNALS)
            timer = threading.Timer(rng.uniform(0.0, 0.004), os.kill, (os.getpid(), signum))
            written = 0
            with pytest.raises(files.Stopped) as stopped:
                timer.start()
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    written += 1
                    payload = _payload(written, rng.randint(1, 300_000))
                    files.atomic_write(target, lambda stream: stream.write(payload))
            timer.join()
            restore()
            assert stopped.value.signum == signum, f"trial {trial}: {stopped.value.signum} != {signum}"
            assert _whole(target), f"trial {trial}: torn file after {written} writes"
            assert not list(tmp_path.glob(".record.bin.*.tmp")), f"trial {trial}: temporary file left"
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def test_a_second_signal_during_the_clean_up_of_the_first_is_ignored(tmp_path: Path, stop_handlers: None) -> None:
    with pytest.raises(files.Stopped):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
    # The clean-up (here: a write) runs undisturbed by the scheduler's second signal.
    os.kill(os.getpid(), signal.SIGINT)
    files.atomic_write(tmp_path / "after", lambda stream: stream.write(b"clean-up"))
    time.sleep(0.1)
    assert (tmp_path / "after").read_bytes() == b"clean-up"
    assert files.received_signal() == signal.SIGTERM


def test_a_write_that_finds_the_disk_full_names_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.save turns a failed write into a RuntimeError of its zip writer; on a full disk the
    write layer reports ENOSPC with the path instead."""
    monkeypatch.setattr(files, "FULL_DISK_BYTES", 1 << 62)  # every disk is "full"

    def failing(stream: object) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0")

    with pytest.raises(OSError) as raised:
        files.atomic_write(tmp_path / "checkpoint.pt", failing)
    assert raised.value.errno == 28 and raised.value.filename == str(tmp_path / "checkpoint.pt")
    assert files.storage_error(RuntimeError("wrapped")) is None
    assert not list(tmp_path.iterdir())


def _tiny_train(run_dir: Path, epochs: int) -> list[str]:
    return [console_script(), "train", GLYPHS_CONFIG, *TINY, f"training.epochs={epochs}", "-o", str(run_dir), "-q"]


def _interrupt_after_epoch_one(command: list[str], run_dir: Path, signum: int, ignore_sigint: bool = False) -> str:
    """Start ``command``, send ``signum`` once epoch 1 is logged; the process's stderr."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None,
    )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "training did not reach epoch 1"
        time.sleep(0.2)
    process.send_signal(signum)
    try:
        _, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"{signal.Signals(signum).name} did not stop the run within 120 s")
    assert process.returncode == 128 + signum, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert signal.Signals(signum).name in stderr and f"dmlbench train --resume -o {run_dir}" in stderr
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    return stderr


def test_ctrl_c_is_honoured_when_the_process_starts_with_sigint_ignored(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _interrupt_after_epoch_one(_tiny_train(run_dir, 100_000), run_dir, signal.SIGINT, ignore_sigint=True)


def test_sigterm_marks_the_run_interrupted_exits_143_and_resumes_to_the_same_end(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _interrupt_after_epoch_one(_tiny_train(run_dir, 100_000), run_dir, signal.SIGTERM)
    # Resume to one epoch past the last checkpoint, and train the same number of epochs uninterrupted.
    last = max(json.loads(line)["epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["training"]["epochs"] = last + 1
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    resumed = run("train", "--resume", "-o", str(run_dir), "-q")
    assert resumed.returncode == 0, resumed.stderr
    reference = tmp_path / "reference"
    straight = subprocess.run(_tiny_train(reference, last + 1), capture_output=True, text=True, timeout=300)
    assert straight.returncode == 0, straight.stderr
    ours, theirs = (torch.load(d / "checkpoint_last.pt", weights_only=False) for d in (run_dir, reference))
    assert ours["epoch"] == theirs["epoch"] == last + 1
    for name in ("model", "loss", "optimizer", "selection"):
        _assert_identical(ours[name], theirs[name], name)


def _assert_identical(ours: object, theirs: object, where: str) -> None:
    """Nested state (dicts, lists, tensors) equal bit for bit."""
    if isinstance(ours, torch.Tensor):
        assert isinstance(theirs, torch.Tensor) and torch.equal(ours, theirs), where
    elif isinstance(ours, dict):
        assert isinstance(theirs, dict) and ours.keys() == theirs.keys(), where
        for key in ours:
            _assert_identical(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(ours, (list, tuple)):
        assert isinstance(theirs, (list, tuple)) and len(ours) == len(theirs), where
        for index, (a, b) in enumerate(zip(ours, theirs)):
            _assert_identical(a, b, f"{where}[{index}]")
    else:
        assert ours == theirs, where


def test_sigterm_to_a_jobs_benchmark_stops_every_worker_and_the_printed_command_finishes_it(tmp_path: Path) -> None:
    """Kubernetes signals the main process only: it passes the stop on to its --jobs workers."""
    smoke = str(Path(GLYPHS_CONFIG).parent / "smoke.yaml")
    reference = tmp_path / "reference"
    assert run("benchmark", smoke, "-o", str(reference), "-q").returncode == 0
    environment = json.loads((reference / "benchmark.json").read_text())["environment"]
    assert environment["torch_build"]["version"] == torch.__version__ and environment["cpu_capability"]
    output = tmp_path / "bench"
    process = subprocess.Popen([console_script(), "benchmark", smoke, "-o", str(output), "-q", "--jobs", "2"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(output.glob("*/trial_*/fold_*/metrics.jsonl")):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no training run started"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr and "interrupted (SIGTERM)" in stderr, stderr
    assert not (output / "report.md").exists()
    command = stderr.strip().splitlines()[-1].split("continue it with: ", 1)[1]
    assert command.startswith("dmlbench benchmark") and f"-o {output}" in command and "--jobs 2" in command
    again = subprocess.run([console_script(), *command.split()[1:]], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    for name in ("results.csv", "runs.csv"):
        assert (output / name).read_bytes() == (reference / name).read_bytes(), name


def test_sigterm_stops_embed_which_the_same_command_then_finishes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert run("train", GLYPHS_CONFIG, *TINY, "training.epochs=1", "-o", str(run_dir), "-q").returncode == 0
    target = tmp_path / "emb"
    command = [console_script(), "embed", str(run_dir), "--data", "glyphs", "-o", str(target), "-q", "--batch-size", "16"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    progress = Path(str(target) + ".progress.json")
    deadline = time.monotonic() + 120
    while not (progress.exists() and json.loads(progress.read_text() or "{}").get("rows_done", 0) > 0):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143 and "interrupted (SIGTERM)" in stderr and "Traceback" not in stderr, stderr
    assert not Path(str(target) + ".npy").exists()
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    straight = tmp_path / "straight"
    assert run("embed", str(run_dir), "--data", "glyphs", "-o", str(straight), "-q", "--batch-size", "16").returncode == 0
    assert Path(str(target) + ".npy").read_bytes() == Path(str(straight) + ".npy").read_bytes()
