"""The on-disk cache of generated datasets: ``.npz`` files written atomically, never trusted blindly."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from dmlbench.errors import UserInputError
from dmlbench.files import atomic_write

CACHE_ENVIRONMENT_VARIABLE = "DMLBENCH_CACHE"


def cache_directory(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``cache_dir`` if given, else ``$DMLBENCH_CACHE``, else ``~/.cache/dmlbench``."""
    if cache_dir is not None:
        if not isinstance(cache_dir, (str, os.PathLike)) or not str(cache_dir):
            raise UserInputError(f"cache_dir must be a directory path, got {cache_dir!r}")
        return Path(cache_dir).expanduser()
    from_environment = os.environ.get(CACHE_ENVIRONMENT_VARIABLE)
    if from_environment:
        return Path(from_environment).expanduser()
    return Path.home() / ".cache" / "dmlbench"


def parameters_key(parameters: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of ``parameters`` (key order does not matter)."""
    return hashlib.sha256(json.dumps(parameters, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def load_arrays(path: Path, required: dict[str, str]) -> dict[str, np.ndarray] | None:
    """The arrays stored at ``path``, or ``None`` if it is missing, unreadable or lacks one of ``required``.

    ``required`` maps each array name to its numpy dtype kind (``'u'``, ``'i'``, ``'U'``, ...). A
    truncated or corrupted file reads as ``None`` so that the caller regenerates it.
    """
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
        return None
    for name, kind in required.items():
        if name not in arrays or arrays[name].dtype.kind != kind:
            return None
    return arrays


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` through a temporary file in the same directory and an atomic rename.

    A reader never sees a half-written file; a crash leaves at most a stray temporary file.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserInputError(f"cannot write to cache directory {path.parent}: {error.strerror or error}") from None
    try:
        atomic_write(path, lambda stream: np.savez(stream, **arrays))
    except OSError as error:
        raise UserInputError(f"cannot write cache file {path}: {error.strerror or error}") from None
