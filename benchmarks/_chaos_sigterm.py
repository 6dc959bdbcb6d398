"""SIGTERM rounds of the chaos benchmark: what Slurm's time limit, `scancel`, `docker stop` and
systemd send, landed mid-array.

A round runs a search (1-3 workers), a stability study or a PBT population, waits until an array is
part-way (a trial RUNNING with an epoch reported, or an epoch's checkpoint on disk), then a drawn
0-0.5 s, and sends SIGTERM to the command, or to every process of it as a scheduler does. The command
must end with exit 143, the line `terminated by SIGTERM` and no traceback; nothing it held may be
left RUNNING (a search's arrays are told as interrupted, naming SIGTERM, and queued again; a PBT
population alone stays RUNNING, its checkpoint kept for the next run); then the same command, run
again, must finish the study exactly as a clean run of it (`_chaos_rounds.search_problems`,
`_chaos_rounds.stability_problems`, `_chaos_pbt.pbt_problems`), leaving no checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from benchmarks import _chaos_rounds as rounds
from benchmarks._chaos_pbt import pbt_problems, pbt_space_text
from hfta_nas.search import Outcome, open_storage, outcome_of

MID_ARRAY_GUARD_S = 300  # a command that shows no array part-way this long is signalled anyway
TERMINATED_LINE = "terminated by SIGTERM"


@dataclass
class TermDraw:
    """What one SIGTERM round does."""

    round: int
    command: str  # search | stability | pbt
    storage: str  # journal | sqlite | postgresql
    workers: int
    target: str  # command | every process (a scheduler signals all of a job's processes)
    after_s: float  # seconds after an array is first seen part-way


def draw_sigterm_round(rng: random.Random, number: int, storages: list[str]) -> TermDraw:
    what = rng.choice(["search", "stability", "pbt"])
    workers = rng.choice([1, 2, 3]) if what == "search" else 1
    return TermDraw(
        number,
        what,
        rng.choice(storages),
        workers,
        rng.choice(["command", "every process"]),
        round(rng.uniform(0.0, 0.5), 2),
    )


def write_inputs(draw_command: str, folder: Path, name: str, epochs: int) -> rounds.Draw:
    """The round's space or config in `folder`, and the draw `_chaos_rounds.command` builds its argv from
    (a PBT space runs through `search`)."""
    if draw_command == "pbt":
        (folder / "space.yaml").write_text(pbt_space_text(name, epochs))
    else:
        (folder / "space.yaml").write_text(rounds.space_text(name, epochs))
        (folder / "config.yaml").write_text(rounds.stability_config(epochs))
    return rounds.Draw(0, "stability" if draw_command == "stability" else "search", "", 1, "", "command", 0, 0)


def _readable_storage(url: str) -> Any | None:
    """The round's storage once the command has made it (a journal file is not opened before it
    exists: reading must create nothing the command is about to create)."""
    if "://" not in url and (not os.path.exists(url) or not os.path.getsize(url)):
        return None
    with contextlib.suppress(Exception):
        return open_storage(url)[0]
    return None


def _part_way(folder: Path, storage: Any | None) -> bool:
    """Whether some array has trained an epoch and not ended: a checkpoint is on disk (stability,
    PBT, most search arrays), or a RUNNING trial has reported an epoch (a search's arrays may skip
    a checkpoint: they spend at most 2% of their time writing them)."""
    if any(folder.rglob("checkpoints/*/*.pt")):
        return True
    if storage is None:
        return False
    with contextlib.suppress(Exception):
        for study in storage.get_all_studies():
            running = storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.RUNNING,))
            if any(t.intermediate_values for t in running):
                return True
    return False


def terminated_run(draw: TermDraw, argv: list[str], folder: Path, url: str) -> tuple[bool, int]:
    """Run `argv`, send SIGTERM once an array is part-way, and wait for the command to end;
    whether the signal found it running mid-array, and its exit status."""
    log = folder / "terminated.log"
    with open(log, "wb") as stream:
        process = subprocess.Popen(argv, cwd=folder, env=rounds.env(), stdout=stream, stderr=subprocess.STDOUT)
    deadline, storage, seen = time.monotonic() + MID_ARRAY_GUARD_S, None, False
    while time.monotonic() < deadline and process.poll() is None and not seen:
        storage = storage or (_readable_storage(url) if draw.command == "search" else None)
        seen = _part_way(folder, storage)
        time.sleep(0.05)
    time.sleep(draw.after_s)
    hit = seen and process.poll() is None
    if process.poll() is None:
        targets = [process.pid] + (rounds.workers_of(process.pid) if draw.target == "every process" else [])
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    try:
        process.wait(timeout=600)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    return hit, process.returncode


def stopped_problems(draw: TermDraw, code: int, folder: Path, url: str) -> list[str]:
    """What the SIGTERMed command broke before any re-run: its exit, its line, what it left running."""
    printed = (folder / "terminated.log").read_text(errors="replace")
    problems = []
    if code != 143:
        problems.append(f"exit {code} after SIGTERM, not 143:\n{printed[-1500:]}")
    if TERMINATED_LINE not in printed.splitlines() or "Traceback" in printed:
        problems.append(f"no line {TERMINATED_LINE!r}, or a traceback:\n{printed[-1500:]}")
    if draw.command == "pbt":  # its members wait, RUNNING, for the next run to continue them
        if not any(folder.rglob("checkpoints/*/pbt.pt")):
            problems.append("the stopped PBT run left no checkpoint to continue from")
        return problems
    storage = open_storage(url)[0]
    for study in storage.get_all_studies():
        trials = storage.get_all_trials(study._study_id, deepcopy=False)
        running = [t.number for t in trials if t.state == TrialState.RUNNING]
        if running:
            problems.append(f"study {study.study_name}: trials {running} left RUNNING by SIGTERM")
        if draw.command == "search":
            problems += _search_stop_problems(trials)
    return problems


def _search_stop_problems(trials: list[Any]) -> list[str]:
    """A SIGTERMed search's trials: each that failed was told as interrupted, naming SIGTERM (and
    queued again), or was a surplus retry; one failed any other way is an array the stop lost.
    None told as interrupted is no loss: a SIGTERM of the --workers parent alone reaches its
    workers 2 s later, when the arrays seen part-way may have ended, and the budget with them."""
    problems = []
    told = [t for t in trials if "interrupted_because" in t.user_attrs]
    if any("SIGTERM" not in str(t.user_attrs["interrupted_because"]) for t in told):
        problems.append(f"interrupted_because does not name SIGTERM: {told[0].user_attrs}")
    allowed = (Outcome.INTERRUPTED, Outcome.SURPLUS)
    lost = [t.number for t in trials if t.state == TrialState.FAIL and outcome_of(t) not in allowed]
    if lost:
        problems.append(f"trials {lost} failed other than as interrupted by SIGTERM: the array in flight was lost")
    return problems


def run_sigterm_round(
    draw: TermDraw, base: Path, postgres: str | None, reference: dict[str, Any], epochs: int
) -> tuple[list[str], int, bool, bool]:
    """The round's broken invariants, how many results equal a clean run's, whether SIGTERM landed
    mid-array, and whether the re-run continued from a checkpoint."""
    folder = base / f"round-{draw.round}"
    folder.mkdir()
    name = f"chaos{draw.round}"
    argv_draw = write_inputs(draw.command, folder, name, epochs)
    argv_draw.workers = draw.workers
    url = rounds.storage_url(draw.storage, folder, postgres, name)
    argv = rounds.command(argv_draw, folder, url)
    hit, code = terminated_run(draw, argv, folder, url)
    problems = stopped_problems(draw, code, folder, url) if hit else []
    continued = any(folder.rglob("checkpoints/*/*.pt"))  # what the re-run may continue from
    if rounds.clean_run(argv, folder / "rerun.log"):
        problems.append(f"the re-run failed:\n{(folder / 'rerun.log').read_text(errors='replace')[-1500:]}")
        return problems, 0, hit, False
    found, compared, resumed = finished_problems(draw.command, folder, url, name, reference)
    resumed = resumed or (draw.command == "pbt" and continued)
    left = sorted(str(p.relative_to(folder)) for p in folder.rglob("checkpoints/*/*.pt"))
    if left:
        found.append(f"checkpoints left after the re-run: {left}")
    return problems + found, compared, hit, resumed


def finished_problems(
    what: str, folder: Path, url: str, name: str, reference: dict[str, Any], export_required: bool = True
) -> tuple[list[str], int, bool]:
    """A finished study's invariants against the clean runs, how many results equal theirs, and
    whether the run continued an array from its checkpoint (`export_required`: see
    `_chaos_rounds.search_problems`)."""
    if what == "stability":
        problems, compared = rounds.stability_problems(folder / "report", reference["stability"])
        return problems, compared, rounds.stability_resumed(folder / "report")
    if what == "pbt":
        problems, compared = pbt_problems(url, name, folder / "out", reference["pbt"])
        return problems, compared, False  # a PBT run's continuation is seen by its checkpoint, before it
    problems, compared = rounds.search_problems(url, name, folder / "out", reference["search"], export_required)
    trials = optuna.load_study(study_name=name, storage=open_storage(url)[0]).get_trials(deepcopy=False)
    return problems, compared, any("resumed_from_epoch" in t.user_attrs for t in trials)
