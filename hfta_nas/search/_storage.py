"""Where studies live: the embedded default storage and any Optuna storage URL.

The default is an Optuna journal file (`runs/hfta-nas.journal`): no server,
append-only writes under a file lock, safe for several processes on one
machine, and optuna-dashboard opens it directly. Measured on this project's
2-core CI machine (`python benchmarks/storage.py`): about 12 ms per trial of
21 writes for the journal file against 130 ms for SQLite, and 4 concurrent
writers lost nothing on either (the journal stayed ~10x cheaper). Any other
Optuna storage URL (sqlite:///..., postgresql://...) is accepted as it is,
except that `postgresql://` (SQLAlchemy's default driver is psycopg2) uses the
psycopg 3 driver, a dependency of this project, when psycopg2 is absent:
`postgresql+psycopg://...` names it explicitly.

Several workers on one study take `study_lock` around "count the budget, then
ask": a PostgreSQL advisory lock, a MySQL named lock, or an exclusive lock on a
file beside a journal or SQLite file. Other storages (a gRPC proxy, `grpc://HOST:PORT`,
which `serve_proxy` runs in front of a database) get no lock, and workers that race
for the last trials may then overshoot n_trials by a few.

Every opened storage is a `PatientStorage`: its calls ride out an outage of up to the
storage patience (`_patience`). Opening is not patient about the first connection unless
asked (`wait_at_start`: the command line asks when --storage-patience, or the space's
study.storage_patience, is given), so a wrong URL is refused at once; when asked, a server
that refuses the connection (a restart, workers a scheduler started before the database) is
waited for like any outage, while a wrong password, host name or database is still refused
at once (`passes_at_start`). A URL is shown (errors, the location returned for
summaries and hints) with its password masked (`_credentials`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import logging
import os
import shlex
import sqlite3
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, JournalStorage
from optuna.storages.journal import JournalFileBackend

from hfta_nas._limits import MAX_STORAGE_PATIENCE_S
from hfta_nas.errors import HftaNasError
from hfta_nas.search._credentials import hide_passwords
from hfta_nas.search._journal_end import RecordedJournal, check_end, end_file
from hfta_nas.search._optuna_private import storage_of, study_id
from hfta_nas.search._patience import (
    DEFAULT_PATIENCE_S,
    PatientStorage,
    StorageUnreachable,
    is_passing,
    passes_at_start,
    retried,
    unwrapped,
)
from hfta_nas.search._stored_values import check_numbers

DEFAULT_STORAGE = "runs/hfta-nas.journal"
_URL_SCHEMES = ("sqlite:", "postgresql", "mysql", "oracle", "mssql", "redis:", "grpc:")


def _location(storage: str | None) -> str:
    """`storage`, or the default when none is given; an empty one is refused, not taken for the default."""
    if storage is not None and not storage.strip():
        raise HftaNasError(
            "the storage is empty; give a URL (sqlite:///f.db, postgresql://...) or a journal file path, "
            f"or none for {DEFAULT_STORAGE}."
        )
    return storage or DEFAULT_STORAGE


def open_storage(
    storage: str | None, patience: float = DEFAULT_PATIENCE_S, *, wait_at_start: bool = False
) -> tuple[BaseStorage, str]:
    """(the storage for Optuna, the string optuna-dashboard takes, its password masked: it is
    shown, never used to connect). Opening fails at once when the storage cannot be reached (a
    wrong URL must not wait), unless `wait_at_start`: then a database server or gRPC proxy that
    refuses the first connection is waited for up to `patience` seconds, with one line saying so
    (a wrong password, host name or database still fails at once). After that, every call rides
    out an outage of up to `patience` seconds (`PatientStorage`)."""
    check_patience(patience)
    opened, location = _open(storage, patience, wait_at_start)
    return PatientStorage(opened, patience), hide_passwords(location)


def check_patience(patience: float) -> None:
    """HftaNasError unless `patience` is a number of seconds from 0 to MAX_STORAGE_PATIENCE_S."""
    if not (isinstance(patience, (int, float)) and 0 <= patience <= MAX_STORAGE_PATIENCE_S):
        raise HftaNasError(
            f"storage patience must be a number of seconds from 0 to {MAX_STORAGE_PATIENCE_S:.0f} "
            f"(a week), got {patience!r}"
        )


def _open(
    storage: str | None, patience: float = DEFAULT_PATIENCE_S, wait_at_start: bool = False
) -> tuple[BaseStorage, str]:
    location = _location(storage)
    at_start = patience if wait_at_start else None
    if location.startswith("grpc://"):
        return _grpc_proxy(location, at_start), location
    if location.startswith(_URL_SCHEMES):
        _check_sqlite_folder(location)
        _check_sqlite_is_optunas(location)
        try:
            return _get_storage(_with_timeouts(_with_driver(location)), patience, at_start), location
        except StorageUnreachable:  # waited for, past the patience: its own line
            raise
        except Exception as error:  # SQLAlchemy/driver errors vary by backend
            raise HftaNasError(
                hide_passwords(
                    f"cannot open storage '{location}': {type(error).__name__}: {_one_line(error)}; "
                    "expected a database that can be reached (check the URL, the server and the credentials)"
                )
            ) from error
    scheme = location.partition("://")[0]
    if "://" in location and scheme.replace("+", "").isalnum():
        raise HftaNasError(
            f"cannot open storage '{hide_passwords(location)}': unknown URL scheme '{scheme}'; expected "
            "sqlite:///FILE, postgresql://..., mysql://... or a journal file path."
        )
    path = _journal_path(location)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            end_file(path).unlink(missing_ok=True)  # the record of a journal deleted to start afresh
            path.touch()
        if not os.access(path, os.W_OK):
            raise PermissionError(f"'{path}' is not writable")
        _check_is_journal(path)  # before the mend below, which would move a stranger's file aside
        lock = _KernelFileLock(path) if os.name == "posix" else None
        if lock is not None:
            repair_torn_tail(path, lock)
            check_end(path, lock)  # a cut at a record's end: what was lost, said (`_journal_end`)
        backend = RecordedJournal(str(path), lock) if lock is not None else JournalFileBackend(str(path))
    except OSError as error:
        raise HftaNasError(f"cannot use journal file '{location}' as storage: {error}") from error
    try:
        return JournalStorage(backend), str(path)
    except _UNREADABLE_RECORD as error:  # a line that is not an Optuna journal record
        raise HftaNasError(_damaged(location, error)) from error


# what Optuna's journal reader raises for a record it cannot apply (an unknown op code: AssertionError)
_UNREADABLE_RECORD = (ValueError, KeyError, TypeError, AssertionError)


GRPC_READY_S = 10.0  # how long opening a grpc:// storage waits for its proxy to answer


def _grpc_proxy(location: str, at_start: float | None = None) -> BaseStorage:
    """Optuna's client of a gRPC storage proxy (`hfta-nas storage-proxy`) at grpc://HOST:PORT,
    once the proxy answers; HftaNasError when the address is malformed or nothing answers
    (within GRPC_READY_S, or `at_start` seconds of patience, retried, when given)."""
    shown = hide_passwords(location)
    host, _, port = location[len("grpc://") :].rstrip("/").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise HftaNasError(f"cannot open storage '{shown}': expected grpc://HOST:PORT (a port from 1 to 65535)")
    try:
        from optuna.storages import GrpcStorageProxy
    except ImportError as error:  # grpcio is a dependency; a trimmed install may lack it
        raise HftaNasError(f"cannot open storage '{shown}': {error}; pip install grpcio protobuf") from None
    with warnings.catch_warnings():  # Optuna marks the proxy "experimental"
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        proxy = GrpcStorageProxy(host=host.strip("[]"), port=int(port))
    try:
        if at_start is None:
            proxy.wait_server_ready(timeout=GRPC_READY_S)
        else:
            retried(functools.partial(proxy.wait_server_ready, timeout=GRPC_READY_S), at_start)
    except StorageUnreachable:
        proxy.close()
        raise
    except ConnectionError:
        proxy.close()
        raise HftaNasError(
            f"cannot open storage '{shown}': no gRPC storage proxy answered at {host}:{port} within "
            f"{GRPC_READY_S:.0f} s; start one with `hfta-nas storage-proxy --storage DATABASE_URL --port {port}`"
        ) from None
    return proxy


def serve_proxy(
    storage: str,
    host: str,
    port: int,
    patience: float,
    ready: Callable[[str], None],
    *,
    wait_at_start: bool = False,
) -> None:
    """Serve `storage` (a database URL) to workers as a gRPC storage proxy at host:port until
    interrupted; `ready` gets the line to show once it listens. The proxy's own calls to the
    database ride out outages of `patience` seconds, so its workers wait with it (and so does its
    first connection, when `wait_at_start`: see `open_storage`)."""
    location = _location(storage)
    if not location.startswith(_URL_SCHEMES) or location.startswith(("grpc://", "redis:")):
        raise HftaNasError(
            f"cannot serve '{hide_passwords(location)}' through a gRPC proxy: expected a database URL "
            "(postgresql://..., mysql://..., sqlite:///FILE); Optuna's proxy does not serve journal files"
        )
    opened, shown = open_storage(location, patience, wait_at_start=wait_at_start)
    from hfta_nas.search._optuna_private import grpc_proxy_server

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        server = grpc_proxy_server(opened, host, port)
    try:
        server.start()
    except RuntimeError as error:  # grpc: "Failed to bind to address"
        raise HftaNasError(f"cannot serve the storage proxy on {host}:{port}: {error}; give another --port") from None
    ready(f"gRPC storage proxy for {shown} at {host}:{port}; workers use --storage grpc://{host}:{port}")
    try:
        server.wait_for_termination()
    finally:
        server.stop(grace=None)


def _damaged(location: str, error: BaseException) -> str:
    return (
        f"cannot read journal file '{location}': a record is damaged or of a kind this Optuna does not know "
        f"({type(error).__name__}: {error}); expected an Optuna journal (restore it from a copy, or give another "
        "--storage)"
    )


def _journal_path(location: str) -> Path:
    """`location` as a journal file path: HftaNasError when it is a folder, a device, a pipe or a socket."""
    path = Path(location)
    if path.is_dir():
        raise HftaNasError(
            f"cannot use '{location}' as storage: it is a folder; expected a journal file path "
            f"(e.g. {path / 'hfta-nas.journal'}) or a database URL."
        )
    if path.exists() and not path.is_file():
        raise HftaNasError(
            f"cannot use '{location}' as storage: it is not a regular file (a device, pipe or socket); "
            "expected a journal file path or a database URL."
        )
    return path


_JOURNAL_START = b'{"op_code":'  # every Optuna journal record is a JSON object that begins with its op code


def _check_is_journal(path: Path) -> None:
    """HftaNasError, changing nothing, when `path` holds something other than an Optuna journal
    (a file given by mistake): an empty file, or one whose first record starts as Optuna's do, is one."""
    with open(path, "rb") as handle:
        start = handle.read(len(_JOURNAL_START))
    if start and not _JOURNAL_START.startswith(start) and not start.startswith(_JOURNAL_START):
        raise HftaNasError(
            f"cannot use '{path}' as storage: it is not an Optuna journal (its first bytes are {start!r}); "
            "nothing was changed; give a journal file path, a new file name or a database URL."
        )


