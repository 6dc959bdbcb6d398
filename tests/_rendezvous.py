"""Event-based meetings between a test and the processes it starts: named pipes, never sleeps.

A process that reaches a point the test waits for writes a line (its pid) to the `ready` pipe
and, when it must hold there, blocks on the `go` pipe until the test releases it. The test
acts while the process is held: it kills it, interrupts it (the KeyboardInterrupt comes out of
the wait, where the process stands), or releases it. Nothing depends on how fast either side
runs; the only time limit is a guard against a hung test.

Processes started with `held_command(...)` hold at the first place where a condition holds:
`point(name, subject, **info)` is called at a trial's report ("report", the optuna Trial,
step=epoch), after an array's checkpoint is written ("checkpoint", the Checkpointer) and when an
array's epoch has trained ("epoch", the ArrayTrainer; any command), and the
condition is a `module:function` named in the process's environment. Only the first process
(of all started with one Rendezvous) to meet its condition holds; the others run on.
"""

from __future__ import annotations

import importlib
import os
import select
import subprocess
import sys
import time
from pathlib import Path

FOLDER = "HFTA_NAS_TEST_RENDEZVOUS"
WHEN = "HFTA_NAS_TEST_HOLD_WHEN"
GUARD_S = 900  # a hung test fails after this long; nothing waits for it otherwise


class Rendezvous:
    """The test's side: the pipes in `folder`, and waits on them."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        for name in ("ready", "go"):
            os.mkfifo(self.folder / name)
        # The read end, and a write end kept open so that the pipe never reads as ended.
        self._ready = os.open(self.folder / "ready", os.O_RDONLY | os.O_NONBLOCK)
        self._keep = os.open(self.folder / "ready", os.O_WRONLY | os.O_NONBLOCK)
        self._lines = b""

    def env(self, when: str | None = None) -> dict[str, str]:
        """Environment entries for a process that should meet this rendezvous (and hold when
        `when`, a 'module:function', says so)."""
        return {FOLDER: str(self.folder), **({WHEN: when} if when else {})}

    def wait(self, count: int = 1, processes: list[subprocess.Popen] = ()) -> list[int]:
        """The pids of the first `count` processes that arrived; fails when one of `processes`
        ended first (with the logs' help left to the caller)."""
        deadline = time.monotonic() + GUARD_S
        while self._lines.count(b"\n") < count:
            ended = [p for p in processes if p.poll() is not None]
            if ended:
                raise AssertionError(f"process {ended[0].pid} ended (exit {ended[0].returncode}) before it arrived")
            if time.monotonic() > deadline:
                raise AssertionError(f"no process arrived in {GUARD_S} s")
            readable, _, _ = select.select([self._ready], [], [], 1.0)  # wakes at once on arrival
            if readable:
                self._lines += os.read(self._ready, 4096)
        lines = self._lines.split(b"\n")
        arrived, self._lines = lines[:count], b"\n".join(lines[count:])
        return [int(line) for line in arrived]

    def release(self) -> None:
        """Let every process held on `go` go on."""
        os.close(os.open(self.folder / "go", os.O_WRONLY))  # readers see the pipe's writer come and go

    def close(self) -> None:
        os.close(self._ready)
        os.close(self._keep)


def wait_for(condition, what: str, every_s: float = 0.1):
    """`condition()`'s first true value, checked again and again: for a state that, once
    reached, stays (a study's trials held by workers), so how often it is looked at changes
    nothing but how soon the test goes on."""
    deadline = time.monotonic() + GUARD_S
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not in {GUARD_S} s")
        time.sleep(every_s)
    return value


def wait_exited(pids: set[int]) -> None:
    """Until every process in `pids` (not necessarily children of this one) has exited: Linux
    says so on a pidfd when the process ends."""
    handles = {}
    for pid in pids:
        try:
            handles[pid] = os.pidfd_open(pid)
        except ProcessLookupError:  # already gone
            continue
    try:
        for pid, handle in handles.items():
            readable, _, _ = select.select([handle], [], [], GUARD_S)
            assert readable, f"process {pid} still runs after {GUARD_S} s"
    finally:
        for handle in handles.values():
            os.close(handle)


# ------------------------------------------------------------------ the process's side
def arrive_and_hold() -> None:
    """Say this process arrived, then wait until the test releases it (or kills or interrupts it)."""
    folder = Path(os.environ[FOLDER])
    go = os.open(folder / "go", os.O_RDONLY | os.O_NONBLOCK)  # opened before arriving: no release is missed
    try:
        ready = os.open(folder / "ready", os.O_WRONLY)
        os.write(ready, f"{os.getpid()}\n".encode())
        os.close(ready)
        select.select([go], [], [])  # readable once the test's writer has come and gone
    finally:
        os.close(go)


def _first_to_claim(folder: Path) -> bool:
    try:
        os.close(os.open(folder / "held", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def point(name: str, subject, **info) -> None:
    """A place where the process may hold: when the condition holds here and no process of this
    rendezvous has held yet."""
    module, _, function = os.environ[WHEN].partition(":")
    if getattr(importlib.import_module(module), function)(name, subject, **info) and _first_to_claim(
        Path(os.environ[FOLDER])
    ):
        arrive_and_hold()


def install_points() -> None:
    """Call `point` at every trial report, after every array checkpoint and at every array epoch's
    end of this process."""
    import optuna

    from hfta_nas.training._checkpoint import Checkpointer
    from hfta_nas.training._trainer import ArrayTrainer

    report, save, epochs = optuna.trial.Trial.report, Checkpointer.__call__, ArrayTrainer.epochs

    def reported(trial, value, step):
        report(trial, value, step)
        point("report", trial, step=step)

    def saved(checkpointer, trainer):
        save(checkpointer, trainer)
        point("checkpoint", checkpointer)

    def trained(trainer, *args, **kwargs):
        for epoch in epochs(trainer, *args, **kwargs):
            point("epoch", trainer)
            yield epoch

    optuna.trial.Trial.report, Checkpointer.__call__, ArrayTrainer.epochs = reported, saved, trained


def held_command(*args: str) -> list[str]:
    """The hfta-nas command line `args`, run in a process that holds where the rendezvous says."""
    return [sys.executable, "-m", "tests._rendezvous", *args]


if __name__ == "__main__":
    if os.environ.get(WHEN):
        install_points()
    from hfta_nas.cli import main

    sys.argv[0] = "hfta-nas"
    main()
