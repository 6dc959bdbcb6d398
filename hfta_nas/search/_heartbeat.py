"""Heartbeats for ask-and-tell trials, so a dead worker's trials never stay RUNNING.

Optuna records heartbeats only inside `study.optimize`; a search asks and tells
its trials itself, so it keeps its own. While a worker holds trials (an array
training, or candidates asked and waiting for their array) a background thread
stamps each of them with the user attribute `heartbeat` (`time.time()`) every
`interval` seconds, besides the stamp the driver writes every epoch (epochs can
be long). Before each round of asks every worker looks at the RUNNING trials it
does not hold and calls one stale when

* its worker ran on this machine (same host name and process namespace) and
  that process is gone: stale at once (a killed single-worker run is retried
  as soon as it is re-run), or
* its last heartbeat is older than `grace` seconds (3 intervals), or
* it has no heartbeat and started more than `startup_grace` seconds ago (the
  few seconds between asking a trial and its first heartbeat are not enough).

Heartbeat ages are judged only by a worker that has reached the storage for
longer than `grace` plus the longest pause between retries since its last
outage (or since it opened the storage: it may have started just after one):
when a database comes back after a restart every heartbeat is as old as the
outage, and the workers that hold those trials need their next retry and one
interval to beat again. (Every worker's heartbeat thread reads the storage
each interval, even holding nothing, so each sees an outage.) A worker cut off alone (a network
partition) past the grace does lose its trials to the others; its late results
are then dropped (`UpdateFinishedTrialError`: "taken over"), never counted twice.

Stale trials are failed with `fail_reason` "interrupted: ..." and their
parameters enqueued again: failed-and-retried, not resumed from a checkpoint
(an array's slots share one optimizer and data stream; a retried trial
re-trains from epoch 0 with the same seeds, so it ends as it would have).

The interval is `HFTA_NAS_HEARTBEAT` seconds (default 10). Heartbeats compare
clocks across machines: keep them synchronised (NTP) to well under `grace`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable

import optuna
from optuna.trial import FrozenTrial, TrialState

from hfta_nas.search._optuna_private import storage_of, study_id, trial_id
from hfta_nas.search._patience import MOST_DELAY_S, StorageUnreachable

HEARTBEAT_ATTR = "heartbeat"
WORKER_ATTR = "worker"  # "host:pid"
WORKER_HOST_ATTR = "worker_host"  # host name and process namespace: where a pid means something
DEFAULT_INTERVAL = 10.0

_log = logging.getLogger(__name__)


def heartbeat_interval() -> float:
    """Seconds between heartbeats: `HFTA_NAS_HEARTBEAT`, else 10."""
    text = os.environ.get("HFTA_NAS_HEARTBEAT")
    if not text:
        return DEFAULT_INTERVAL
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        from hfta_nas.errors import HftaNasError

        raise HftaNasError(f"HFTA_NAS_HEARTBEAT must be a positive number of seconds, got {text!r}.")
    return value


def host_identity() -> str:
    """This machine's host name and PID namespace: two processes with equal
    identities can check each other's pids (containers sharing a host name cannot)."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return f"{socket.gethostname()}/{namespace}"


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed child its parent has not reaped yet is a zombie: dead
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def stale_reason(
    trial: FrozenTrial,
    *,
    now: float,
    interval: float | None = None,
    me: str | None = None,
    connected_for: float = float("inf"),
) -> str | None:
    """Why a RUNNING trial that this worker does not hold is stale, or None while it is alive
    (or while this worker, back from an outage `connected_for` seconds ago, cannot tell)."""
    interval = interval or heartbeat_interval()
    grace, startup_grace = 3 * interval, max(3 * interval, 120.0)
    attrs = trial.user_attrs
    worker = attrs.get(WORKER_ATTR)
    if isinstance(worker, str) and attrs.get(WORKER_HOST_ATTR) == host_identity():
        pid = worker.rpartition(":")[2]
        if worker == me:
            return f"this worker ({worker}) left it RUNNING without holding it"
        if pid.isdigit() and not _process_alive(int(pid)):
            return f"its worker {worker} has exited"
    if connected_for <= grace + MOST_DELAY_S:  # the holders may not have beaten since the storage came back
        return None
    beat = attrs.get(HEARTBEAT_ATTR)
    if isinstance(beat, (int, float)):
        return f"no heartbeat for {now - beat:.0f} s (grace {grace:.0f} s)" if now - beat > grace else None
    if trial.datetime_start is None or now - trial.datetime_start.timestamp() > startup_grace:
        return f"no heartbeat since it started (grace {startup_grace:.0f} s)"
    return None


class Heartbeat:
    """A daemon thread that stamps the RUNNING trials in `held()` (trial ids) every
    `interval` seconds; use as a context manager around the worker's run."""

    def __init__(self, study: optuna.Study, held: Callable[[], Iterable[int]], interval: float | None = None) -> None:
        # It only stamps: a trial's worker attributes are written where it is asked (`_Search._ask`).
        self.study, self.held = study, held
        self.interval = interval or heartbeat_interval()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hfta-nas-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except StorageUnreachable:  # the worker stops: its main thread says why
                return
            except Exception as error:  # a storage hiccup must not stop the beats
                _log.warning("heartbeat failed: %s: %s", type(error).__name__, error)

    def beat(self) -> int:
        """Stamp every held trial that is still RUNNING; returns how many were stamped."""
        try:
            held = set(self.held())
        except RuntimeError:  # the driver changed what it holds mid-read: next beat
            return 0
        storage, now, stamped = storage_of(self.study), time.time(), 0
        if not held:  # a read all the same: this worker sees an outage as the workers that hold trials do
            storage.get_all_trials(study_id(self.study), deepcopy=False, states=(TrialState.RUNNING,))
            return 0
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if trial_id(trial) not in held:
                continue
            try:  # the driver may tell the trial meanwhile: then the write is refused, harmlessly
                storage.set_trial_user_attr(trial_id(trial), HEARTBEAT_ATTR, now)
                stamped += 1
            except optuna.exceptions.UpdateFinishedTrialError:
                continue
        return stamped
