"""Trials a dead worker left RUNNING: found, failed as interrupted, and retried.

While a worker holds trials its heartbeat thread stamps them (`_heartbeat`).
Before each round of asks, every worker looks at the RUNNING trials it does
not hold; a stale one (`stale_reason`) is told FAIL with the outcome
INTERRUPTED (not counted against the budget) and its parameters are enqueued
again with the user attribute `retry_of`, so the retry trains with the same
seeds and ends as the interrupted trial would have (an array's slots share one
optimizer and data stream, so a slot cannot resume from a checkpoint alone).

Why not Optuna's own machinery (Optuna 5.0): its heartbeat
(`RDBStorage(heartbeat_interval=...)`, `fail_stale_trials`) exists for RDB
storages only, and only when the storage object was opened with it; the
journal file, our default, has none. Beats are recorded by `study.optimize`'s
trial loop, not for trials asked and told by hand as an array's are. A stale
trial is found only after the grace period, where a worker on this machine
that has exited can be seen at once (`stale_reason`). And
`RetryHeartbeatStaleTrialCallback` copies the failed trial's user attributes
(our outcome and training times) into the retry, which must start clean. One
mechanism therefore serves every storage; retries keep Optuna's convention of
a WAITING trial with the same parameters (`enqueue_trial`).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator

import optuna
from optuna.trial import FrozenTrial, TrialState

from hfta_nas.search._events import TrialRetried
from hfta_nas.search._heartbeat import stale_reason
from hfta_nas.search._ledger import RETRY_OF, Ledger, Outcome
from hfta_nas.search._optuna_private import storage_of, trial_id
from hfta_nas.search._patience import PatientStorage

INTERRUPTED = "interrupted: its worker stopped (killed, crashed or lost) while it ran; failed and retried"

# The signals that stop a worker cleanly, as Ctrl-C does: SIGINT raises KeyboardInterrupt (Python's
# own handler), SIGTERM (a scheduler's time limit, scancel, docker stop, kill) a KeyboardInterrupt
# whose `signum` says so (the command line installs that handler).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_STOPPED_BY = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}


def stop_signal(stop: BaseException | None) -> signal.Signals:
    """The signal behind a KeyboardInterrupt: the one its `signum` names, else SIGINT."""
    return signal.Signals(getattr(stop, "signum", signal.SIGINT))


def retry_stale_trials(ledger: Ledger, held: Collection[int], worker: str, emit: Callable[[object], None]) -> int:
    """Fail and re-enqueue every stale RUNNING trial not in `held` (trial ids); how many."""
    study, now, retried = ledger.study, time.time(), 0
    storage = storage_of(study)
    connected_for = storage.connected_for() if isinstance(storage, PatientStorage) else float("inf")
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        why = None if trial_id(trial) in held else stale_reason(trial, now=now, me=worker, connected_for=connected_for)
        if why is None:
            continue
        retried += fail_and_retry(ledger, trial, why, emit)
    return retried


def fail_and_retry(ledger: Ledger, trial: FrozenTrial | optuna.Trial, why: str, emit: Callable[[object], None]) -> bool:
    """Tell a RUNNING trial FAIL as interrupted (not counted) and enqueue its parameters again,
    to train with its seeds; False when it had been told meanwhile (by its worker, or another
    worker that retried it first)."""
    study, held_id = ledger.study, trial_id(trial)
    try:
        storage_of(study).set_trial_user_attr(held_id, "interrupted_because", why)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    if not ledger.fail(trial, Outcome.INTERRUPTED, INTERRUPTED):
        return False
    frozen = storage_of(study).get_trial(held_id)
    original = frozen.user_attrs.get(RETRY_OF, frozen.number)  # a retry of a retry keeps the first seeds
    study.enqueue_trial(
        frozen.params or frozen.system_attrs.get("fixed_params", {}),
        user_attrs={RETRY_OF: original},
        skip_if_exists=False,
    )
    emit(TrialRetried(frozen.number, why))
    return True


def interrupt_held(ledger: Ledger, held: Collection[optuna.Trial], emit: Callable[[object], None]) -> None:
    """Ctrl-C or SIGTERM: the trials this worker holds are failed as interrupted and queued again
    at once, so nothing is left RUNNING and the next run trains them first. Called while the
    KeyboardInterrupt is handled: its signal is named in each trial's `interrupted_because`."""
    why = f"{_STOPPED_BY[stop_signal(sys.exc_info()[1])]} stopped its search"
    told: list[object] = []  # events are emitted once every trial is told: printing may fail now
    with ledger.lock:  # (a killed parent took the worker's stdout with it)
        for trial in held:
            if ledger.is_running(trial):
                fail_and_retry(ledger, trial, why, told.append)
    for event in told:
        with contextlib.suppress(Exception):
            emit(event)


WAIT_POLL_S = 0.25  # how often a worker with nothing to do looks whether the others are done (a storage read)


def wait_for_other_workers(
    ledger: Ledger, worker: str, emit: Callable[[object], None], time_left: Callable[[], bool], interval: float
) -> bool:
    """This worker holds nothing and the budget is taken, but other workers' trials still
    run: wait, retrying any that go stale. True when there is budget again."""
    while time_left():
        if not ledger.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            return False
        with ledger.lock:
            if retry_stale_trials(ledger, (), worker, emit) or ledger.remaining() > 0:
                return True
        time.sleep(min(interval, WAIT_POLL_S))
    return False


@contextlib.contextmanager
def interrupts_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM ignored while a stopping worker tells its trials (main thread only;
    elsewhere nothing): a second Ctrl-C or SIGTERM (a scheduler signals every process of a job,
    the --workers parent forwards it too), or one that reached another thread, must not cut the
    telling short. The caller retries once more for a signal that arrived just before."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM held back until the block ends, then delivered to the handler they would
    have reached (main thread only; elsewhere nothing): for a step that must not be cut in two, such
    as asking a trial and recording it as held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {signum: signal.signal(signum, lambda got, frame: arrived.append(got)) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if arrived:
        signal.raise_signal(arrived[0])


def told_despite_interrupts(tell: Callable[[], None], attempts: int = 3) -> None:
    """Run `tell` to its end with SIGINT and SIGTERM ignored; a KeyboardInterrupt raised from a signal that
    came in just before is absorbed and `tell` runs again (it skips what it already told)."""
    with interrupts_ignored():
        for attempt in range(attempts):
            try:
                tell()
                return
            except KeyboardInterrupt:
                if attempt == attempts - 1:
                    raise
