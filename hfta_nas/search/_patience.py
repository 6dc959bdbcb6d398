"""A storage that rides out an outage: connection-level errors are retried until the storage is back.

Databases restart (maintenance, failover), networks blip and shared file systems
stall. Optuna's storages raise at the first failed call, and a search that has
trained for hours would die with every array in flight. `PatientStorage` wraps
any Optuna storage: a call that fails for a reason that passes (the server
refused or dropped the connection, SQLite's "database is locked", a journal on a
share that briefly fails) is retried with capped exponential back-off and jitter
until `patience` seconds have passed since the outage began. One line says when
the storage became unreachable and one when it is back. Past the patience every
call, this one and the ones after it, raises `StorageUnreachable` at once, so a
worker stops cleanly: its RUNNING trials are retried by the next run on the
study (see `_heartbeat`).

Errors that are not about reaching the storage (a constraint violation, a schema
mismatch, a trial already finished) are raised at once, never retried.

The calls are retried as the caller made them, in the caller's thread: the
trainer waits at its next write and goes on, in order, when the storage is
back. A write whose reply was lost after the server applied it is not applied
twice for the state of a trial (checked on retry); a new trial whose reply was
lost may leave an extra RUNNING trial, which the heartbeat check retries.
"""

from __future__ import annotations

import abc
import errno
import logging
import random
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from hfta_nas._limits import DEFAULT_STORAGE_PATIENCE_S as DEFAULT_PATIENCE_S
from hfta_nas.errors import HftaNasError
from hfta_nas.search._credentials import hide_passwords
from hfta_nas.search._optuna_private import BaseHeartbeat
from hfta_nas.search._stored_values import check_numbers

FIRST_DELAY_S, MOST_DELAY_S = 0.25, 10.0  # back-off between tries: doubles from the first, capped

_log = logging.getLogger("hfta_nas")

# OSError numbers a journal on a network share gives while the share is away (a full disk or a
# permission error does not pass by waiting)
_PASSING_OS_ERRORS = {
    errno.EIO,
    errno.ESTALE,
    errno.ETIMEDOUT,
    errno.EHOSTDOWN,
    errno.EHOSTUNREACH,
    errno.ENETDOWN,
    errno.ENETUNREACH,
    errno.ENOTCONN,
    errno.ECONNRESET,
    errno.ECONNREFUSED,
    errno.ECONNABORTED,
    errno.EAGAIN,
}
_SQLITE_PASSING = ("database is locked", "database table is locked", "disk i/o error", "unable to open database")


class StorageUnreachable(HftaNasError):
    """The storage stayed unreachable past the patience: the command stops; a re-run resumes the study."""


def is_passing(error: BaseException) -> bool:
    """Whether `error` (or an error it was raised from) is about reaching the storage, not about the data."""
    return _passes(_cause_of(error))


def _passes(error: BaseException) -> bool:
    if isinstance(error, ConnectionError):  # refused, reset, aborted (a raw socket)
        return True
    if "grpc" in sys.modules and isinstance(error, sys.modules["grpc"].RpcError):  # a gRPC storage proxy
        code = error.code() if callable(getattr(error, "code", None)) else None
        return code in (sys.modules["grpc"].StatusCode.UNAVAILABLE, sys.modules["grpc"].StatusCode.DEADLINE_EXCEEDED)
    if isinstance(error, OSError) and error.errno in _PASSING_OS_ERRORS:
        return True
    try:
        import sqlalchemy.exc as db
    except ImportError:  # only journal storages are possible then
        return False
    if isinstance(error, db.DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, (db.InterfaceError, db.TimeoutError, db.DisconnectionError)):
        return True
    if isinstance(error, db.OperationalError):  # SQLite's OperationalError also means "no such table": not that
        text = str(error).lower()
        sqlite = "sqlite" in type(error.orig).__module__ if error.orig is not None else False
        return not sqlite or any(reason in text for reason in _SQLITE_PASSING)
    return False


class _Outage:
    """When the storage stopped answering (shared by the threads that call it), and the two lines about it."""

    def __init__(self, patience: float, clock: Callable[[], float]) -> None:
        self.patience, self.clock = patience, clock
        self.lock = threading.Lock()
        self.since: float | None = None  # clock time of the first failed call of this outage
        self.back_at = clock()  # when the storage came back from its last outage, or was opened
        self.gave_up: str | None = None

    def failed(self, error: BaseException) -> float:
        """Note a failed call; the seconds of patience left."""
        with self.lock:
            if self.since is None:
                self.since = self.clock()
                _log.warning(
                    "storage unreachable since %s (%s), retrying for up to %.0f s",
                    datetime.now().strftime("%H:%M:%S"),
                    _short(error),
                    self.patience,
                )
            return self.patience - (self.clock() - self.since)

    def answered(self) -> None:
        if self.since is None:  # the common case: no lock taken
            return
        with self.lock:
            if self.since is not None:
                _log.warning("storage back after %.0f s", self.clock() - self.since)
                self.since, self.back_at = None, self.clock()


