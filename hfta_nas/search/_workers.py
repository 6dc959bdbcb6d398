"""`hfta-nas search ... --workers K`: running K local worker processes on one study.

The command line decides what each worker runs (`worker_commands` in search_spaces/_cli.py: the same
`hfta-nas search` command without `--workers`); this module starts them,
relays their output and stops them. The workers share one storage; they
cooperate through it as workers on several machines do (the budget is counted
in the storage under a study lock, dead workers' trials are retried; see
`_driver` and `_heartbeat`). With several GPUs visible and a CUDA device asked
for, worker i sees only GPU i mod count (`CUDA_VISIBLE_DEVICES`); on CPU the cores are shared out with `--threads`
unless given. Their output is relayed line by line, prefixed `[worker i]`.
Ctrl-C (SIGINT) reaches every worker; a SIGTERM of this process (a scheduler's
time limit, scancel, docker stop) is forwarded to them, and each stops as on
Ctrl-C; any still running 10 s later is signalled again, then killed. Trials a
stopped worker held are retried by the next run on the study.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hfta_nas.search._recovery import stop_signal

PARENT_ENV = "HFTA_NAS_WORKER_PARENT"  # a worker's parent pid: each worker watches it (`_orphaned`)
STOP_GRACE_S = 10.0  # how long a worker signalled to stop may take to tell its trials before SIGTERM


@dataclass
class WorkerExit:
    """How one worker process ended."""

    worker: int
    pid: int
    returncode: int
    seconds: float
    cuda_visible_devices: str | None = None

    @property
    def how(self) -> str:
        if self.returncode == 0:
            return "finished"
        if self.returncode < 0:
            try:
                return f"killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"killed by signal {-self.returncode}"
        return f"exited with status {self.returncode}"


def visible_gpus() -> list[str]:
    """The GPUs this process sees, as CUDA_VISIBLE_DEVICES entries."""
    try:
        import torch

        count = torch.cuda.device_count()
    except Exception:  # no CUDA build, no driver
        count = 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        entries = [v.strip() for v in visible.split(",") if v.strip()]
        return entries[:count] if count else []
    return [str(i) for i in range(count)]


def run_workers(
    commands: Sequence[tuple[list[str], dict[str, str]]],
    *,
    echo: Callable[[str], None] | None = None,
    grace_s: float = STOP_GRACE_S,
) -> list[WorkerExit]:
    """Start one worker process per (argv, environment) of `commands` (the command line builds
    them: `worker_commands` in search_spaces/_cli.py), relay their output through `echo`, wait
    for all, and return how each ended. A KeyboardInterrupt (Ctrl-C, or SIGTERM through the
    command line's handler) stops them all with the same signal, then SIGTERM, then SIGKILL, and
    is raised again."""
    echo = echo or (lambda line: print(line, file=sys.stderr, flush=True))
    started = time.monotonic()
    processes: list[subprocess.Popen] = []
    relays: list[threading.Thread] = []
    envs: list[dict[str, str]] = []
    try:
        for worker, (argv, env) in enumerate(commands):
            process = subprocess.Popen(
                argv,
                env={**env, PARENT_ENV: str(os.getpid())},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                bufsize=1,
                preexec_fn=_stop_when_parent_dies(os.getpid()),
            )
            processes.append(process)
            envs.append(env)
            relay = threading.Thread(target=_relay, args=(process, f"[worker {worker}] ", echo), daemon=True)
            relay.start()
            relays.append(relay)
        for process in processes:
            process.wait()
    except KeyboardInterrupt as stop:
        _stop(processes, grace_s, stop_signal(stop))
        raise
    finally:
        for relay in relays:
            relay.join(timeout=5)
    seconds = time.monotonic() - started
    return [
        WorkerExit(
            i, p.pid, p.returncode, seconds, envs[i].get("CUDA_VISIBLE_DEVICES") if len(visible_gpus()) > 1 else None
        )
        for i, p in enumerate(processes)
    ]


def _stop_when_parent_dies(parent: int) -> Callable[[], None]:
    """In the worker, before exec: Ctrl-C's default action back, and on Linux a request for SIGINT
    when this parent dies (SIGKILL, the OOM killer), so a worker stops as on Ctrl-C, telling its
    trials, instead of running on orphaned. A shell starts a background job (`hfta-nas search &` in
    a batch script) with SIGINT ignored; a worker that inherited that would ignore both this signal
    and the stop its parent forwards. Elsewhere than Linux a worker whose parent died ends with its
    budget, and a re-run retries what it held."""

    def arrange() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # the worker's Python then raises KeyboardInterrupt on it
        if not sys.platform.startswith("linux"):
            return
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGINT)
        if os.getppid() != parent:  # the parent died before the request: stop now
            os._exit(130)

    return arrange


def _relay(process: subprocess.Popen, prefix: str, echo: Callable[[str], None]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        echo(prefix + line.rstrip("\n"))


def stop_escalation(first: signal.Signals, grace_s: float) -> list[tuple[signal.Signals, float]]:
    """How a worker is stopped: `first`, then SIGTERM, then SIGKILL, each with how long to wait
    for it (the parent's `_stop`, and an orphaned worker's own watch, `_orphaned`)."""
    return [(first, grace_s), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)]


def _stop(processes: list[subprocess.Popen], grace_s: float, first: signal.Signals = signal.SIGINT) -> None:
    """Send `first` (the signal that stopped this process) to every worker still running (a
    terminal's Ctrl-C, or a scheduler's SIGTERM to every process of a job, reached them already;
    a `kill` of this process alone did not), then SIGTERM, then SIGKILL."""
    steps = [(None, 2.0), *stop_escalation(first, grace_s)]
    if first == signal.SIGTERM:
        del steps[2]  # sent already
    for sig, wait in steps:
        alive = [p for p in processes if p.poll() is None]
        if not alive:
            return
        for process in alive if sig is not None else ():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(sig)
        deadline = time.monotonic() + wait
        for process in alive:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.0, deadline - time.monotonic()))


def study_report(storage: str | None, study_name: str, exits: list[WorkerExit]) -> dict[str, Any]:
    """What the workers left in the study: trials by state (interrupted retries and
    surplus apart), the best value(s), and how each worker ended. StorageUnreachable when the
    storage cannot be reached (the workers may have stopped on that outage)."""
    import optuna
    from optuna.trial import TrialState

    from hfta_nas.errors import HftaNasError
    from hfta_nas.search._ledger import Outcome, counts, outcome_of
    from hfta_nas.search._patience import StorageUnreachable, is_passing
    from hfta_nas.search._storage import open_storage

    try:
        opened, location = open_storage(storage)
    except HftaNasError as error:
        if not is_passing(error):
            raise
        # workers that stopped on an outage said so; the caller decides what more to say
        raise StorageUnreachable(f"the study's storage cannot be reached to report on it: {error}") from error
    study = optuna.load_study(study_name=study_name, storage=opened)
    states: dict[str, int] = {}
    retried = surplus = counted = 0
    for trial in study.get_trials(deepcopy=False):
        outcome = outcome_of(trial)
        retried += outcome == Outcome.INTERRUPTED
        surplus += outcome == Outcome.SURPLUS
        counted += counts(trial)
        states[trial.state.name] = states.get(trial.state.name, 0) + 1
    best = None
    if study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        best = [{"number": t.number, "values": list(t.values)} for t in study.best_trials]
    return {
        "study": study_name,
        "storage": location,
        "trials": states,
        "interrupted_and_retried": retried,
        "surplus": surplus,
        "counted": counted,
        "best": best,
        "workers": [
            {
                "worker": e.worker,
                "pid": e.pid,
                "returncode": e.returncode,
                "how": e.how,
                "cuda_visible_devices": e.cuda_visible_devices,
            }
            for e in exits
        ],
    }
