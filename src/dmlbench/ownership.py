"""One owner per directory: a training run's directory and a benchmark's output directory are
written by one process at a time (or, for a benchmark on a shared storage, by its workers only).

The owner holds an ``flock`` on a lock file in the directory (its name belongs to the directory's
layout: ``training.records.LOCK_FILE``, ``protocol.layout.LOCK_FILE``). The kernel drops the lock
when the process ends, however it ends (``kill -9`` included), so a lock is never stale: a process
that finds the file without its lock takes the directory over. What the file holds (pid, host,
start time, command line) only names the owner in the refusal. Holders are exclusive (one process)
or shared (the workers of one benchmark on a journal or PostgreSQL storage); the two kinds exclude
each other. The last holder removes the lock file, and the directories it created if they stayed empty.

Network filesystems: Linux NFS clients lock across machines (NFSv4, or NFSv3 with its lock
daemon); a filesystem without locks gets a warning and no protection.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shlex
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dmlbench.errors import UserInputError
from dmlbench.files import signals_deferred
from dmlbench.provenance import now

# What ``flock`` says on a filesystem that has no locks (NFS without a lock daemon, some FUSE mounts).
NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})
# The last shared holder holds the lock alone for an instant while it removes the file: a shared
# newcomer that meets that instant looks again before it gives up.
SHARED_ATTEMPTS = 3
SHARED_PAUSE_SECONDS = 0.05


class DirectoryInUse(UserInputError):
    """Another process owns the directory; the message names it and says how to take over (exit 2)."""


@dataclass
class _Hold:
    lock_file: Path
    descriptor: int | None  # None: the filesystem has no locks
    created: list[Path] = field(default_factory=list)  # directories made for the lock, deepest first


# This process's holds, by lock file and thread: a nested ``owned`` of the same directory in the same
# thread (``train_or_resume`` calling ``train``) is part of the outer one, which alone releases it.
_HOLDS: dict[tuple[str, int], _Hold] = {}
_UNLOCKED_DEVICES: set[int] = set()  # filesystems already warned about


@contextmanager
def owned(directory: Path, lock_name: str, *, what: str, shared: bool = False) -> Iterator[None]:
    """Own ``directory`` (created if missing) for the block: alone, or with the other ``shared``
    holders. ``DirectoryInUse`` (one line naming the owner) if another process owns it; the hold is
    released on every way out of the block (an exception, a stop signal) and by the kernel when the
    process dies. ``what`` names the directory in messages (``"run directory"``)."""
    directory = Path(directory)
    key = (os.path.abspath(directory / lock_name), threading.get_ident())
    if key in _HOLDS:
        yield
        return
    hold = None
    try:
        # A stop signal is held back while the lock is taken or given up, so that a hold is always
        # either recorded (and released below) or not taken.
        with signals_deferred():
            hold = _HOLDS[key] = _acquire(directory, lock_name, what, shared)
        yield
    finally:
        if hold is not None:
            with signals_deferred():
                del _HOLDS[key]
                _release(hold)


def _acquire(directory: Path, lock_name: str, what: str, shared: bool) -> _Hold:
    lock_file = directory.absolute() / lock_name  # the same file after a chdir
    created: list[Path] = []
    attempts = 0
    try:
        while True:
            created += _make_directory(directory, what)
            descriptor = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if shared else 0), 0o666)
            try:
                fcntl.flock(descriptor, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            except BlockingIOError:
                owners = _read_owners(descriptor)
                os.close(descriptor)
                attempts += 1
                if shared and attempts < SHARED_ATTEMPTS:
                    time.sleep(SHARED_PAUSE_SECONDS)
                    continue
                raise DirectoryInUse(_refusal(what, directory, owners)) from None
            except OSError as error:
                empty = os.fstat(descriptor).st_size == 0
                os.close(descriptor)
                if error.errno not in NO_LOCKS:
                    raise
                if empty:  # a file that locks nothing would only mislead
                    lock_file.unlink(missing_ok=True)
                _warn_unlocked(directory, what, error)
                return _Hold(lock_file, None, _unique(created))
            if _still_linked(descriptor, lock_file):
                try:
                    _write_owner(descriptor, shared)
                except BaseException as error:
                    lock_file.unlink(missing_ok=True)  # still held: no other process can be using it
                    os.close(descriptor)
                    if isinstance(error, OSError):  # a full disk: one line naming the file
                        raise OSError(error.errno, error.strerror, str(lock_file)) from None
                    raise
                return _Hold(lock_file, descriptor, _unique(created))
            # Its last holder removed the file between our open and our lock: lock the new one.
            os.close(descriptor)
    except BaseException:
        _remove_empty(_unique(created))
        raise


def _release(hold: _Hold) -> None:
    """Give the lock up; the last holder (alone once it can lock exclusively) first removes the lock
    file and the directories made for it that stayed empty (a run refused before it wrote anything)."""
    if hold.descriptor is None:
        _remove_empty(hold.created)
        return
    try:
        fcntl.flock(hold.descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # other shared holders remain: the file is theirs now
    else:
        # A process that opened the file before this unlink finds it unlinked once it holds the lock, and starts over.
        with suppress(FileNotFoundError):
            hold.lock_file.unlink()
        _remove_empty(hold.created)
    finally:
        os.close(hold.descriptor)


def _make_directory(directory: Path, what: str) -> list[Path]:
    """Create ``directory`` and its missing parents; the ones created, deepest first."""
    missing = []
    probe = directory.absolute()
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserInputError(f"cannot create {what} {directory}: {error.strerror or error}") from None
    return missing


def _remove_empty(directories: list[Path]) -> None:
    for directory in directories:
        try:
            directory.rmdir()
        except OSError:
            return  # not empty (or gone): neither are its parents to be removed


def _unique(paths: list[Path]) -> list[Path]:
    return list(dict.fromkeys(paths))


def _still_linked(descriptor: int, lock_file: Path) -> bool:
    try:
        named, held = os.stat(lock_file), os.fstat(descriptor)
    except FileNotFoundError:
        return False
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _write_owner(descriptor: int, shared: bool) -> None:
    """One JSON line naming this process: the only line of an exclusive holder; shared holders each
    append theirs (the file opened ``O_APPEND``)."""
    line = json.dumps({"pid": os.getpid(), "host": _host(), "since": now(), "command": _command_line()}) + "\n"
    if not shared:
        os.ftruncate(descriptor, 0)
    os.write(descriptor, line.encode())


def _read_owners(descriptor: int) -> list[dict[str, Any]]:
    """The holders the file names, the latest last; on this machine only other processes that run
    (a shared holder's line stays after it lets go). Empty while an owner has yet to write its line."""
    text = os.pread(descriptor, 1 << 16, 0).decode(errors="replace")
    owners = []
    for line in text.splitlines():
        with suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and isinstance(entry.get("pid"), int):
                owners.append(entry)
    running = [entry for entry in owners if entry.get("host") != _host()
               or (entry["pid"] != os.getpid() and process_exists(entry["pid"]))]
    return running or owners[-1:]


def _refusal(what: str, directory: Path, owners: list[dict[str, Any]]) -> str:
    if not owners:
        return f"{what} {directory} is in use by another process that is starting; wait for it to finish"
    owner = owners[-1]
    pid, host = owner["pid"], owner.get("host", "?")
    others = f" and {len(owners) - 1} other worker(s)" if len(owners) > 1 else ""
    where = "" if host == _host() else f" on {host}"
    return (f"{what} {directory} is in use by pid {pid}@{host}{others} since {owner.get('since', '?')} "
            f"(`{owner.get('command', '?')}`): wait for it to finish, or stop it (kill {pid}{where}) "
            "and run this command again")


def _warn_unlocked(directory: Path, what: str, error: OSError) -> None:
    device = os.stat(directory).st_dev
    if device in _UNLOCKED_DEVICES:
        return
    _UNLOCKED_DEVICES.add(device)
    warnings.warn(f"{what} {directory}: its filesystem has no file locks ({error.strerror}); nothing stops a "
                  "second process from writing it at the same time", stacklevel=4)


# ``scheme://user:password@``: the lock file and the refusal show the URL without its password.
_PASSWORD_IN_URL = re.compile(r"([A-Za-z][\w+.-]*://[^/:@\s]*):[^@/\s]*@")


def _command_line() -> str:
    """How this process was started, as a user would type it (``dmlbench ...`` for the console
    script and ``python -m dmlbench``), passwords of URLs left out."""
    started = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    program = started.name
    if program == "__main__.py":
        program = "dmlbench" if started.parent.name == "dmlbench" else f"python -m {started.parent.name}"
    return shlex.join([program, *(_PASSWORD_IN_URL.sub(r"\1@", word) for word in sys.argv[1:])])


def _host() -> str:
    return os.uname().nodename


def process_exists(pid: int) -> bool:
    """Whether a process with this pid lives on this machine (one owned by another user counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