def repair_torn_tail(journal: Path, lock: Any) -> str | None:
    """Mend a journal whose last record lacks its newline (a write cut by a full disk or a
    kill); what was done, or None when nothing was needed.

    Optuna writes each batch of records as one append ending in a newline, and its reader
    skips a last line without one: such a record never took effect. But the next append
    would be glued to it, and the glued line would fail every later read of the file, for
    every study in it. So, under the journal's write lock: a last line that is whole JSON
    (only the newline was lost) gets its newline; anything else is moved to
    `<journal>.torn` and cut off.
    """
    lock.acquire()
    try:
        with open(journal, "rb+") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size == 0:
                return None
            handle.seek(size - 1)
            if handle.read(1) == b"\n":
                return None
            start = max(0, size - 1)
            while start > 0:  # the start of the last line
                step = max(0, start - 65536)
                handle.seek(step)
                block = handle.read(start - step)
                newline = block.rfind(b"\n")
                if newline != -1:
                    start = step + newline + 1
                    break
                start = step
            handle.seek(start)
            tail = handle.read()
            try:
                json.loads(tail)
            except ValueError:
                with open(str(journal) + ".torn", "ab") as torn:
                    torn.write(tail + b"\n")
                handle.truncate(start)
                message = (
                    f"journal '{journal}': its last record was cut off mid-write ({len(tail)} bytes) and never "
                    f"took effect; moved to '{journal}.torn'"
                )
            else:
                handle.write(b"\n")
                message = f"journal '{journal}': its last record had lost its newline; restored"
    finally:
        lock.release()
    logging.getLogger("hfta_nas").warning(message)
    return message


