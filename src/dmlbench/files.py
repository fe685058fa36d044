"""Files: written so that a crash, a stop signal or a full disk never leaves one half-written (run
records, checkpoints, caches, results); the stop signals themselves; ``.npy`` arrays read with
one-line errors."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import signal
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from dmlbench.errors import UserInputError

if TYPE_CHECKING:
    import numpy as np


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a temporary file beside ``path``, sync it, then rename it over ``path``.

    A reader sees the old file or the complete new one; on any error the temporary file is removed.
    A stop signal (Ctrl-C, SIGTERM) during the write is delivered once the file is in place: arriving
    inside ``torch.save`` it would otherwise surface as an unrelated error of its zip writer. A write
    that fails because the disk is full raises ``OSError(ENOSPC)`` naming ``path``, whatever the
    writer made of it.
    """
    with signals_deferred():
        _write_and_replace(path, write)


def atomic_write_text(path: Path, text: str) -> None:
    """``text`` as UTF-8, written atomically."""
    data = text.encode()
    atomic_write(path, lambda stream: stream.write(data))


def write_json(path: Path, payload: Any) -> None:
    """``payload`` as indented JSON, written atomically."""
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=False) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def ends_inside_a_line(path: Path) -> bool:
    """Whether a file of one record per line ends without its newline: an append cut short (a killed
    process, a full disk), which the next append would join. ``False`` for a missing or empty file."""
    try:
        with open(path, "rb") as stream:
            if stream.seek(0, os.SEEK_END) == 0:
                return False
            stream.seek(-1, os.SEEK_END)
            return stream.read(1) != b"\n"
    except FileNotFoundError:
        return False


def atomic_torch_save(path: Path, payload: Any) -> None:
    """``torch.save`` of ``payload``, written atomically."""
    import torch

    atomic_write(path, lambda stream: torch.save(payload, stream))


def load_checkpoint(path: Path, remedy: str, *, map_location: Any = "cpu", weights_only: bool = False) -> Any:
    """``torch.load`` of a checkpoint, or one line naming the file and ``remedy`` (what to do) when it
    is damaged. A checkpoint cut short (a copy interrupted, a disk that filled before atomic writes)
    makes torch raise a zip-reader ``RuntimeError``, an ``EOFError`` or a pickle error with a
    traceback that names neither the file nor a way out."""
    import torch

    try:
        return torch.load(path, map_location=map_location, weights_only=weights_only)
    except (RuntimeError, EOFError, pickle.UnpicklingError) as error:
        # Other RuntimeErrors (a CUDA checkpoint on a machine without CUDA) are not damage.
        if isinstance(error, RuntimeError) and "PytorchStreamReader" not in str(error):
            raise
        reason = str(error).split(". ")[0]
        raise UserInputError(f"checkpoint {path} is damaged or truncated ({reason}); {remedy}") from None


def _write_and_replace(path: Path, write: Callable[[BinaryIO], None]) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates the file for its owner only; results are files like any other (umask applies).
        os.fchmod(handle, 0o666 & ~_umask())
        with os.fdopen(handle, "wb") as stream:
            try:
                write(stream)
                stream.flush()
            except OSError as error:
                raise OSError(error.errno, error.strerror, str(path)) from None
            except Exception as error:
                # torch.save reports a failed write of its zip writer as a RuntimeError ("unexpected
                # pos", "file write failed"); on a full disk that is ENOSPC.
                if _disk_full(stream.fileno()):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from error
                raise
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _disk_full(descriptor: int) -> bool:
    try:
        status = os.fstatvfs(descriptor)
    except OSError:
        return False
    return status.f_bavail * status.f_frsize < FULL_DISK_BYTES


# Below this many free bytes a failed write is taken for a full disk (a filesystem keeps a few blocks).
FULL_DISK_BYTES = 1 << 20

# Errors of the storage, not of the work: nothing is stored as a failure, the same command re-runs it.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})


def storage_error(error: BaseException) -> OSError | None:
    """The ``OSError`` of a full disk, an exceeded quota or an I/O error behind ``error`` (itself or
    a cause in its chain), or ``None``."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in STORAGE_ERRNOS:
            return current
        if isinstance(current, sqlite3.OperationalError):  # SQLite says so in words, without an errno
            text = str(current)
            if "disk is full" in text:
                return OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (SQLite: {text})")
            if "disk I/O error" in text:
                return OSError(errno.EIO, f"{os.strerror(errno.EIO)} (SQLite: {text})")
        current = current.__cause__ or current.__context__
    return None


def describe(error: OSError) -> str:
    """``reason: path`` of an ``OSError`` (the reason alone when it names no path)."""
    reason = error.strerror or str(error)
    return f"{reason}: {error.filename}" if error.filename else reason


def _umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


class Stopped(KeyboardInterrupt):
    """A stop signal (SIGINT or SIGTERM) arrived; ``signum`` says which. A ``KeyboardInterrupt``, so
    every place that finishes a run on Ctrl-C finishes it on SIGTERM too."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_deferred = 0  # depth of nested signals_deferred blocks (main thread only)
_pending: int | None = None  # a signal that arrived inside such a block
_received: int | None = None  # the first stop signal of this process
_one_stop = False  # a command: after the first signal, later ones are ignored


def _on_signal(signum: int, frame: object) -> None:
    global _pending, _received
    if _received is not None and _one_stop:
        # Already stopping: a second signal (the terminal's SIGINT and a scheduler's SIGTERM, or a
        # signal forwarded to a --jobs worker that got its own) must not break the first's clean-up.
        return
    _received = signum
    if _deferred:
        _pending = signum
        return
    raise Stopped(signum)


def install_stop_handlers() -> Callable[[], None]:
    """Handle SIGINT and SIGTERM in this process as a clean stop, also when the process was started
    with them ignored (a background job of a non-interactive shell inherits SIGINT ignored, and a
    user's ``kill -INT`` would then be lost). Returns a function that restores the previous handlers."""
    global _pending, _received, _one_stop
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    _pending = _received = None
    _one_stop = True
    previous = {signum: signal.signal(signum, _on_signal) for signum in STOP_SIGNALS}

    def restore() -> None:
        global _one_stop
        _one_stop = False
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    return restore


def received_signal() -> int:
    """The stop signal this process received (SIGINT when none did: a ``KeyboardInterrupt`` raised otherwise)."""
    return _received if _received is not None else int(signal.SIGINT)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold a stop signal back until the block ends, then raise ``Stopped`` if one arrived.

    The handler is never swapped (a swap races with a signal in flight); the block only raises a
    counter that the handler reads. Outside the command line (Python's own SIGINT handler in place)
    the first block installs the stop handler for SIGINT, which raises ``KeyboardInterrupt`` like
    Python's own."""
    global _deferred, _pending
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives signals
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_signal)
    _deferred += 1
    try:
        yield
    finally:
        _deferred -= 1
    if not _deferred and _pending is not None:
        signum, _pending = _pending, None
        raise Stopped(signum)


def load_array(path: Path, what: str) -> np.ndarray:
    """A ``.npy`` file (no pickles), or a one-line user error naming ``what`` it should have been."""
    import numpy as np

    if not path.is_file():
        raise UserInputError(f"{what} file {path} does not exist")
    with open(path, "rb") as stream:
        if stream.read(6) != b"\x93NUMPY":
            raise UserInputError(f"{what} file {path} is not a .npy array (no NumPy header)")
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise UserInputError(f"{what} file {path} is not a valid .npy array: {error}") from None


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks (checkpoints and images can be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
