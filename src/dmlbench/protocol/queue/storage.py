"""Where a benchmark's Optuna studies live, how workers share them safely, and how a URL is shown.

Three kinds of storage:

* ``sqlite:///PATH``: the default of a single worker (``OUTPUT_DIR/study.db``); one process at a time,
  SQLite's file locking is not safe for several writers, so ``--jobs`` refuses it;
* ``journal:///PATH``: Optuna's ``JournalStorage`` with a file backend, the default of ``--jobs N``
  (``OUTPUT_DIR/study.journal``): several processes of one machine append to one log;
* ``postgresql://USER@HOST[:PORT]/DB`` (also ``postgresql+psycopg://``): any number of workers on
  any number of machines; the driver is the ``postgres`` extra. A password is never taken from the
  URL into anything stored or printed: libpq reads ``PGPASSWORD`` or ``~/.pgpass`` itself.

Each kind is a class behind one factory, ``storage_for(url)`` (as Optuna puts its backends behind
``BaseStorage``): what differs between them (opening, checking, listing, locking, finding a dead worker)
is written once, in its class. Optuna's private attributes are read here only (``backend``, ``trial_id``).

``WorkLock`` serialises the short claim step of every worker (count what is done, decide, take one
unit): a PostgreSQL session advisory lock, or ``flock`` on a file beside a file storage; both vanish
with the process that held them, so a worker killed with ``kill -9`` never blocks the others.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from dmlbench.errors import UserInputError
from dmlbench.protocol.layout import JOURNAL_FILE, SQLITE_FILE, WORK_LOCK_SUFFIX
from dmlbench.protocol.queue.damaged_storage import open_journal, open_sqlite

POSTGRES_SCHEMES = ("postgresql", "postgresql+psycopg")
KINDS = "sqlite:///PATH, journal:///PATH or postgresql://USER@HOST/DB"
# Seconds a worker waits for a database server that went away before it stops (``--db-retry``).
DEFAULT_RETRY_SECONDS = 300


def default_url(output_dir: Path, jobs: int) -> str:
    """SQLite for one worker, the journal file for several (SQLite is not safe for concurrent writers)."""
    directory = Path(output_dir).resolve()
    return f"journal:///{directory / JOURNAL_FILE}" if jobs > 1 else f"sqlite:///{directory / SQLITE_FILE}"


def redact(url: str) -> str:
    """``url`` without its password (``postgresql://user:secret@host/db`` -> ``postgresql://user@host/db``).

    The password is dropped, not masked: the redacted URL is what benchmark.json stores and later
    commands connect with, and libpq then takes the password from ``PGPASSWORD`` or ``~/.pgpass``."""
    if "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    authority, slash, tail = rest.partition("/")
    if "@" not in authority:
        return url
    credentials, host = authority.rsplit("@", 1)
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}@{host}{slash}{tail}"


def password(url: str) -> str | None:
    """The password written in ``url``, if any (so that error messages can be scrubbed of it)."""
    if "://" not in url:
        return None
    authority = url.split("://", 1)[1].partition("/")[0]
    if "@" not in authority:
        return None
    credentials = authority.rsplit("@", 1)[0]
    return credentials.split(":", 1)[1] if ":" in credentials else None


def scrub(message: str, url: str) -> str:
    """``message`` with any password of ``url`` and the URL itself replaced by the redacted URL."""
    secret = password(url)
    message = message.replace(url, redact(url))
    return message.replace(secret, "***") if secret else message


class StudyStorage:
    """One kind of storage of a benchmark's studies. ``processes_of_one_machine``: its workers run on
    this machine only, so a worker whose process is gone is dead (file storages); otherwise Optuna's
    heartbeat tells (database servers). ``concurrent``: more than one process (and a heartbeat
    thread) may write at once."""

    processes_of_one_machine = True
    concurrent = True

    def __init__(self, url: str) -> None:
        self.url = url

    @property
    def redacted(self) -> str:
        return redact(self.url)

    def open(self, *, heartbeat: int | None = None) -> Any:
        """The Optuna storage behind the URL (``heartbeat``: seconds, database servers only)."""
        raise NotImplementedError

    def check(self, *, default: bool, jobs: int = 1) -> None:
        """A one-line ``UserInputError`` unless the storage can be reached and shared by ``jobs``
        local workers. Creates nothing (no file, no table)."""
        raise NotImplementedError

    def exists(self) -> bool:
        """Whether Optuna's tables or file are there (``study_names`` creates nothing)."""
        raise NotImplementedError

    def study_names(self) -> list[str]:
        """The studies already stored; ``[]`` for a storage not created yet."""
        import optuna

        if not self.exists():
            return []
        return [summary.study_name for summary in optuna.get_all_study_summaries(self.open())]

    def lock(self) -> AbstractContextManager[None]:
        """The work lock of this storage: held by one worker process at a time, gone with a killed one."""
        raise NotImplementedError

    def connection_lost(self, error: BaseException) -> str | None:
        """The reason, if ``error`` is a lost connection to a database server that may come back."""
        return None


class FileStorage(StudyStorage):
    """A storage in one file of this machine."""

    prefix = ""

    @property
    def path(self) -> Path:
        return Path(self.url[len(self.prefix):])

    def check(self, *, default: bool, jobs: int = 1) -> None:
        if jobs > 1 and not self.concurrent:
            raise UserInputError(
                f"storage {self.redacted}: SQLite is not safe for {jobs} concurrent workers; "
                "leave out --storage (a journal file is used) or give a postgresql:// URL"
            )
        if self.path.exists() and not self.path.is_file():
            raise UserInputError(f"storage {self.redacted}: {self.path} is not a file")
        if not default and not self.path.parent.is_dir():
            raise UserInputError(f"storage {self.redacted}: directory {self.path.parent} does not exist")

    def exists(self) -> bool:
        return self.path.exists()

    @contextmanager
    def lock(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(str(self.path) + WORK_LOCK_SUFFIX, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


class SQLiteStorage(FileStorage):
    """``sqlite:///PATH``: one worker process (SQLite's file locking is not safe for several writers)."""

    prefix, concurrent = "sqlite:///", False

    def open(self, *, heartbeat: int | None = None) -> Any:
        return open_sqlite(self.url, self.path)


class JournalStorage(FileStorage):
    """``journal:///PATH``: Optuna's append-only journal file; several processes of one machine."""

    prefix = "journal:///"

    def open(self, *, heartbeat: int | None = None) -> Any:
        return open_journal(self.path)


class PostgresStorage(StudyStorage):
    """``postgresql://USER@HOST[:PORT]/DB``: any number of workers on any number of machines."""

    processes_of_one_machine = False

    def open(self, *, heartbeat: int | None = None) -> Any:
        """Trials of a worker that stops beating for ``3 * heartbeat`` seconds are failed by the next
        worker that looks and re-enqueued with the same parameters (Optuna's
        ``RetryHeartbeatStaleTrialCallback``, the current name of ``RetryFailedTrialCallback``)."""
        import optuna

        _require_driver()
        # Optuna marks the heartbeat as experimental and expects it inside ``Study.optimize``; here
        # ``protocol.queue.work.Beating`` sends it around each unit of work instead.
        warnings.filterwarnings("ignore", message=".*heartbeat", category=Warning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage", category=UserWarning)
        options: dict[str, Any] = {"engine_kwargs": {"pool_pre_ping": True}}
        if heartbeat is not None:
            options.update(heartbeat_interval=heartbeat, grace_period=3 * heartbeat,
                           heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback())
        # RDBStorage creates Optuna's tables and types when they are missing; workers started in the
        # same second on an empty database would race to create them (a duplicate-key error of
        # PostgreSQL's catalogue), so one creates while the others wait, then find them there.
        with advisory_lock(self.url, SCHEMA_LOCK):
            return optuna.storages.RDBStorage(self.url, **options)

    def check(self, *, default: bool, jobs: int = 1) -> None:
        _require_driver()
        import sqlalchemy

        try:
            engine = sqlalchemy.create_engine(self.url)
            with engine.connect():
                pass
            engine.dispose()
        except Exception as error:  # any failure to reach the database is the user's storage URL or password
            text = str(getattr(error, "orig", None) or error).strip()
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            # libpq puts the server's reason last ("password authentication failed for user ...").
            reason = lines[-1] if lines else type(error).__name__
            raise UserInputError(f"storage {self.redacted} cannot be reached: {scrub(reason, self.url)}") from None

    def exists(self) -> bool:
        import sqlalchemy

        engine = sqlalchemy.create_engine(self.url)
        try:
            with engine.connect() as connection:
                return bool(sqlalchemy.inspect(connection).has_table("studies"))
        finally:
            engine.dispose()

    def lock(self) -> AbstractContextManager[None]:
        return advisory_lock(self.url, WORK_LOCK)

    def connection_lost(self, error: BaseException) -> str | None:
        """A lost or refused connection (a restart, a fail-over, a network cut) anywhere in ``error``'s chain."""
        import sqlalchemy

        seen: set[int] = set()
        current: BaseException | None = error
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            if isinstance(current, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)) or (
                isinstance(current, sqlalchemy.exc.DBAPIError) and current.connection_invalidated
            ):
                text = str(getattr(current, "orig", None) or current).strip().splitlines()
                return text[0] if text else type(current).__name__
            current = current.__cause__ or current.__context__
        return None


def storage_for(url: str) -> StudyStorage:
    """The storage behind ``url``; a one-line ``UserInputError`` for an unsupported kind."""
    if url.startswith(SQLiteStorage.prefix):
        return SQLiteStorage(url)
    if url.startswith(JournalStorage.prefix):
        return JournalStorage(url)
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme in POSTGRES_SCHEMES:
        return PostgresStorage(url)
    raise UserInputError(f"storage {redact(url)}: unsupported kind of storage URL; use {KINDS}")


def open_storage(url: str, *, heartbeat: int | None = None) -> Any:
    """The Optuna storage behind ``url`` (``StudyStorage.open``)."""
    return storage_for(url).open(heartbeat=heartbeat)


def study_names(url: str) -> list[str]:
    return storage_for(url).study_names()


def open_for_reading(url: str) -> tuple[set[str], Any]:
    """The study names in ``url`` and its opened storage; one that cannot be read (unreachable, foreign) is one line."""
    try:
        return set(study_names(url)), open_storage(url)
    except UserInputError:
        raise
    except Exception as error:
        raise UserInputError(f"storage {redact(url)} cannot be read: {scrub(str(error).splitlines()[0], url)}") from None


def backend(study: Any) -> Any:
    """The storage object of an Optuna study (a private attribute: read here only)."""
    return study._storage


def trial_id(trial: Any) -> int:
    """The storage id of a live or frozen Optuna trial (a private attribute: read here only)."""
    return int(trial._trial_id)


def _require_driver() -> None:
    # SQLAlchemy imports the driver itself; only its presence is checked here.
    if importlib.util.find_spec("psycopg") is None:
        raise UserInputError("a postgresql:// storage needs the PostgreSQL driver: pip install 'dmlbench[postgres]'")


class WorkLock:
    """One lock per storage for the claim step (``StudyStorage.lock``); re-entrant within a process."""

    def __init__(self, url: str) -> None:
        self.storage = storage_for(url)
        self.depth = 0
        self._held: AbstractContextManager[None] | None = None

    @contextmanager
    def held(self) -> Iterator[None]:
        if self.depth == 0:
            self._held = self.storage.lock()
            self._held.__enter__()
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0 and self._held is not None:
                held, self._held = self._held, None
                held.__exit__(None, None, None)


WORK_LOCK = "dmlbench-work-lock"
SCHEMA_LOCK = "dmlbench-schema-lock"


@contextmanager
def advisory_lock(url: str, name: str) -> Iterator[None]:
    """A PostgreSQL session advisory lock named ``name``, held on a connection of its own (so it
    vanishes with a worker killed with ``kill -9``)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
    try:
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": key})
            try:
                yield
            finally:
                connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": key})
    finally:
        engine.dispose()


def host_id() -> str:
    """This machine's name, as workers record it."""
    return os.uname().nodename