class _KernelFileLock:  # the acquire/release interface of Optuna's journal file locks
    """An flock on `.<file>.flock` (hidden beside it), which the kernel drops when its process dies: the journal's
    write lock (and the lock around creating a fresh SQLite file's tables). A run killed
    mid-write (SIGKILL, the OOM killer) leaves no lock behind. Optuna's default symlink lock would stay held until its
    30 s grace period broke it, stalling the re-run that resumes the study. Every
    hfta-nas command (and `hfta-nas dashboard`) opens journals through here."""

    def __init__(self, file: Path) -> None:
        self._path = str(file.with_name(f".{file.name}.flock"))
        self._held = threading.local()

    def acquire(self) -> bool:
        import fcntl

        handle = open(self._path, "a")  # noqa: SIM115 - held open while the lock is held; closed by release()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except BaseException:
            handle.close()
            raise
        self._held.handle = handle
        return True

    def release(self) -> None:
        import fcntl

        handle = self._held.__dict__.pop("handle")
        try:
            fcntl.flock(handle, fcntl.LOCK_UN)
        finally:
            handle.close()


def _check_sqlite_folder(url: str) -> None:
    """An SQLite file in a folder that does not exist: say so (SQLAlchemy says only "unable to open database file")."""
    if not url.startswith("sqlite:///") or url.startswith("sqlite:///:memory:"):
        return
    folder = Path(url[len("sqlite:///") :].split("?", 1)[0]).parent
    if not folder.is_dir():
        raise HftaNasError(
            f"cannot open storage '{url}': folder '{folder}' does not exist; "
            "expected an SQLite file in an existing folder (sqlite:///path/to/file.db)."
        )


