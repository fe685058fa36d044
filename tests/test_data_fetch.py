"""``dmlbench data fetch cub200|cars196|sop|inshop`` against a server on 127.0.0.1 serving replica
archives: the reader opens what it unpacked, and every failure (wrong sum, truncated or corrupt archive,
a dropped connection, a full disk, Ctrl-C and SIGTERM, offline) is one line, leaves nothing where the
reader looks, and the same command then finishes the job."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from cli_runner import run_cli
from fetch_server import Served, official_files, server, write_sums  # noqa: F401  (server: a fixture)
from test_cli_process import console_script
from test_full_disk import SmallDisk

from dmlbench import data as data_module
from dmlbench.data.fetch import DOWNLOADS, RECORD, SUMS_VARIABLE
from dmlbench.data.sources import SOURCES


def _prepare(server: Served, tmp_path: Path, dataset: str = "cub200", kind: str = "sha256") -> dict[str, bytes]:
    files = official_files(dataset, tmp_path / "replica")
    server.files.update(files)
    os.environ[SUMS_VARIABLE] = str(write_sums(tmp_path / "sums.json", files, kind))
    return files


@pytest.fixture(autouse=True)
def _no_sums_left(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SUMS_VARIABLE, "")  # and restores it, whatever _prepare sets
    monkeypatch.delenv("DMLBENCH_MIRROR", raising=False)
    monkeypatch.delenv("DMLBENCH_OFFLINE", raising=False)


def _fetch(server: Served, root: Path, capsys: pytest.CaptureFixture[str], dataset: str = "cub200",
           *extra: str) -> tuple[int, str, str]:
    return run_cli(["data", "fetch", dataset, "--root", str(root), "--mirror", server.url, "-q", *extra], capsys)


def _one_line(code: int, err: str, expected_code: int, words: str) -> None:
    assert code == expected_code, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert words in err, err


def _nothing_unpacked(root: Path, dataset: str = "cub200") -> None:
    assert not (root / SOURCES[dataset].folder).exists()
    assert not list(root.glob(".dmlbench-unpacking-*"))


def test_fetch_cub200_from_a_mirror_unpacks_what_the_reader_opens_and_data_check_passes(
        server: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _prepare(server, tmp_path)
    root = tmp_path / "data"
    code, out, err = _fetch(server, root, capsys)
    assert code == 0, err
    folder = root / "CUB_200_2011"
    # The replica's 30-px images at the default size: one warning, for the folder data.root names (it was printed
    # twice, once naming the staging folder the fetch checks before moving it into place).
    assert [line for line in err.splitlines() if "images are about" in line] == [
        f"dmlbench: warning: dataset 'cub200' at {folder}: images are about 30 px but data.image_size is 224, so each "
        "is upscaled 7.5x and training costs about 56x more; set data.image_size=30"]
    assert "warning: checking against the sums in" in out  # the test's sums never pass silently
    assert "cite: C. Wah" in out and "terms:" in out and "content hash" in out.lower()
    dataset = data_module.build("cub200", root=str(folder))
    assert len(dataset) == 12
    record = json.loads((folder / RECORD).read_text())
    assert record["files"][0]["checked"] == "pinned sha256" and record["citation"].startswith("C. Wah")
    assert not (root / DOWNLOADS / "CUB_200_2011.tgz").exists()  # the archive is deleted once unpacked
    assert run_cli(["data", "check", "cub200", "--root", str(folder)], capsys)[0] == 0
    asked = len(server.requests)
    code, out, _ = _fetch(server, root, capsys)
    assert code == 0 and "already fetched" in out and len(server.requests) == asked


@pytest.mark.parametrize("dataset, kind", [("cars196", "md5"), ("sop", "sha256"), ("inshop", "none")])
def test_fetch_through_dmlbench_mirror_unpacks_every_layout_its_reader_opens(
        dataset: str, kind: str, server: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    files = _prepare(server, tmp_path, dataset, kind)
    monkeypatch.setenv("DMLBENCH_MIRROR", server.url)
    root = tmp_path / "data"
    code, out, err = run_cli(["data", "fetch", dataset, "--root", str(root), "-q"], capsys)
    assert code == 0, err
    folder = root / SOURCES[dataset].folder
    assert len(data_module.build(dataset, root=str(folder))) > 0
    checked = [entry["checked"] for entry in json.loads((folder / RECORD).read_text())["files"]]
    if kind == "sha256":
        assert checked == ["pinned sha256"]
    else:  # no sha256 published: recorded on first use, said so, and checked on the next download
        assert all("recorded on first use" in entry for entry in checked) and "trust on first use" in out
        first = sorted(files)[0]
        assert (root / DOWNLOADS / f"{first}.sha256").is_file()


def test_a_sum_other_than_the_pinned_one_is_one_line_and_the_same_command_then_finishes(
        server: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = _prepare(server, tmp_path)
    Path(os.environ[SUMS_VARIABLE]).write_text(json.dumps({"CUB_200_2011.tgz": {"sha256": "0" * 64}}))
    root = tmp_path / "data"
    code, _, err = _fetch(server, root, capsys)
    _one_line(code, err, 2, "not the pinned " + "0" * 64)
    _nothing_unpacked(root)
    assert not list((root / DOWNLOADS).iterdir())  # the wrong bytes are deleted, not kept for a resume
    write_sums(Path(os.environ[SUMS_VARIABLE]), files)
    assert _fetch(server, root, capsys)[0] == 0


def test_a_truncated_archive_fails_its_sum_and_a_whole_one_is_then_fetched(
        server: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = _prepare(server, tmp_path)
    server.files["CUB_200_2011.tgz"] = files["CUB_200_2011.tgz"][:-500]  # a short file, served as complete
    root = tmp_path / "data"
    code, _, err = _fetch(server, root, capsys)
    _one_line(code, err, 2, "truncated or altered")
    _nothing_unpacked(root)
    server.files.update(files)
    assert _fetch(server, root, capsys)[0] == 0


def test_a_corrupt_archive_is_one_line_leaves_nothing_and_is_fetched_again(
        server: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = _prepare(server, tmp_path, kind="none")  # trusted on first use: only the unpack can tell
    archive = bytearray(files["CUB_200_2011.tgz"])
    archive[len(archive) // 2:len(archive) // 2 + 64] = b"\xff" * 64
    server.files["CUB_200_2011.tgz"] = bytes(archive)
    root = tmp_path / "data"
    code, _, err = _fetch(server, root, capsys)
    _one_line(code, err, 2, "CUB_200_2011.tgz is not a readable archive")
    _nothing_unpacked(root)
    assert not list((root / DOWNLOADS).iterdir())  # neither the archive nor the sum trusted for it stays
    server.files.update(files)
    assert _fetch(server, root, capsys)[0] == 0


@pytest.mark.parametrize("ranges", [True, False])
def test_a_connection_dropped_mid_download_is_resumed_or_restarted_by_the_same_command(
        ranges: bool, server: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = _prepare(server, tmp_path)
    server.ranges = ranges
    half = len(files["CUB_200_2011.tgz"]) // 2
    server.drop_after["CUB_200_2011.tgz"] = half
    root = tmp_path / "data"
    code, _, err = _fetch(server, root, capsys)
    _one_line(code, err, 2, "broke after")
    _nothing_unpacked(root)
    assert (root / DOWNLOADS / "CUB_200_2011.tgz.part").stat().st_size == half
    code, _, err = _fetch(server, root, capsys)
    assert code == 0, err
    assert server.requests[-1] == ("CUB_200_2011.tgz", f"bytes={half}-")
    assert len(data_module.build("cub200", root=str(root / "CUB_200_2011"))) == 12


def test_offline_names_the_file_to_place_by_hand_and_uses_it_once_placed(
        server: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = _prepare(server, tmp_path)
    root = tmp_path / "data"
    code, _, err = run_cli(["--offline", "data", "fetch", "cub200", "--root", str(root), "-q"], capsys)
    expected = root / DOWNLOADS / "CUB_200_2011.tgz"
    _one_line(code, err, 2, f"offline: {expected} is missing")
    assert "data.caltech.edu" in err and not server.requests
    expected.write_bytes(files["CUB_200_2011.tgz"])
    code, _, err = run_cli(["data", "fetch", "cub200", "--root", str(root), "-q", "--offline"], capsys)
    assert code == 0, err
    assert not server.requests and "DMLBENCH_OFFLINE" not in os.environ  # the flag ends with the command


def test_a_folder_as_mirror_is_a_local_copy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = official_files("cub200", tmp_path / "replica")
    copy = tmp_path / "copy"
    copy.mkdir()
    for name, data in files.items():
        (copy / name).write_bytes(data)
    os.environ[SUMS_VARIABLE] = str(write_sums(tmp_path / "sums.json", files))
    code, _, err = run_cli(["data", "fetch", "cub200", "--root", str(tmp_path / "data"), "--mirror", str(copy), "-q"], capsys)
    assert code == 0, err


def _fetch_process(server: Served, root: Path) -> list[str]:
    return [console_script(), "data", "fetch", "cub200", "--root", str(root), "--mirror", server.url, "-q"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_mid_download_exits_130_or_143_and_the_same_command_finishes(
        signum: int, server: Served, tmp_path: Path) -> None:
    _prepare(server, tmp_path)
    server.pause = 0.5  # a slow body: the signal arrives while bytes are still coming
    root = tmp_path / "data"
    process = subprocess.Popen(_fetch_process(server, root), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    part = root / DOWNLOADS / "CUB_200_2011.tgz.part"
    deadline = time.monotonic() + 120
    while not (part.is_file() and part.stat().st_size > 0):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the download did not start"
        time.sleep(0.1)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    _one_line(process.returncode, stderr, 128 + signum, signal.Signals(signum).name)
    _nothing_unpacked(root)
    server.pause = 0.0
    finished = subprocess.run(_fetch_process(server, root), capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    assert any(asked for name, asked in server.requests[1:])  # the second run resumed the part


def test_a_full_disk_is_one_line_and_the_same_command_finishes_once_there_is_space(
        server: Served, tmp_path: Path) -> None:
    files = _prepare(server, tmp_path)
    disk = SmallDisk(8 << 20)
    try:
        root = disk.path / "data"
        disk.fill(leave=len(files["CUB_200_2011.tgz"]) // 2)
        failed = subprocess.run(_fetch_process(server, root), capture_output=True, text=True, timeout=300)
        _one_line(failed.returncode, failed.stderr, 1, "No space left on device")
        assert str(root) in failed.stderr
        _nothing_unpacked(root)
        disk.free()
        finished = subprocess.run(_fetch_process(server, root), capture_output=True, text=True, timeout=300)
        assert finished.returncode == 0, finished.stderr
        assert len(data_module.build("cub200", root=str(root / "CUB_200_2011"))) == 12
    finally:
        disk.unmount()


@pytest.mark.parametrize(("mirror", "message"), [
    ("http://", "mirror http:// names no host: give it as http://HOST[:PORT]/PATH"),
    ("ftp://files.example/data", "mirror ftp://files.example/data must be an http://, https:// or file:// address, or a folder"),
])
def test_a_mirror_that_cannot_be_one_is_named_before_any_download(mirror: str, message: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`--mirror http://` once failed the download and said to run the same command again, which could not help."""
    code, _, err = run_cli(["data", "fetch", "cub200", "--root", str(tmp_path), "--mirror", mirror], capsys)
    assert (code, err) == (2, f"dmlbench: error: {message}\n")


def test_cars196_that_cannot_be_downloaded_says_where_a_copy_goes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Cars196's original host is gone: the failed download's line says how to place a copy of the original files."""
    with socket.socket() as closed:  # a port on this machine that nothing listens on once closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    code, _, err = run_cli(["data", "fetch", "cars196", "--root", str(tmp_path), "--mirror", f"http://127.0.0.1:{port}", "-q"],
                           capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "Cars196's original host is gone" in err and "--mirror FOLDER" in err and "md5" in err
