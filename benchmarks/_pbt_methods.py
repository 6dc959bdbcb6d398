"""The four ways benchmarks/pbt.py trains one population's budget: each returns the run's figures.

- pbt: `search_spaces.run_search` on the space with its `pbt:` block (hfta-nas's
  population-based training in one array, `hfta_nas.pbt`);
- tpe: `run_search` on the same space without the block (the default hfta-nas
  search: TPE, arrays packed by cost, the pruner a search file gets by default,
  median, where the PBT file names none), n_trials = population;
- plain: Optuna's `study.optimize` on that space, one trial at a time, the plain
  PyTorch loop (benchmarks/_search_methods.py `run_plain`);
- ray_pbt: Ray Tune's PopulationBasedTraining of the plain loop (benchmarks/_ray_pbt.py),
  asynchronous (Ray's default); ray_pbt_sync: the same with `synch=True`, synchronous
  rounds as hfta-nas's PBT runs them.

Figures of a run: `seconds` (wall), `best_value` (the best final value: of a
completed trial, or of a member at the last epoch: what each method exports),
`curve` (the best value a user could keep, against seconds from the start:
completed trials for tpe and plain; for the PBT methods one point, the best
member's final value when the population ended, since a member's value
mid-run belongs to weights that later epochs and exploits replace; that
transient is kept apart as `peak_curve` and enters no statistic),
`epochs_trained` (slot-epochs),
`start_values` (trial or member number -> epoch -> value, for the epochs before the
first exploit: trials 0..P-1 of every method start from the same params and seeds).
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from benchmarks._anytime import best_so_far
from benchmarks._ray_pbt import run_ray_pbt
from benchmarks._search_methods import RUNNERS
from benchmarks.search import run_figures
from hfta_nas.search import open_storage
from hfta_nas.search_spaces import SearchSpace, run_search

METHODS = ("pbt", "tpe", "plain", "ray_pbt", "ray_pbt_sync")


# ----------------------------------------------------------------- the space
def resized(space: SearchSpace, population: int | None, epochs: int | None, interval: int | None) -> SearchSpace:
    """The space with another population, epoch count or interval (None: the file's)."""
    pbt, training = space.pbt, space.training
    pbt = pbt.model_copy(update={k: v for k, v in (("population", population), ("interval", interval)) if v})
    if epochs:
        training = training.model_copy(update={"epochs": epochs})
    return space.model_copy(update={"pbt": pbt, "training": training})


def without_pbt(space: SearchSpace) -> SearchSpace:
    """The same space searched the usual way: no pbt block, and the pruner a search gets by default
    (median) where the file names none (a pbt block never prunes, so its file usually does not)."""
    space = space.model_copy(update={"pbt": None})
    return space.with_overrides(pruner="median") if space.pruner.name in (None, "none") else space


# ------------------------------------------------------------------ methods
def run_pbt(space: SearchSpace, folder: Path, device: str, dtype: str, cpus: int | None) -> dict[str, Any]:
    wall = time.perf_counter()
    summary = run_search(
        space,
        storage=str(folder / "pbt.journal"),
        study_name="bench-pbt",
        device=device,
        dtype=dtype,
        out_dir=folder / "pbt",
    )
    seconds = time.perf_counter() - wall
    # The summary's clock starts once the data is loaded and the study opened; count all of that
    # before the first epoch, so the curve is never earlier than it could be.
    setup = max(0.0, seconds - summary.seconds)
    points = [(setup + t, "COMPLETE", v) for t, v in summary.curve if math.isfinite(v)]
    best = summary.best.get("value")
    study = optuna.load_study(study_name=summary.study_name, storage=open_storage(str(folder / "pbt.journal"))[0])
    return {
        "seconds": seconds,
        "best_value": best,
        "curve": [[seconds, best]] if best is not None else [],  # the exported member, at the end
        "peak_curve": [list(point) for point in best_so_far(points, summary.direction)],
        "epochs_trained": summary.population * summary.epochs,
        "exploits": summary.exploits,
        "setup_s": setup,
        "start_values": start_values(study.get_trials(), summary.interval),
    }


def start_values(trials: list[FrozenTrial], interval: int) -> dict[int, dict[int, float]]:
    """Each trial's reported values up to the first exploit's epoch."""
    return {t.number: {e: v for e, v in t.intermediate_values.items() if e <= interval} for t in trials}


def _searched(method: str) -> Any:
    def run(space: SearchSpace, folder: Path, device: str, dtype: str, cpus: int | None) -> dict[str, Any]:
        done = RUNNERS[method](without_pbt(space), space.pbt.population, device, dtype, folder, 1)
        return {**run_figures(done, space.directions[0]), "start_values": start_values(done.trials, space.pbt.interval)}

    return run


def _ray(synch: bool) -> Any:
    def run(space: SearchSpace, folder: Path, device: str, dtype: str, cpus: int | None) -> dict[str, Any]:
        return run_ray_pbt(space, device, dtype, folder, cpus, synch=synch)

    return run


RUNNERS_PBT = {
    "pbt": run_pbt,
    "tpe": _searched("pack"),
    "plain": _searched("plain"),
    "ray_pbt": _ray(synch=False),
    "ray_pbt_sync": _ray(synch=True),
}
IN_PROCESS = ("pbt", "tpe", "plain")  # warm in this process; the Ray methods start their own workers


def cold_startup_s(space: SearchSpace, device: str, dtype: str) -> float:
    """What a fresh process pays before its search can start: the interpreter, torch, hfta-nas and the
    space's data (the in-process methods' counterpart of Ray's start-up, for a ratio that counts
    start-up on both sides)."""
    config = space.resolve(space.suggest(optuna.trial.FixedTrial(_first_values(space))))
    script = (
        "import torch, hfta_nas.search_spaces; from hfta_nas.data import load_dataset; "
        f"load_dataset({config.dataset!r}, **{config.dataset_kwargs()!r}, device={device!r}, "
        f"dtype=getattr(torch, {dtype!r}))"
    )
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", script], check=True, cwd=Path(__file__).resolve().parents[1])
    return time.perf_counter() - started


def _first_values(space: SearchSpace) -> dict[str, Any]:
    """One value of every searched param (the data settings do not depend on them)."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    space.suggest(trial)
    return trial.params