# Optuna's own tables, which every database it made holds (its schema version is in version_info)
_OPTUNA_TABLES = {"studies", "trials", "version_info", "trial_values", "trial_params", "study_directions"}


def _check_sqlite_is_optunas(url: str) -> None:
    """HftaNasError, changing nothing, for an SQLite file Optuna did not make (another application's:
    Optuna would add its tables to it), one missing some of Optuna's tables (Optuna would recreate
    them empty), or one of another schema version. A missing or empty file is a new database."""
    path = _sqlite_file(url)
    if path is None or not path.is_file() or path.stat().st_size == 0:
        return
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as connection:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            version = (
                connection.execute("SELECT schema_version FROM version_info").fetchone()
                if "version_info" in tables
                else None
            )
    except sqlite3.DatabaseError as error:
        raise HftaNasError(
            f"cannot open storage '{url}': not an SQLite database ({error}); nothing was changed."
        ) from None
    if not tables & _OPTUNA_TABLES:
        raise HftaNasError(
            f"cannot open storage '{url}': an SQLite database of another application (tables "
            f"{', '.join(sorted(tables)[:5])}); Optuna would add its tables to it; nothing was changed; "
            "give a new file name."
        )
    missing = sorted(_OPTUNA_TABLES - tables)
    if missing:
        raise HftaNasError(
            f"cannot open storage '{url}': an Optuna database without its table(s) {', '.join(missing)} "
            "(Optuna would recreate them empty, losing what they held); nothing was changed; restore it from a copy."
        )
    from optuna.storages._rdb.models import SCHEMA_VERSION as expected  # what this Optuna writes and reads

    if version is not None and version[0] != expected:
        raise HftaNasError(
            f"cannot open storage '{url}': its Optuna schema version is {version[0]}, this Optuna's is {expected}; "
            "nothing was changed; use the Optuna that made it (or `optuna storage upgrade` for an older one)."
        )


