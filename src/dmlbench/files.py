"""Files: written so that a crash never leaves one half-written (run records, checkpoints, caches,
results), and ``.npy`` arrays read with one-line errors."""

from __future__ import annotations

import hashlib
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from dmlbench.errors import UserInputError

if TYPE_CHECKING:
    import numpy as np


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a temporary file beside ``path``, sync it, then rename it over ``path``.

    A reader sees the old file or the complete new one; on any error the temporary file is removed.
    A Ctrl-C during the write is delivered once the file is in place: arriving inside ``torch.save``
    it would otherwise surface as an unrelated error of its zip writer.
    """
    with _interrupts_deferred():
        _write_and_replace(path, write)


def _write_and_replace(path: Path, write: Callable[[BinaryIO], None]) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates the file for its owner only; results are files like any other (umask applies).
        os.fchmod(handle, 0o666 & ~_umask())
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


@contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT back until the block ends, then raise ``KeyboardInterrupt`` if one arrived."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is None:
        yield  # only the main thread may handle signals; a handler set outside Python cannot be restored
        return
    received: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt


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
