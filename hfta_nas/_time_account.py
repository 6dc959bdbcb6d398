"""Where a run's wall time went, phase by phase.

A `TimeAccount` charges every moment of the caller's thread to exactly one
phase: entering a phase pauses the one it is nested in (a refill asking a
trial in the middle of an epoch's bookkeeping is charged to "ask", not twice),
and time spent in no phase is "other". So the phases of `seconds()` add up to
the wall time since the account started, by construction; a report with a
large "other" shows a phase nobody named yet.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

# The phases of a search, in the order a round meets them.
PHASES = ("ask", "checks", "packing", "cost", "build", "training", "evaluation", "checkpoints", "storage", "waiting")
OTHER = "other"
# Training steps and evaluation are the work itself; every other phase is overhead.
WORK = ("training", "evaluation")


class TimeAccount:
    """Exclusive seconds per phase of one thread's run; see the module docstring."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self._seconds = dict.fromkeys(PHASES, 0.0)
        self._stack: list[str] = []
        self._since = self.started

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Charge the time inside the block to `name` (and not to the phase it interrupts)."""
        if name not in self._seconds:
            raise ValueError(f"unknown phase {name!r}; the phases are {', '.join(PHASES)}")
        self._charge()
        self._stack.append(name)
        try:
            yield
        finally:
            self._charge()
            self._stack.pop()

    def _charge(self) -> None:
        now = time.perf_counter()
        if self._stack:
            self._seconds[self._stack[-1]] += now - self._since
        self._since = now

    def seconds(self) -> dict[str, float]:
        """Seconds per phase so far, `other` included: they sum to the wall time since the start."""
        wall = time.perf_counter() - self.started
        charged = dict(self._seconds)
        if self._stack:  # a phase still open (a report from inside the run)
            charged[self._stack[-1]] += time.perf_counter() - self._since
        charged[OTHER] = max(wall - sum(charged.values()), 0.0)
        return charged

    def report(self) -> dict[str, dict[str, float]]:
        """{phase: {"seconds", "share"}} with the share of the wall time, plus "overhead":
        everything but training steps and evaluation."""
        charged = self.seconds()
        wall = max(sum(charged.values()), 1e-12)
        rows = {name: {"seconds": round(s, 4), "share": round(s / wall, 4)} for name, s in charged.items()}
        overhead = sum(s for name, s in charged.items() if name not in WORK)
        rows["overhead"] = {"seconds": round(overhead, 4), "share": round(overhead / wall, 4)}
        return rows


class NoAccount:
    """A TimeAccount that records nothing (the default of engine calls outside a search)."""

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        yield