def _one_line(error: BaseException) -> str:
    """A driver's message on one line, without SQLAlchemy's "(Background on this error at: ...)" link."""
    lines = [line.strip() for line in str(error).splitlines()]
    return " ".join(line for line in lines if line and not line.startswith("(Background on this error at:"))


def _get_storage(url: str, patience: float = DEFAULT_PATIENCE_S, at_start: float | None = None) -> BaseStorage:
    """Optuna's storage for `url`; on PostgreSQL, workers that open a fresh database
    at once create its tables one at a time (under an advisory lock): concurrent
    CREATE TYPE / CREATE TABLE fail there with duplicate-key errors. A server that refuses the
    first connection fails at once (a wrong URL must not wait), unless `at_start` gives the seconds
    to wait for it (then only a refusal that waiting cannot mend fails at once: `passes_at_start`);
    one that goes away after it answered (a restart while the tables are checked) is waited for, up
    to `patience` seconds."""

    def first_contact(call: Callable[[], Any]) -> Any:
        return call() if at_start is None else retried(call, at_start, passing=passes_at_start)

    database = _sqlite_file(url)
    if database is not None and os.name == "posix":
        # SQLite has no advisory lock; processes that open a fresh file at once raced to create its
        # tables ("table studies already exists"): they create it one at a time under a file lock
        lock = _KernelFileLock(database)
        lock.acquire()
        try:
            return optuna.storages.get_storage(url)
        finally:
            lock.release()
    if not url.startswith("postgresql"):
        return first_contact(functools.partial(optuna.storages.get_storage, url))
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    try:
        first_contact(lambda: engine.connect().close())

        def tables_checked_under_the_lock() -> BaseStorage:
            with engine.connect() as connection:
                connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": _SCHEMA_LOCK_KEY})
                storage = optuna.storages.get_storage(url)
                connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": _SCHEMA_LOCK_KEY})
                return storage  # (a connection that drops takes its advisory lock with it)

        return retried(tables_checked_under_the_lock, patience)
    finally:
        engine.dispose()


def _sqlite_file(url: str) -> Path | None:
    """The database file of an `sqlite:///FILE` URL (None for memory or other databases)."""
    if not url.startswith("sqlite:///") or url.startswith("sqlite:///:memory:"):
        return None
    return Path(url[len("sqlite:///") :].split("?", 1)[0])


_SCHEMA_LOCK_KEY = int.from_bytes(hashlib.sha256(b"hfta-nas/optuna-schema").digest()[:8], "big", signed=True)


# libpq's limits on a connection that cannot be made or stops answering: without them a host cut
# off by a dropped route (no "connection refused") waits on TCP's retransmissions for ~15 minutes
_PG_TIMEOUTS = {"connect_timeout": "10", "tcp_user_timeout": "15000", "keepalives_idle": "10"}


def _with_timeouts(url: str) -> str:
    """A PostgreSQL URL with the timeouts above, where it does not set them itself."""
    if not url.startswith("postgresql"):
        return url
    import sqlalchemy

    parsed = sqlalchemy.engine.make_url(url)
    extra = {key: value for key, value in _PG_TIMEOUTS.items() if key not in parsed.query}
    return parsed.update_query_dict(extra).render_as_string(hide_password=False)


