"""A budgeted run of benchmark phases on a lent GPU: one subprocess per phase, one JSON for all.

A GPU is lent for minutes, and each command on it may run for at most ten, so
a GPU benchmark is a list of phases in priority order, each with a share of
the budget and the least time it needs to say anything (`Phase.min_s`). When
the budget is short, the phases from the end of the list whose share falls
below their minimum are dropped first and their shares go to the others, so a
trimmed run still measures the most important phases properly instead of
every phase badly. Each phase runs as its own subprocess, stopped at its
share: a hung or slow phase costs its own share only. A phase's module writes
its JSON to the `--out` it is given (a phase that writes nothing keeps its
printed output in the record instead).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TAIL_CHARS = 3000  # of a phase's printed output kept in the record
START_UP_S = 8.0  # a phase's interpreter, torch import and CUDA context before it measures anything


@dataclass(frozen=True)
class Phase:
    """One subprocess: `python -m module *arguments --device D --out F` with `environment` added."""

    name: str
    share: float  # of the budget, before dropped phases' shares are handed on
    min_s: float  # below this it measures nothing useful: dropped instead
    module: str
    arguments: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    writes_json: bool = True  # False: its printed output is the result (a profile)
    tail_chars: int = TAIL_CHARS
    # A group decided at run time: called with the records so far, it gives the phases to run in
    # this one's place, sharing its seconds (the profiles of the targets the phases before missed).
    expand: Callable[[list[dict[str, Any]]], list[Phase]] | None = None
    # When set, the module is told `--deadline-s` (its seconds less this margin) and stops itself in
    # time: what it finished is then written whole, not cut off by the kill at the budget.
    deadline_margin_s: float | None = None


def allocate(phases: list[Phase], budget_s: float) -> dict[str, float]:
    """Seconds per phase that runs: shares of `budget_s`; while some phase's share is below its `min_s`,
    the last phase of the list is dropped and its share goes to the phases kept, in proportion."""
    kept = list(phases)
    while kept:
        total = sum(p.share for p in kept)
        seconds = {p.name: budget_s * p.share / total for p in kept}
        if all(seconds[p.name] >= p.min_s for p in kept):
            return seconds
        kept.pop()
    return {}


class GpuWatch:
    """nvidia-smi's utilisation and memory, sampled every half second in the background (nothing where
    nvidia-smi is missing), so each phase's record says how busy the GPU was while it ran."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuWatch:
        if smi(["--query-gpu=name", "--format=csv,noheader"]) is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            line = smi(["--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"])
            if line:
                used, memory = (float(v) for v in line.splitlines()[0].split(","))
                self.samples.append((time.monotonic(), used, memory))

    def between(self, start: float, end: float) -> dict[str, float] | None:
        window = [(u, m) for t, u, m in self.samples if start <= t <= end]
        if not window:
            return None
        return {
            "utilisation_mean_pct": sum(u for u, _ in window) / len(window),
            "utilisation_max_pct": max(u for u, _ in window),
            "memory_max_mib": max(m for _, m in window),
        }


def smi(arguments: list[str]) -> str | None:
    """nvidia-smi's output, or None where it is missing or fails."""
    try:
        done = subprocess.run(["nvidia-smi", *arguments], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def run_phase(phase: Phase, device: str, seconds: float, folder: Path) -> dict[str, Any]:
    """Run one phase for at most `seconds`; its record (figures None where it wrote none)."""
    out = folder / f"{phase.name.replace(' ', '-')}.json"
    command = [sys.executable, "-m", phase.module, *phase.arguments, "--device", device]
    if phase.writes_json:
        command += ["--out", str(out)]
    if phase.deadline_margin_s is not None:
        command += ["--deadline-s", f"{max(seconds - phase.deadline_margin_s, 1.0):.0f}"]
    started = time.monotonic()
    # A session of its own: at the budget the whole group goes (a phase's worker processes hold its
    # pipes open, and would keep the wait going after the phase itself is killed).
    child = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, **phase.environment, "PYTHONPATH": _python_path()},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = child.communicate(timeout=seconds)
        how = "finished" if child.returncode == 0 else f"exited with status {child.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        output, _ = child.communicate()
        how = f"stopped at its budget of {seconds:.0f} s"
    figures = json.loads(out.read_text()) if phase.writes_json and out.exists() else None
    return {
        "phase": phase.name,
        "command": " ".join(command),
        "environment": phase.environment,
        "budget_s": round(seconds, 1),
        "how": how,
        "seconds": round(time.monotonic() - started, 1),
        "figures": figures,
        "output_tail": output[-phase.tail_chars :],
        "_window": (started, time.monotonic()),
    }


def _python_path() -> str:
    """The checkout first, then what the caller had (the GPU kit's folder of wheels)."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


def run_phases(phases: list[Phase], budget_s: float, device: str, folder: Path) -> list[dict[str, Any]]:
    """Every phase in order, each within its allocated seconds and the budget left; a dropped phase
    (its share below its minimum) or one the budget no longer reaches is recorded as not run."""
    allocated = allocate(phases, budget_s)
    started = time.monotonic()
    records: list[dict[str, Any]] = []
    with GpuWatch() as watch:
        for phase in phases:
            left = budget_s - (time.monotonic() - started)
            if phase.name not in allocated:
                records.append({"phase": phase.name, "how": f"not run: dropped to fit a budget of {budget_s:.0f} s"})
                continue
            if left < min(phase.min_s, allocated[phase.name]):
                records.append({"phase": phase.name, "how": f"not run: {left:.0f} s of the budget left"})
                continue
            seconds = min(allocated[phase.name], left)
            parts = phase.expand(records) if phase.expand else [phase]
            if not parts:
                records.append({"phase": phase.name, "how": "nothing to run"})
            for part in parts:
                record = run_phase(part, device, seconds / len(parts), folder)
                record["gpu"] = watch.between(*record.pop("_window"))
                records.append(record)
                print(f"{part.name}: {record['how']} in {record['seconds']} s", file=sys.stderr, flush=True)
    return records


def machine_record(device: str, budget_s: float) -> dict[str, Any]:
    """Where and when the phases ran: the GPU (name, driver, memory), the host's load, the versions."""
    import torch  # noqa: PLC0415 - the parent needs torch only for this record

    versions = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("optuna", "numpy", "scipy", "sqlalchemy"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "gpu": smi(["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "budget_s": budget_s,
        "versions": versions,
    }
