"""One owner per directory (``dmlbench.ownership``): a training run's and a benchmark's, with real
processes, real signals and ``kill -9``."""

import errno
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from cli_runner import run_cli, run_in_process
from dmlbench import ownership
from dmlbench.errors import UserInputError
from dmlbench.protocol import layout
from dmlbench.training import records
from test_cli_process import GLYPHS_CONFIG, assert_one_line_error, console_script, run
from training_fixtures import TINY

SMOKE = Path(GLYPHS_CONFIG).parent / "smoke.yaml"
# A process that holds a directory until its stdin closes, then lets go as a finished command does.
HOLDER = """
import sys
from pathlib import Path
from dmlbench.ownership import owned
with owned(Path(sys.argv[1]), sys.argv[2], what="directory", shared=sys.argv[3] == "shared"):
    print("held", flush=True)
    sys.stdin.read()
"""


@contextmanager
def held_by_another_process(directory: Path, lock_name: str, *, shared: bool = False) -> Iterator[int]:
    """A separate process holding ``directory``; its pid."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory), lock_name, "shared" if shared else "alone"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "held", process.communicate()
        yield process.pid
    finally:
        process.communicate(timeout=60)
    assert process.returncode == 0


def endless_training(run_dir: Path) -> subprocess.Popen[str]:
    """``dmlbench train`` of a tiny model for more epochs than any test waits for."""
    command = [console_script(), "train", GLYPHS_CONFIG, *TINY, "training.epochs=100000", "-o", str(run_dir), "-q"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, process: subprocess.Popen[str], what: str, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def logged_epochs(run_dir: Path) -> list[int]:
    return [json.loads(line)["epoch"] for line in (run_dir / records.METRICS_FILE).read_text().splitlines()]


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*")) if path.is_file()}


def test_a_second_process_on_a_run_in_training_is_refused_naming_the_owner(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    owner = endless_training(run_dir)
    wait_for(lambda: (run_dir / records.METRICS_FILE).is_file() and len(logged_epochs(run_dir)) >= 2, owner,
             "training did not reach epoch 1")
    # The resume of the issue, and a new run into the same directory, both while the owner trains; this
    # test's process is the second one (the lock is the owner process's, whoever asks).
    for command in (["train", "--resume", "-o", str(run_dir), "-q"],
                    ["train", GLYPHS_CONFIG, *TINY, "-o", str(run_dir), "-q"]):
        assert_one_line_error(run_in_process(command, capsys), 2,
                              f"run directory {run_dir} is in use by pid {owner.pid}@", "kill", "dmlbench train")
    assert owner.poll() is None, "the owner must train on undisturbed"
    owner.send_signal(signal.SIGTERM)
    _, err = owner.communicate(timeout=120)
    assert owner.returncode == 143, err
    assert not (run_dir / records.LOCK_FILE).exists()
    epochs = logged_epochs(run_dir)
    assert epochs == list(range(len(epochs)))  # each epoch once: nobody else wrote metrics.jsonl


def test_a_lock_left_by_a_process_killed_with_sigkill_is_taken_over(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    owner = endless_training(run_dir)
    wait_for(lambda: (run_dir / records.METRICS_FILE).is_file() and len(logged_epochs(run_dir)) >= 2, owner,
             "training did not reach epoch 1")
    owner.send_signal(signal.SIGKILL)
    owner.communicate(timeout=60)
    # The file stays with the dead owner's name; its lock went with the process.
    assert json.loads((run_dir / records.LOCK_FILE).read_text())["pid"] == owner.pid
    last = max(logged_epochs(run_dir))
    config = yaml.safe_load((run_dir / records.CONFIG_FILE).read_text())
    config["training"]["epochs"] = last + 1
    (run_dir / records.CONFIG_FILE).write_text(yaml.safe_dump(config))
    resumed = run_in_process(["train", "--resume", "-o", str(run_dir), "-q"], capsys)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((run_dir / records.RUN_FILE).read_text())["status"] == "completed"
    assert logged_epochs(run_dir) == list(range(last + 2))
    assert not (run_dir / records.LOCK_FILE).exists()


@pytest.mark.slow  # a benchmark started for real: 74 s on a loaded 2-core machine
def test_a_second_benchmark_on_a_sqlite_directory_in_use_is_refused_naming_the_owner(tmp_path: Path) -> None:
    output = tmp_path / "bench"
    # More epochs than the test waits for: the owner is still on its first run when the second starts.
    command = ["benchmark", str(SMOKE), "protocol.epochs=100000", "-o", str(output), "-q"]
    owner = subprocess.Popen([console_script(), *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: bool(list(output.glob("*/trial_*/fold_*/metrics.jsonl"))), owner, "no training run started")
    second = run(*command)
    assert_one_line_error(second, 2, f"benchmark directory {output} is in use by pid {owner.pid}@", "dmlbench benchmark")
    owner.send_signal(signal.SIGTERM)
    _, err = owner.communicate(timeout=120)
    assert owner.returncode == 143, err
    assert not (output / layout.LOCK_FILE).exists() and not list(output.rglob(records.LOCK_FILE))


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_benchmark_and_search_refuse_a_directory_another_process_holds_alone(
        jobs: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One worker (SQLite) or two (a journal, held shared): neither starts beside a single owner."""
    output = tmp_path / "bench"
    with held_by_another_process(output, layout.LOCK_FILE) as owner:
        for command in ("benchmark", "search"):
            code, _, err = run_cli([command, str(SMOKE), "-o", str(output), "-q", *(["--jobs", jobs] if command == "benchmark" else [])], capsys)
            assert code == 2 and len(err.strip().splitlines()) == 1, err
            assert f"benchmark directory {output} is in use by pid {owner}@" in err
        assert sorted(path.name for path in output.iterdir()) == [layout.LOCK_FILE]