def _with_driver(url: str) -> str:
    """`postgresql://` (and Heroku-style `postgres://`) with the psycopg 3 driver
    where psycopg2, SQLAlchemy's default for that scheme, is not installed."""
    for scheme in ("postgresql://", "postgres://"):
        if (
            url.startswith(scheme)
            and importlib.util.find_spec("psycopg2") is None
            and importlib.util.find_spec("psycopg")
        ):
            return "postgresql+psycopg://" + url[len(scheme) :]
    return "postgresql://" + url[len("postgres://") :] if url.startswith("postgres://") else url


class StudyLock:
    """A lock shared by every worker of one study (re-entrant within a process);
    see the module docstring for what backs it on each storage."""

    def __init__(self, storage: BaseStorage | str, location: str, study_name: str) -> None:
        self._local = threading.RLock()
        self._depth = 0
        acquire, self._release = _backing_lock(storage, location, study_name)
        # through an outage of a database that holds the lock, taking it waits as the storage's calls do
        self._acquire = (
            functools.partial(storage.patiently, acquire) if isinstance(storage, PatientStorage) else acquire
        )

    def __enter__(self) -> StudyLock:
        self._local.acquire()
        try:
            if self._depth == 0:
                self._acquire()
            self._depth += 1
        except BaseException:  # a Ctrl-C may land just after the backing lock was granted: give it back
            try:
                if self._depth == 0:
                    with contextlib.suppress(Exception):
                        self._release()
            finally:
                self._local.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        try:
            if self._depth == 0:
                self._release()
        finally:
            self._local.release()


def study_lock(storage: BaseStorage | str, location: str, study_name: str) -> StudyLock:
    """The lock that makes "count the budget, then ask" atomic across workers."""
    return StudyLock(storage, location, study_name)


def _backing_lock(storage: BaseStorage | str, location: str, study_name: str):
    key = int.from_bytes(hashlib.sha256(study_name.encode()).digest()[:8], "big", signed=True)
    # optuna.storages.get_storage wraps an RDBStorage in a cache (_CachedStorage) that hides
    # its engine: without unwrapping it, PostgreSQL workers ran with no lock at all.
    storage = unwrapped(storage)
    engine = getattr(getattr(storage, "_backend", storage), "engine", None)
    if engine is not None and engine.dialect.name in ("postgresql", "mysql"):
        from sqlalchemy import text

        held: list[Any] = []
        if engine.dialect.name == "postgresql":
            take, give = text("SELECT pg_advisory_lock(:key)"), text("SELECT pg_advisory_unlock(:key)")
        else:
            take, give = text("SELECT GET_LOCK(:key, -1)"), text("SELECT RELEASE_LOCK(:key)")
            key = f"hfta-nas/{key}"

        # The lock is the database session's: a connection given back to the engine's pool keeps
        # it, so one whose lock may be held and not given back is invalidated (its session closed).
        def acquire() -> None:
            connection = engine.connect()
            try:
                connection.execute(take, {"key": key})
                connection.commit()
            except BaseException:  # a Ctrl-C just after the server granted it
                _drop_session(connection)
                raise
            held.append(connection)

        def release() -> None:
            if not held:  # given back already (StudyLock gives back a lock a Ctrl-C cut short)
                return
            connection, unlocked = held[-1], False
            try:
                connection.execute(give, {"key": key})
                connection.commit()
                unlocked = True
            except Exception as error:
                if not is_passing(error):
                    raise
                # the server dropped the connection (a restart): the lock, a session's, went with it
            finally:
                held.pop()
                if unlocked:
                    with contextlib.suppress(Exception):
                        connection.close()
                else:
                    _drop_session(connection)

        return acquire, release
    path = None
    if isinstance(storage, JournalStorage):
        path = Path(location)
    elif location.startswith("sqlite:///") and location != "sqlite:///:memory:":
        path = Path(location[len("sqlite:///") :])
    if path is None or os.name != "posix":
        return (lambda: None), (lambda: None)
    import fcntl

    lock_path = path.with_name(f".{path.name}.{key & 0xFFFFFFFF:08x}.lock")  # hidden: it outlives the run, empty
    # The open file is kept in `files` before it locks, and leaves only once unlocked: a Ctrl-C (or
    # the SIGINT a killed parent sends) is raised just after the call it arrived in, and when that
    # call is the flock that got the lock, the next acquire must flock the same file (at once)
    # rather than a new one, which would wait on this process's own lock forever.
    files: list[Any] = []

    def acquire_file() -> None:
        if not files:
            files.append(open(lock_path, "a"))  # noqa: SIM115 - open while the lock is held; closed on release
        fcntl.flock(files[0], fcntl.LOCK_EX)

    def release_file() -> None:
        if not files:  # given back already (StudyLock gives back a lock a Ctrl-C cut short)
            return
        handle = files[0]
        fcntl.flock(handle, fcntl.LOCK_UN)
        files.clear()
        handle.close()

    return acquire_file, release_file


