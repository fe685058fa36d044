"""A file storage that a full disk, a killed write or a bad copy damaged: one line naming the file, the
place and what to do, instead of the traceback of Optuna's reader or SQLite.

A journal is a log of operations, one JSON object per line, that Optuna replays from the first line:

* a line that is not a record stops the replay, so nothing after it can be read; only a copy of the
  file mends that (deleting the line would replay the later operations without it);
* a last line without its newline is a write that did not finish. Optuna's reader skips it, but the
  next record appended would join it into one unreadable line in the middle of the log, so the study
  must not be written to before that partial line is cut off (which loses nothing that can be read).

The check of the last line holds Optuna's own file lock, so a record being written by a live worker is
never taken for a cut one.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from dmlbench import files
from dmlbench.errors import UserInputError


def open_journal(path: Path) -> Any:
    """Optuna's ``JournalStorage`` of the file ``path``; a one-line ``UserInputError`` if a line cannot be
    replayed or the last one is cut short."""
    from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock, JournalStorage

    lock = JournalFileSymlinkLock(str(path))  # the lock Optuna's backend takes to append
    try:
        storage = JournalStorage(JournalFileBackend(str(path), lock_obj=lock))
    except ValueError:  # Optuna's reader: a JSONDecodeError, or a line cut short before others
        raise _unreadable_line(path) from None
    _check_last_line(path, lock)
    return storage


def open_sqlite(url: str, path: Path) -> Any:
    """Optuna's ``RDBStorage`` of the SQLite file ``path``; a one-line ``UserInputError`` if it is not a
    readable database (cut short, overwritten), as opposed to a locked or busy one."""
    import optuna
    import sqlalchemy

    try:
        return optuna.storages.RDBStorage(url)
    except sqlalchemy.exc.DatabaseError as error:
        cause = error.orig
        if not isinstance(cause, sqlite3.DatabaseError) or isinstance(cause, sqlite3.OperationalError):
            raise
        raise UserInputError(f"storage {path}: not a readable SQLite database ({cause}); restore the file from a copy") from None


def _unreadable_line(path: Path) -> UserInputError:
    offset = 0
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                json.loads(line)
            except ValueError:  # a JSONDecodeError, or bytes that are not UTF-8
                return UserInputError(
                    f"storage {path}: line {number} (byte {offset}) is not a journal record, so the studies "
                    "cannot be read past it; restore the file from a copy")
            offset += len(line)
    return UserInputError(f"storage {path}: Optuna could not replay it; restore the file from a copy")


def _check_last_line(path: Path, lock: Any) -> None:
    try:
        lock.acquire()
    except (OSError, RuntimeError):
        return  # a reader that cannot take the lock cannot append either: only appending does harm
    try:
        cut = files.ends_inside_a_line(path)
    finally:
        lock.release()
    if not cut:
        return
    whole = path.read_bytes().rfind(b"\n") + 1
    raise UserInputError(
        f"storage {path}: its last line is cut short (a write that did not finish: a full disk or a killed "
        f"process) and nothing may be added after it; cut it off with `truncate -s {whole} {path}` "
        "(the unfinished operation is lost either way) and run the command again")