def test_workers_of_a_shared_storage_share_a_benchmark_directory_and_exclude_a_single_owner(tmp_path: Path) -> None:
    output = tmp_path / "bench"
    with held_by_another_process(output, layout.LOCK_FILE, shared=True) as worker:
        with ownership.owned(output, layout.LOCK_FILE, what="benchmark directory", shared=True):
            assert (output / layout.LOCK_FILE).exists()
        assert (output / layout.LOCK_FILE).exists()  # the other worker still holds it
        with pytest.raises(ownership.DirectoryInUse, match=f"pid {worker}@"):
            with ownership.owned(output, layout.LOCK_FILE, what="benchmark directory"):
                pass
    assert not output.exists()  # the last holder removed the lock file and the directory it made
    with held_by_another_process(output, layout.LOCK_FILE) as single:
        with pytest.raises(ownership.DirectoryInUse, match=f"pid {single}@"):
            with ownership.owned(output, layout.LOCK_FILE, what="benchmark directory", shared=True):
                pass


def test_a_protocol_run_owned_by_another_worker_is_neither_cleared_nor_trained(tmp_path: Path) -> None:
    """``train_or_resume`` starts a run without ``run.json`` afresh: never while another process trains it."""
    from dmlbench.config import load
    from dmlbench.training import train_or_resume

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / records.CONFIG_FILE).write_text("left by the owner\n")
    with held_by_another_process(run_dir, records.LOCK_FILE) as worker:
        with pytest.raises(ownership.DirectoryInUse, match=f"pid {worker}@"):
            train_or_resume(load(Path(GLYPHS_CONFIG), TINY), run_dir, progress=False)
        assert (run_dir / records.CONFIG_FILE).read_text() == "left by the owner\n"


@pytest.mark.parametrize("state", ["finished", "being started"])
def test_benchmark_into_a_training_run_directory_is_refused_and_changes_nothing(
        state: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "okrun"
    if state == "finished":
        code, _, err = run_cli(["train", GLYPHS_CONFIG, *TINY, "training.epochs=1", "-o", str(run_dir), "-q"], capsys)
        assert code == 0, err
    else:
        run_dir.mkdir()
        (run_dir / records.LOCK_FILE).write_text("")
    before = snapshot(run_dir)
    for command in ("benchmark", "search"):
        code, _, err = run_cli([command, str(SMOKE), "-o", str(run_dir), "-q"], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"output {run_dir} is a training run directory" in err
        assert snapshot(run_dir) == before


def test_a_run_refused_after_its_directory_was_made_leaves_no_directory(tmp_path: Path) -> None:
    from dmlbench import api

    run_dir = tmp_path / "new" / "run"
    with pytest.raises(UserInputError, match="fp16"):
        api.train(GLYPHS_CONFIG, run_dir, [*TINY, "training.precision=fp16", "training.device=cpu"])
    assert not (tmp_path / "new").exists()


def test_a_filesystem_without_locks_is_written_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_locks(descriptor: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(ownership.fcntl, "flock", no_locks)
    monkeypatch.setattr(ownership, "_UNLOCKED_DEVICES", set())
    with pytest.warns(UserWarning, match="no file locks"):
        with ownership.owned(tmp_path / "run", records.LOCK_FILE, what="run directory"):
            assert (tmp_path / "run").is_dir()
    assert not (tmp_path / "run").exists()


def test_the_lock_file_names_the_command_without_a_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/venv/bin/dmlbench", "benchmark", "--storage", "postgresql://ann:s3cret@db/x", "-o", "a b"])
    with ownership.owned(tmp_path, layout.LOCK_FILE, what="benchmark directory", shared=True):
        recorded = json.loads((tmp_path / layout.LOCK_FILE).read_text())
    assert recorded["command"] == "dmlbench benchmark --storage postgresql://ann@db/x -o 'a b'"
    assert not (tmp_path / layout.LOCK_FILE).exists()