def _drop_session(connection: Any) -> None:
    """Close `connection`'s database session, and with it any session lock it holds (a plain close
    would return the session to the pool, lock and all)."""
    with contextlib.suppress(Exception):
        connection.invalidate()
    with contextlib.suppress(Exception):
        connection.close()


def dashboard_command(dashboard_location: str) -> str:
    """The exact command that shows this storage in optuna-dashboard (with its artifacts folder)."""
    command = ["optuna-dashboard", dashboard_location]  # quoted: a path with spaces stays one argument
    artifacts = artifact_folder(dashboard_location)
    if artifacts is not None:
        command += ["--artifact-dir", str(artifacts)]
    return shlex.join(command)


def _folder_beside(location: str, name: str) -> Path | None:
    """`name` beside a journal or SQLite file, `runs/name` for a database server (the machine
    that runs keeps it), None for a storage in memory (nothing outlives the process)."""
    if location.startswith("sqlite:"):
        file = _sqlite_file(location)
        return file.parent / name if file is not None else None
    if location.startswith(_URL_SCHEMES):
        return Path("runs") / name
    if location and not location.startswith("<"):
        return Path(location).parent / name
    return None


def artifact_folder(location: str) -> Path | None:
    """Where the Optuna artifacts of a storage's studies go (a search's space file, a
    stability report): an `artifacts` folder beside a journal or SQLite file,
    `runs/artifacts` for a database server, None for a storage in memory."""
    return _folder_beside(location, "artifacts")


def checkpoint_folder(location: str, study_name: str) -> Path | None:
    """Where the arrays of one study keep their per-epoch checkpoints: a `checkpoints` folder
    beside a journal or SQLite file, `runs/checkpoints` for a database server (the machine
    that trains keeps them), None for a storage in memory (nothing outlives the process)."""
    root = _folder_beside(location, "checkpoints")
    # one folder per study of this storage, named by a digest: study names may hold any character, and
    # two storages in one folder (or one server) may hold studies of the same name
    digest = hashlib.sha256(f"{location}\0{study_name}".encode()).hexdigest()[:16]
    return root / digest if root is not None else None


def counted_trials(storage: str | None, study_name: str) -> int:
    """How many trials of a stored study take a place in its budget (0 when there is none yet);
    read only: nothing is created or written."""
    from hfta_nas.search._ledger import Ledger

    readable = _readable(_location(storage))
    if readable is None:
        return 0
    try:
        study = optuna.load_study(study_name=study_name, storage=readable)
    except KeyError:
        return 0
    return Ledger(study, None).counted()


def storage_location(storage: BaseStorage) -> str:
    """The string optuna-dashboard takes for an opened storage (a journal file's path,
    a database URL without its password), or '<in memory>'."""
    storage = unwrapped(storage)
    backend = getattr(storage, "_backend", storage)
    if isinstance(storage, JournalStorage) and isinstance(backend, JournalFileBackend):
        return str(backend._file_path)
    engine = getattr(backend, "engine", None)
    if engine is not None:
        return engine.url.render_as_string(hide_password=True)
    return "<in memory>"


