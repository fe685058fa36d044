"""Damaged files a user hands a command: a truncated checkpoint, a damaged index folder, a file name
that is not UTF-8. Each is one line on stderr naming the file and what to do, exit 2, and nothing
written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import replicas
from cli_runner import cli_exit_code, run_cli
from dmlbench import config as config_module
from dmlbench.training import train
from training_fixtures import TINY

REPO = Path(__file__).resolve().parents[1]


def truncate(path: Path) -> None:
    content = path.read_bytes()
    path.write_bytes(content[: len(content) // 2])


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*")) if path.is_file()}


def assert_one_line(code: int, err: str, *names: str) -> None:
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for name in names:
        assert name in err, err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("damaged") / "run"
    config = config_module.load(REPO / "configs" / "glyphs.yaml", [*TINY, "training.epochs=1", "training.max_steps_per_epoch=2"])
    train(config, directory, progress=False)
    return directory


@pytest.fixture
def damaged_best(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    truncate(copy / "checkpoint_best.pt")
    return copy


@pytest.mark.parametrize("argv", [
    ["evaluate", "{run}", "--json", "{out}/r.json"],
    ["calibrate", "{run}", "--fmr", "1e-2", "-o", "{out}/c.json", "--replicates", "10"],
    ["embed", "{run}", "--data", "glyphs", "-o", "{out}/e", "-q"],
    ["export", "{run}", "--format", "torchscript", "-o", "{out}/m.pt"],
])
def test_a_truncated_best_checkpoint_is_one_line(
    argv: list[str], damaged_best: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(damaged_best)
    code, _, err = run_cli([part.format(run=damaged_best, out=out) for part in argv], capsys)
    assert_one_line(code, err, str(damaged_best / "checkpoint_best.pt"), "train the run again")
    assert snapshot(damaged_best) == before and not any(out.iterdir())


def test_a_truncated_last_checkpoint_on_resume_is_one_line(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    record = json.loads((copy / "run.json").read_text())
    (copy / "run.json").write_text(json.dumps({**record, "status": "interrupted"}))  # as a stopped run leaves it
    truncate(copy / "checkpoint_last.pt")
    before = snapshot(copy)
    code, _, err = run_cli(["train", "--resume", "--output", str(copy), "-q"], capsys)
    assert_one_line(code, err, str(copy / "checkpoint_last.pt"), "copy checkpoint_best.pt over it")
    assert {name: data for name, data in snapshot(copy).items() if name != "train.lock"} == before


@pytest.mark.parametrize("argv", [["train", "--resume", "--output", "{run}", "-q"], ["evaluate", "{run}"]])
def test_a_truncated_run_record_is_one_line(argv: list[str], run_dir: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """run.json cut short once stopped ``train --resume`` (and a benchmark's unit) with a JSONDecodeError traceback."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    truncate(copy / "run.json")
    before = snapshot(copy)
    code, _, err = run_cli([part.format(run=copy) for part in argv], capsys)
    assert_one_line(code, err, str(copy / "run.json"), "is damaged", f"delete {copy} to train the run again")
    assert {name: data for name, data in snapshot(copy).items() if name != "train.lock"} == before


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("index")
    rows = np.random.default_rng(0).standard_normal((30, 8)).astype(np.float32)
    np.save(root / "rows.npy", rows)
    assert cli_exit_code(["index", str(root / "rows.npy"), "-o", str(root / "idx")]) == 0
    np.save(root / "q.npy", rows[:2])
    return root


@pytest.mark.parametrize(("name", "damage"), [
    ("index.json", lambda path: path.write_text("{not json")),
    ("calibration.json", lambda path: path.write_text("[1, 2")),
    ("calibration.json", lambda path: path.write_text("{}")),
    ("index.faiss", truncate),
])
def test_a_damaged_index_folder_is_one_line(
    name: str, damage, index_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "idx"
    shutil.copytree(index_dir / "idx", copy)
    damage(copy / name)
    before = snapshot(copy)
    code, _, err = run_cli(["query", str(copy), "--embeddings", str(index_dir / "q.npy"), "-k", "2",
                            "--json", str(tmp_path / "a.json")], capsys)
    assert_one_line(code, err, str(copy / name), "rebuild the index")
    assert snapshot(copy) == before and not (tmp_path / "a.json").exists()


def _folder_with_a_latin1_name(tmp_path: Path) -> tuple[Path, str]:
    root = replicas.folder(tmp_path, classes=4, per_class=3)
    name = os.fsdecode(b"caf\xe9.png")  # Latin-1 bytes: not UTF-8, kept by Python as a surrogate
    shutil.copy(root / "class_1" / "0.png", root / "class_1" / name)
    return root, repr(os.fsencode(root / "class_1" / name))


def test_a_file_name_that_is_not_utf8_is_named_by_data_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, shown = _folder_with_a_latin1_name(tmp_path)
    code, _, err = run_cli(["data", "check", "folder", "--root", str(root)], capsys)
    assert_one_line(code, err, shown, "not UTF-8", "rename it")


def test_a_file_name_that_is_not_utf8_is_named_by_train(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, shown = _folder_with_a_latin1_name(tmp_path)
    code, _, err = run_cli(["train", str(REPO / "configs" / "glyphs.yaml"), *TINY, "data.name=folder", f"data.root={root}",
                            "data.options={}", "data.image_size=16", "--output", str(tmp_path / "run"), "-q"], capsys)
    assert_one_line(code, err, shown, "not UTF-8")
    assert not (tmp_path / "run").exists()


def test_a_file_name_that_is_not_utf8_is_named_by_embed_images(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, shown = _folder_with_a_latin1_name(tmp_path)
    code, _, err = run_cli(["embed", str(run_dir), "--images", str(root), "-o", str(tmp_path / "e"), "-q"], capsys)
    assert_one_line(code, err, shown, "not UTF-8")
    assert not list(tmp_path.glob("e*"))


def test_a_file_formats_setting_given_in_data_options_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # data.options={image_size: 16} is how glyphs takes its size; a folder dataset's is data.image_size.
    root = replicas.folder(tmp_path, classes=4, per_class=3)
    code, _, err = run_cli(["train", str(REPO / "configs" / "glyphs.yaml"), *TINY, "data.name=folder", f"data.root={root}",
                            "data.options={image_size: 16}", "--output", str(tmp_path / "run"), "-q"], capsys)
    assert_one_line(code, err, "data.options.image_size is data.image_size", "set data.image_size=")
