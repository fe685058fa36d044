import os
import stat
from pathlib import Path

import pytest

from dmlbench import files
from dmlbench.files import atomic_write


def test_atomic_write_gives_an_ordinary_file_mode(tmp_path: Path) -> None:
    previous = os.umask(0o027)
    try:
        atomic_write(tmp_path / "result.json", lambda stream: stream.write(b"{}"))
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "result.json").stat().st_mode) == 0o640
    assert (tmp_path / "result.json").read_bytes() == b"{}"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "result.json"
    target.write_bytes(b"old")

    def fail(stream) -> None:
        stream.write(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write(target, fail)
    assert target.read_bytes() == b"old"
    assert [path.name for path in tmp_path.iterdir()] == ["result.json"]


def test_ctrl_c_during_a_write_is_delivered_after_the_file_is_complete(tmp_path: Path) -> None:
    import signal

    target = tmp_path / "checkpoint.pt"
    # Python's own handler, as at a terminal, also when the suite runs as a background job of a
    # non-interactive shell (SIGINT inherited ignored, which signals_deferred rightly leaves alone).
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)

    def interrupted_midway(stream) -> None:
        stream.write(b"first half, ")
        # Ctrl-C while the file is being written. raise_signal, not kill(getpid()): a process-directed
        # signal may be taken by another thread (torch's, after other tests in this process), whose C
        # handler can run only once the write is over on a loaded machine; this one is taken here, now.
        signal.raise_signal(signal.SIGINT)
        stream.write(b"second half")

    try:
        with pytest.raises(KeyboardInterrupt):
            atomic_write(target, interrupted_midway)
        assert target.read_bytes() == b"first half, second half"
        # The first deferred write installs the stop handler for good (swapping it back would race
        # with a signal in flight), so Ctrl-C afterwards still raises KeyboardInterrupt, as Python's
        # own handler does.
        assert signal.getsignal(signal.SIGINT) is files._on_signal
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, inherited)