def missing_storage_file(location: str | None) -> Path | None:
    """The journal or SQLite file `location` names when it does not exist yet (opening the storage
    would create it); None when it exists, or the storage is a database server or in memory."""
    location = _location(location)
    path = _sqlite_file(location) if location.startswith(_URL_SCHEMES) else Path(location)
    return path if path is not None and not path.exists() else None


def _readable(location: str) -> BaseStorage | None:
    """The storage at `location` opened for reading, or None when there is nothing to read
    yet (opening would create a database or journal file)."""
    if location.startswith("grpc://"):
        return _grpc_proxy(location)
    if location.startswith(_URL_SCHEMES):
        if missing_storage_file(location) is not None:
            return None
        _check_sqlite_is_optunas(location)  # Optuna would add (or recreate) its tables even to read
        try:
            return optuna.storages.get_storage(_with_driver(location))
        except Exception as error:  # SQLAlchemy/driver errors vary by backend
            raise HftaNasError(
                hide_passwords(f"cannot open storage '{location}': {type(error).__name__}: {_one_line(error)}")
            ) from error
    path = _journal_path(location)
    if not path.exists():
        return None
    try:
        return JournalStorage(JournalFileBackend(str(path)))
    except OSError as error:
        raise HftaNasError(f"cannot read journal file '{location}': {error}") from error
    except _UNREADABLE_RECORD as error:
        raise HftaNasError(_damaged(location, error)) from error


def check_directions(study: optuna.Study, directions: list[str]) -> None:
    """HftaNasError unless `study` optimises in `directions` (an existing study keeps its own)."""
    if [d.name.lower() for d in study.directions] != [d.lower() for d in directions]:
        raise HftaNasError(
            f"study '{study.study_name}' exists in the storage with other directions; choose another --study-name."
        )


def in_memory_study(
    study_name: str,
    directions: list[Any],
    sampler: optuna.samplers.BaseSampler,
    pruner: optuna.pruners.BasePruner,
    copy_of: optuna.Study | None = None,
) -> optuna.Study:
    """A new study in memory; with `copy_of`, holding that study's attributes (the system ones too: the
    texts hfta-nas keeps there, such as its space's identity), metric names and trials."""
    memory = optuna.create_study(
        storage=optuna.storages.InMemoryStorage(),
        study_name=study_name,
        directions=directions,
        sampler=sampler,
        pruner=pruner,
    )
    if copy_of is not None:
        for key, value in copy_of.user_attrs.items():
            memory.set_user_attr(key, value)
        for key, value in storage_of(copy_of).get_study_system_attrs(study_id(copy_of)).items():
            storage_of(memory).set_study_system_attr(study_id(memory), key, value)
        if copy_of.metric_names:
            with warnings.catch_warnings():  # set_metric_names is "experimental" in Optuna, and stable in use
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                memory.set_metric_names(copy_of.metric_names)
        memory.add_trials(copy_of.get_trials(deepcopy=False))
    return memory


def copy_of_stored_study(
    storage: str | None,
    study_name: str,
    *,
    directions: list[str],
    sampler: optuna.samplers.BaseSampler,
    pruner: optuna.pruners.BasePruner,
) -> tuple[optuna.Study, str]:
    """(an in-memory study holding the stored study's trials and attributes, or a new one
    when there is none yet, the storage's location, its password masked); nothing is written
    to the storage."""
    location = _location(storage)
    real = _readable(location)
    stored = None
    if real is not None and study_name in {s.study_name for s in optuna.get_all_study_summaries(real, False)}:
        stored = optuna.load_study(study_name=study_name, storage=real)
        check_directions(stored, directions)
        for trial in stored.get_trials(deepcopy=False):  # (read raw: not through PatientStorage's check)
            check_numbers(trial, lambda: study_name)
    return in_memory_study(study_name, directions, sampler, pruner, copy_of=stored), hide_passwords(location)
