"""``dmlbench data check NAME --root PATH [--json FILE]`` on replicas, with planted defects."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import replicas
from cli_runner import run_cli


def truncate(path: Path) -> None:
    content = path.read_bytes()
    path.write_bytes(content[: len(content) // 2])


def test_folder_report_with_planted_defects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = replicas.folder(tmp_path, classes=4, per_class=3)
    shutil.copy(root / "class_0" / "0.png", root / "class_3" / "copy.png")  # a duplicate file across classes
    replicas.write_image(root / "class_1" / "broken.jpg", 7)
    truncate(root / "class_1" / "broken.jpg")
    (root / "class_2" / "empty.png").write_bytes(b"")
    (root / "lonely").mkdir()
    replicas.write_image(root / "lonely" / "x.png", 8)
    report = tmp_path / "report.json"
    code, out, err = run_cli(["data", "check", "folder", "--root", str(root), "--json", str(report)], capsys)
    assert code == 1, err  # problems found: exit 1, so that a script or CI can gate on the check
    summary = json.loads(report.read_text())
    assert (summary["classes"], summary["images"]) == (5, 16)
    assert summary["singleton_classes"] == 1
    assert summary["images_per_class"] == {"min": 1, "median": 4.0, "max": 4}
    assert summary["unreadable"] == {"count": 2, "files": ["class_1/broken.jpg", "class_2/empty.png"]}
    assert summary["duplicate_files"]["groups"] == 1
    assert sorted(summary["duplicate_files"]["examples"][0]) == ["class_0/0.png", "class_3/copy.png"]
    # No declared split: the first 3 of 5 sorted classes train.
    assert summary["train"] == {"classes": 3, "images": 11} and summary["test"] == {"classes": 2, "images": 5}
    assert summary["train_test_class_overlap"] == 0
    assert "2 unreadable images" in out and "PROBLEMS" in out
    assert "class_0/0.png = class_3/copy.png" in out  # the identical files named without --json


@pytest.mark.parametrize(("name", "splits"), [
    ("inshop", {"train": {"classes": 2, "images": 4}, "query": {"classes": 2, "images": 3}, "gallery": {"classes": 3, "images": 4}}),
    ("sop", {"train": {"classes": 3, "images": 6}, "test": {"classes": 2, "images": 4}}),
    ("cars196", {"train": {"classes": 2, "images": 6}, "test": {"classes": 2, "images": 6}}),
])
def test_json_has_an_object_per_split(name: str, splits: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = replicas.BUILDERS[name](tmp_path)
    code, out, err = run_cli(["data", "check", name, "--root", str(root), "--json", "-"], capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert {key: summary[key] for key in splits} == splits
    assert summary["unreadable"]["count"] == 0 and summary["duplicate_files"]["groups"] == 0
    if name == "inshop":
        assert summary["queries_without_gallery_class"] == 0


@pytest.mark.parametrize(("argv", "message"), [
    (["data", "check", "cub200"], "give --root PATH"),
    (["data", "check", "glyphs", "--root", "{tmp}"], "--root is for the datasets read from files (cars196, csv, cub200, emoji, folder, inshop, sop), not 'glyphs'"),
    (["data", "check", "glyphs", "--root", "{tmp}/absent"], "absent does not exist"),
    (["data", "check", "cub200", "--root", "{tmp}"], "has no images.txt (it should hold lines '<image_id> <path under images/>')"),
    (["data", "check", "csv", "--root", "{tmp}/bad.csv"], "role must be query or gallery, got 'probe'"),
    (["data", "check", "folder", "--root", "{tmp}", "--json", "{tmp}/absent/x.json"], "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.csv").write_text("path,label,role\na.png,1,probe\n")
    code, out, err = run_cli([part.replace("{tmp}", str(tmp_path)) for part in argv], capsys)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_truncated_jpeg_in_training_batch_is_a_clear_error(tmp_path: Path) -> None:
    from dmlbench import data
    from dmlbench.errors import UserInputError

    root = replicas.cub200(tmp_path)
    truncate(root / "images" / "001.Bird_1" / "Bird_1_0.jpg")
    dataset = data.build("cub200", root=str(root), image_size=16)
    assert dataset.find_unreadable() == [0]
    with pytest.raises(UserInputError, match="unreadable image .*Bird_1_0.jpg"):
        dataset.batch([0, 1])


def test_images_much_smaller_than_image_size_are_warned_about_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = replicas.folder(tmp_path, classes=4, per_class=3)  # 40 x 30 pictures
    code, _, err = run_cli(["data", "check", "folder", "--root", str(root)], capsys)
    assert code == 0, err
    assert "images are about 30 px but data.image_size is 224" in err and "set data.image_size=30" in err
    code, _, err = run_cli(["data", "check", "folder", "--root", str(root)], capsys)
    assert "warning" not in err  # once per process: a benchmark loads the dataset for every run
    code, _, err = run_cli(["data", "check", "folder", "--root", str(root), "image_size=32"], capsys)
    assert code == 0 and "warning" not in err, err


def test_a_folder_linked_into_the_root_and_image_links_to_nowhere_are_named(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A class folder that links back to the root once became a class duplicating every image; image links that
    loop or lead nowhere were skipped without a word. Now the link is not followed and both are named."""
    root = replicas.folder(tmp_path, classes=4, per_class=3)
    (root / "zz_everything").symlink_to(root, target_is_directory=True)
    (root / "class_0" / "loop.png").symlink_to(root / "class_0" / "loop.png")
    (root / "class_1" / "gone.png").symlink_to(root / "class_1" / "missing.png")
    report = tmp_path / "report.json"
    code, out, err = run_cli(["data", "check", "folder", "--root", str(root), "--json", str(report)], capsys)
    assert code == 1, err
    summary = json.loads(report.read_text())
    assert (summary["classes"], summary["images"]) == (4, 14)
    assert summary["skipped_links"] == ["zz_everything"]
    assert summary["unreadable"]["files"] == ["class_0/loop.png", "class_1/gone.png"]
    assert "1 linked folder(s) not followed (they show images the root lists already)" in summary["problems"]
    assert "links          1 folder(s) link inside the root, not followed: zz_everything" in out


def test_a_class_folder_linked_from_outside_the_root_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Images kept on another disk and linked in as a class are a dataset's own: followed, not named."""
    root = replicas.folder(tmp_path / "data", classes=2, per_class=3)
    elsewhere = replicas.folder(tmp_path / "other", classes=1, per_class=3)
    (root / "class_9").symlink_to(elsewhere / "class_0", target_is_directory=True)
    code, out, err = run_cli(["data", "check", "folder", "--root", str(root), "--json", "-"], capsys)
    summary = json.loads(out)
    assert (summary["classes"], summary["images"], summary["skipped_links"]) == (3, 9, [])
