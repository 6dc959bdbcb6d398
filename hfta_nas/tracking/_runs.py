"""`Runs`: hands runs to every tracker on a thread of its own, so that training never
waits on a tracker (a slow server, a first-time database set-up), and a tracker that fails
is warned about once and dropped: a tracker never fails a trial or the search."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from hfta_nas.tracking._base import Tracker

log = logging.getLogger("hfta_nas.tracking")
# How long closing waits for calls still queued (a tracking server that stopped answering
# may hold each call for minutes in its client's retries); what is left then is dropped.
CLOSE_WAIT_S = 120.0


class Runs:
    """Runs keyed by the caller (a trial number, a seed) in each of `trackers`."""

    def __init__(self, trackers: Iterable[Tracker]) -> None:
        self.trackers = list(trackers)
        self.handles: list[dict[Hashable, Any]] = [{} for _ in self.trackers]  # touched by the worker thread only
        self.failed: set[int] = set()  # trackers dropped after an error
        self.open: set[Hashable] = set()  # keys started and not ended (the caller's thread)
        self.calls: queue.Queue = queue.Queue()
        self.worker = threading.Thread(target=self._work, name="hfta-nas tracking", daemon=True)
        self.worker.start()

    def start(self, key: Hashable, group: str, name: str, params: Mapping[str, Any], attributes: Mapping[str, Any]):
        self.open.add(key)
        self.calls.put(("start", key, (group, name, dict(params), dict(attributes))))

    def log(self, key: Hashable, step: int, metrics: Mapping[str, float]) -> None:
        self.calls.put(("log", key, (step, dict(metrics))))

    def end(self, key: Hashable, final: Mapping[str, float], state: str, reason: str = "") -> None:
        self.open.discard(key)
        self.calls.put(("end", key, (dict(final), state, reason)))

    def close(self, wait: float = CLOSE_WAIT_S) -> None:
        """End the runs still open as INTERRUPTED and wait (at most `wait` seconds) for the calls
        to go out."""
        for key in list(self.open):
            self.end(key, {}, "INTERRUPTED", "the run stopped while it trained")
        self.calls.put(None)
        self.worker.join(wait)
        if self.worker.is_alive():
            log.warning("tracking: calls still queued after %.0f s were dropped (is the tracking server up?)", wait)

    # ------------------------------------------------------------ the worker
    def _work(self) -> None:
        while (call := self.calls.get()) is not None:
            for index in range(len(self.trackers)):
                self._call(index, *call)

    def _call(self, index: int, what: str, key: Hashable, arguments: tuple) -> None:
        tracker, handles = self.trackers[index], self.handles[index]
        if what == "start":
            handles[key] = self._guarded(index, tracker.start, *arguments)
        elif key in handles:  # a run its tracker could not open is skipped
            run = handles[key] if what == "log" else handles.pop(key)
            self._guarded(index, tracker.log if what == "log" else tracker.end, run, *arguments)

    def _guarded(self, index: int, method: Any, *arguments: Any) -> Any:
        if index in self.failed:
            return None
        try:
            return method(*arguments)
        except Exception as error:  # any failure of a tracker: warn once, go on without it
            self.failed.add(index)
            name = self.trackers[index].name
            log.warning("tracking: %s failed (%s: %s); going on without it", name, type(error).__name__, error)
            return None
