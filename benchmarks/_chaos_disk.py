"""The full-disk round of the chaos benchmark: `--out` on a disk that fills while the best
weights are staged and published.

`--out` is a 1 MiB tmpfs (mounting needs root) filled by a file that leaves a drawn 0-12 KiB
free: less than a search's or a population's files. The command must train and tell every trial
(none FAIL, none RUNNING, the budget counted), end with exit 2 and one `error:` line naming the
full disk, and print no traceback. Then the filler is removed (space freed) and the same command,
run again, must end with exit 0 and a study that holds every invariant of a clean run
(`_chaos_rounds.search_problems`, `_chaos_pbt.pbt_problems`), but one: a search's best weights that the
full disk took (its line names the trial whose weights are not saved) are not trained again, so
no best pair may be published, though never another trial's. Every mount is removed at the round's end,
and what a crashed run left under the benchmark's folder at its end.
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from benchmarks import _chaos_rounds as rounds
from benchmarks._chaos_sigterm import finished_problems, write_inputs
from hfta_nas.search import counts, open_storage

DISK_BYTES = 1 << 20
FREE_KIB = (0, 4, 8, 12)


@dataclass
class DiskDraw:
    """What one full-disk round does."""

    round: int
    command: str  # search | pbt
    storage: str  # journal | sqlite | postgresql
    free_kib: int  # what the filler leaves free on --out's disk


def draw_disk_round(rng: random.Random, number: int, storages: list[str]) -> DiskDraw:
    return DiskDraw(number, rng.choice(["search", "pbt"]), rng.choice(storages), rng.choice(FREE_KIB))


def why_not() -> str | None:
    """Why no small disk can be mounted here (None when one can)."""
    with tempfile.TemporaryDirectory(prefix="hfta-nas-chaos-mount-") as folder:
        try:
            with small_disk(Path(folder) / "out", 0):
                return None
        except (OSError, subprocess.CalledProcessError) as error:
            return f"mounting a tmpfs failed ({error}); the full-disk round needs root"


@contextlib.contextmanager
def small_disk(folder: Path, free_kib: int) -> Iterator[Path]:
    """`folder` on a 1 MiB tmpfs with `free_kib` left free; yields the filler file (removing it frees
    the disk). Unmounted on the way out."""
    folder.mkdir(parents=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(folder)], check=True, capture_output=True
    )
    try:
        filler = folder / ".filler"
        with open(filler, "wb") as stream, contextlib.suppress(OSError):  # ENOSPC at the page's end
            stream.write(b"\0" * (DISK_BYTES - 1024 * free_kib))
        yield filler
    finally:
        unmount(folder)


def unmount(folder: Path) -> None:
    """Unmount `folder`; lazily when something still holds it (a process of a crashed round)."""
    if subprocess.run(["umount", str(folder)], capture_output=True).returncode:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def mounts_under(base: Path) -> list[Path]:
    """The mount points under `base` (a crashed run's small disks), deepest first."""
    points = []
    for line in Path("/proc/mounts").read_text().splitlines():
        point = Path(line.split()[1].replace("\\040", " "))
        if point == base or base in point.parents:
            points.append(point)
    return sorted(points, key=lambda p: len(p.parts), reverse=True)


def full_disk_problems(what: str, code: int, log: Path, url: str, name: str) -> list[str]:
    """What the run that filled the disk broke: its exit and line, and any trial it failed."""
    printed = log.read_text(errors="replace")
    errors = [line for line in printed.splitlines() if line.startswith("error: ")]
    problems = []
    if code != 2 or "Traceback" in printed:
        problems.append(f"exit {code} on a full disk, not 2 (or a traceback):\n{printed[-1500:]}")
    if len(errors) != 1 or "no space left on the device" not in errors[0]:
        problems.append(f"not one error line naming the full disk: {errors}")
    trials = optuna.load_study(study_name=name, storage=open_storage(url)[0]).get_trials(deepcopy=False)
    unfinished = [f"{t.number} {t.state.name}" for t in trials if t.state != TrialState.COMPLETE]
    if unfinished:
        reasons = [t.user_attrs.get("fail_reason") for t in trials if t.state == TrialState.FAIL]
        problems.append(f"trials not COMPLETE after a full disk: {unfinished} {reasons}")
    if what == "search" and sum(1 for t in trials if counts(t)) != rounds.N_TRIALS:
        problems.append(f"{sum(1 for t in trials if counts(t))} trials counted, expected {rounds.N_TRIALS}")
    return problems


def run_disk_round(
    draw: DiskDraw, base: Path, postgres: str | None, reference: dict[str, Any], epochs: int
) -> tuple[list[str], int, bool]:
    """The round's broken invariants, how many results equal a clean run's, and whether the disk
    filled (the first run ended on it)."""
    folder = base / f"round-{draw.round}"
    folder.mkdir()
    name = f"chaos{draw.round}"
    url = rounds.storage_url(draw.storage, folder, postgres, name)
    argv = rounds.command(write_inputs(draw.command, folder, name, epochs), folder, url)
    with small_disk(folder / "out", draw.free_kib) as filler:
        code = rounds.clean_run(argv, folder / "full.log")
        filled = code != 0
        problems = full_disk_problems(draw.command, code, folder / "full.log", url, name) if filled else []
        filler.unlink()  # space freed: the same command must finish the study
        if rounds.clean_run(argv, folder / "rerun.log"):
            problems.append(f"the re-run failed:\n{(folder / 'rerun.log').read_text(errors='replace')[-1500:]}")
            return problems, 0, filled
        # a search's best weights the full disk took are not trained again: its run said so, naming the
        # trial (a population's are written from its checkpoint)
        lost = "weights are not saved" in (folder / "full.log").read_text(errors="replace")
        found, compared, _ = finished_problems(draw.command, folder, url, name, reference, not lost)
    return problems + found, compared, filled