def _short(error: BaseException) -> str:
    """The error's kind and first line, without SQLAlchemy's background link (and any password
    a driver's message quotes). A wrapper is described by the error it was raised from that says
    the storage is out of reach: Optuna wraps a connection lost during a commit in "An exception is
    raised during the commit. This typically happens due to invalid data in the commit", which
    misleads for a server that stopped."""
    shown = _cause_of(error)
    first = str(shown).strip().splitlines()[0] if str(shown).strip() else ""
    return f"{type(shown).__name__}: {hide_passwords(first)[:160]}"


def _cause_of(error: BaseException) -> BaseException:
    """The first error in `error`'s chain (itself, then what it was raised from) that passes by waiting."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _passes(current):
            return current
        current = current.__cause__ or current.__context__
    return error


# What a database says when the first connection is refused for a reason that no wait mends: wrong
# credentials, a host name that does not resolve, a database or role that does not exist (PostgreSQL's
# SQLSTATE classes 28 and 3D; MySQL's 1044, 1045, 1049 and 2005). Matched in the driver's text: libpq
# gives no SQLSTATE for a connection it could not open.
_NEVER_PASSES_AT_START = (
    "authentication failed",
    "password authentication",
    "no password supplied",
    "access denied",
    "unknown database",
    "does not exist",
    "no pg_hba.conf entry",
    "could not translate host name",
    "failed to resolve host",
    "name or service not known",
    "nodename nor servname",
    "unknown mysql server host",
    "unknown host",
    "no address associated",
    "invalid dsn",
    "invalid connection option",
)


def passes_at_start(error: BaseException) -> bool:
    """Whether a first contact's `error` may pass by waiting (a server not yet up refuses the connection,
    or is "starting up"), unlike a wrong password, host name or database, which is refused at once."""
    if not is_passing(error):
        return False
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current).lower()
        if any(reason in text for reason in _NEVER_PASSES_AT_START):
            return False
        current = current.__cause__ or current.__context__
    return True


AT_START = "stopped before it began; nothing was stored"  # what a first contact that gave up did


def _retried(
    outage: _Outage,
    sleep: Callable[[float], None],
    call: Callable[..., Any],
    *args: Any,
    passing: Callable[[BaseException], bool] = is_passing,
    stopped: str = "stopped; trials left RUNNING are retried when the study is run again",
    **kwargs: Any,
) -> Any:
    """`call(*args, **kwargs)`, its `passing` errors retried with back-off until `outage`'s patience runs
    out; then StorageUnreachable, its line ending with what `stopped` says."""
    if outage.gave_up is not None:
        raise StorageUnreachable(outage.gave_up)
    delay = FIRST_DELAY_S
    while True:
        try:
            result = call(*args, **kwargs)
        except Exception as error:
            if not passing(error):
                raise
            left = outage.failed(error)
            if left <= 0:
                outage.gave_up = (
                    f"storage unreachable for {outage.patience:.0f} s (its patience; "
                    f"--storage-patience sets it): {_short(error)}; {stopped}"
                )
                raise StorageUnreachable(outage.gave_up) from None
            sleep(min(delay * random.uniform(0.5, 1.0), left))
            delay = min(2 * delay, MOST_DELAY_S)
            continue
        outage.answered()
        return result


def retried(
    call: Callable[..., Any],
    patience: float,
    *,
    passing: Callable[[BaseException], bool] = is_passing,
    stopped: str = AT_START,
) -> Any:
    """`call()`, retried through an outage of up to `patience` seconds (outside a storage: opening one);
    only errors `passing` accepts are waited out (`passes_at_start` for a first contact)."""
    return _retried(_Outage(patience, time.monotonic), time.sleep, call, passing=passing, stopped=stopped)


class PatientStorage(BaseStorage):
    """`inner`, with every call retried through outages of up to `patience` seconds (see the module docstring).

    `sleep` and `clock` are for tests (a fake clock); attributes that are not storage calls (an RDB
    storage's engine, a journal's backend) are read from `inner`. The wrapper keeps Optuna's storage
    contract: it pickles (a fresh outage record on the other side), and around a storage with heartbeats
    (`RDBStorage(url, heartbeat_interval=...)`) it is one too, its heartbeat calls retried like the rest,
    so Optuna's stale-trial recovery and failed-trial callback work through it."""

    def __new__(cls, inner: BaseStorage, *args: Any, **kwargs: Any) -> PatientStorage:
        if cls is PatientStorage and isinstance(inner, BaseHeartbeat):
            cls = PatientHeartbeatStorage
        return super().__new__(cls)

    def __init__(
        self,
        inner: BaseStorage,
        patience: float = DEFAULT_PATIENCE_S,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner, self.sleep = inner, sleep
        self.outage = _Outage(patience, clock)

    def __getattr__(self, name: str) -> Any:  # only for names the class does not have
        if "inner" not in self.__dict__:  # not built yet (unpickling): no storage to ask
            raise AttributeError(name)
        return getattr(self.__dict__["inner"], name)

    def __reduce__(self) -> tuple[Any, ...]:
        # The outage record holds a lock and a moment of this process: the copy starts with a fresh one.
        return (_rebuilt, (self.inner, self.outage.patience, self.sleep, self.outage.clock))

    def connected_for(self) -> float:
        """Seconds since the storage came back from its last outage, or was opened (0 during an outage):
        a worker that has just started may have missed an outage that ended a moment ago."""
        return 0.0 if self.outage.since is not None else self.outage.clock() - self.outage.back_at

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self.inner, name)
        if name in _READS_TRIALS:
            return self._checked(name, self.patiently(method, *args, **kwargs), *args, **kwargs)
        if name != "set_trial_state_values":
            return self.patiently(method, *args, **kwargs)
        tries = []

        def set_state() -> Any:
            tries.append(1)
            try:
                return method(*args, **kwargs)
            except optuna.exceptions.UpdateFinishedTrialError:
                if len(tries) > 1 and self._already_set(*args, **kwargs):
                    return True  # an earlier try was applied; only its reply was lost
                raise

        return self.patiently(set_state)

    def _checked(self, name: str, read: Any, *args: Any, **kwargs: Any) -> Any:
        """What a call that reads trials returned, its values checked to be numbers (`_stored_values`)."""
        if name == "get_all_trials":
            study_id = kwargs.get("study_id", args[0] if args else None)
            for trial in read:
                check_numbers(trial, lambda: self.inner.get_study_name_from_id(study_id))
            return read
        trial_id = read._trial_id
        return check_numbers(
            read, lambda: self.inner.get_study_name_from_id(self.inner.get_study_id_from_trial_id(trial_id))
        )

    def patiently(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`call(*args, **kwargs)`, retried through an outage of the storage (a lock on the same database)."""
        return _retried(self.outage, self.sleep, call, *args, **kwargs)

    def _already_set(self, trial_id: int, state: TrialState, values: Any = None, **_: Any) -> bool:
        stored = self.inner.get_trial(trial_id)
        return stored.state == state and (values is None or list(stored.values or []) == list(values))


_READS_TRIALS = ("get_all_trials", "get_trial", "get_best_trial")  # checked: values must be numbers


def _forwarded(name: str) -> Callable[..., Any]:
    def call(self: PatientStorage, *args: Any, **kwargs: Any) -> Any:
        return self._call(name, *args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = getattr(BaseStorage, name, getattr(BaseHeartbeat, name, None)).__doc__
    return call


def _rebuilt(
    inner: BaseStorage, patience: float, sleep: Callable[[float], None], clock: Callable[[], float]
) -> PatientStorage:
    return PatientStorage(inner, patience, sleep=sleep, clock=clock)


class PatientHeartbeatStorage(PatientStorage, BaseHeartbeat):
    """A PatientStorage around a storage with heartbeats (`PatientStorage(inner)` makes one when `inner`
    has them): Optuna finds the heartbeat (`is_heartbeat_enabled`) and its calls are retried too."""


# Every public call of an Optuna storage goes through `_call` (read from BaseStorage, so a call a
# newer Optuna adds is retried too); the class is then no longer abstract. So do the heartbeat's
# calls, which Optuna makes on the storage it is given (some are private names, read from the class).
for _name in [n for n in dir(BaseStorage) if not n.startswith("_") and callable(getattr(BaseStorage, n))]:
    setattr(PatientStorage, _name, _forwarded(_name))
for _name in [n for n in vars(BaseHeartbeat) if callable(getattr(BaseHeartbeat, n)) and not n.startswith("__")]:
    setattr(PatientHeartbeatStorage, _name, _forwarded(_name))
abc.update_abstractmethods(PatientStorage)
abc.update_abstractmethods(PatientHeartbeatStorage)


def patient(storage: BaseStorage | str, patience: float = DEFAULT_PATIENCE_S) -> PatientStorage:
    """Any Optuna storage (or URL), retried through outages of up to `patience` seconds; for
    `optuna.create_study(storage=patient("postgresql://...", 600))` and `hfta_nas.optimize`."""
    if isinstance(storage, PatientStorage):
        storage = storage.inner
    return PatientStorage(optuna.storages.get_storage(storage), patience)


def unwrapped(storage: Any) -> Any:
    """The storage a PatientStorage wraps (any other storage as it is)."""
    return storage.inner if isinstance(storage, PatientStorage) else storage
