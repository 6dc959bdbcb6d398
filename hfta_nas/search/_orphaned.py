"""A `--workers` worker whose parent is gone stops as its parent would have stopped it.

On Linux the kernel sends a worker SIGINT the moment its parent dies (`_workers`
asks for it before exec), and the worker stops as on Ctrl-C, telling its trials.
That signal can be missed: one that lands while a worker holds interrupts back
or ignores them (asking a trial, telling trials after an error) is gone, and
other systems send none. So each worker also watches its parent's pid; once the
parent is gone and the worker still runs `STOP_GRACE_S` later, it signals
itself as the parent's stop does (SIGINT, SIGTERM, then SIGKILL), instead of
training on, orphaned, to the end of the budget. The wait first leaves room for
a worker that got the signal and is telling its trials: a second SIGINT then is
ignored, as a second Ctrl-C is.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from hfta_nas.search._workers import PARENT_ENV, STOP_GRACE_S, stop_escalation

POLL_S = 1.0  # how often the parent's pid is looked at (a system call)


def stop_when_orphaned(grace_s: float = STOP_GRACE_S) -> threading.Thread | None:
    """In a worker of `--workers` (its parent's pid in the environment): a daemon thread that
    watches the parent and stops this process once the parent is gone; None elsewhere."""
    parent = os.environ.pop(PARENT_ENV, "")  # for this process only: not a process it starts
    if not parent.isdigit() or os.getppid() != int(parent):  # not the worker its parent started
        return None
    watcher = threading.Thread(target=_watch, args=(int(parent), grace_s), name="hfta-nas-orphan-watch", daemon=True)
    watcher.start()
    return watcher


def _watch(parent: int, grace_s: float) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    time.sleep(grace_s)  # the worker that got the kernel's SIGINT has stopped (and this thread with it)
    for sig, then_wait_s in stop_escalation(signal.SIGINT, grace_s):
        # to the main thread, where Python runs signal handlers: a signal the kernel hands to this thread
        # leaves a main thread blocked in a wait (a lock, a join) asleep until SIGKILL (clean-clone CI once)
        signal.pthread_kill(threading.main_thread().ident, sig)
        time.sleep(then_wait_s)
