"""The four ways benchmarks/pbt.py trains one population's budget: each returns the run's figures.

- pbt: `search_spaces.run_search` on the space with its `pbt:` block (hfta-nas's
  population-based training in one array, `hfta_nas.pbt`);
- tpe: `run_search` on the same space without the block (the default hfta-nas
  search: TPE, arrays packed by cost, the pruner a search file gets by default,
  median, where the PBT file names none), n_trials = population;
- plain: Optuna's `study.optimize` on that space, one trial at a time, the plain
  PyTorch loop (benchmarks/_search_methods.py `run_plain`);
- ray_pbt: Ray Tune's PopulationBasedTraining of the plain loop (benchmarks/_ray_pbt.py).

Figures of a run: `seconds` (wall), `best_value` (the best final value: of a
completed trial, or of a member at the last epoch), `curve` (best so far against
seconds from the start: completed trials for tpe and plain, the population's
best at each epoch end for pbt and ray_pbt), `epochs_trained` (slot-epochs),
`start_values` (trial or member number -> epoch -> value, for the epochs before the
first exploit: trials 0..P-1 of every method start from the same params and seeds).
"""

from __future__ import annotations

import math
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

METHODS = ("pbt", "tpe", "plain", "ray_pbt")


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
    curve = best_so_far(points, summary.direction)
    study = optuna.load_study(study_name=summary.study_name, storage=open_storage(str(folder / "pbt.journal"))[0])
    return {
        "seconds": seconds,
        "best_value": summary.best.get("value"),
        "curve": [list(point) for point in curve],
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


def _ray(space: SearchSpace, folder: Path, device: str, dtype: str, cpus: int | None) -> dict[str, Any]:
    return run_ray_pbt(space, device, dtype, folder, cpus)


RUNNERS_PBT = {"pbt": run_pbt, "tpe": _searched("pack"), "plain": _searched("plain"), "ray_pbt": _ray}
