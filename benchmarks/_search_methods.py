"""The six ways benchmarks/search.py runs one search: each returns a `SearchRun`.

- plain: Optuna's `study.optimize`, one trial at a time, each trial the plain
  PyTorch loop of benchmarks/stability.py (`plain_run`) reporting the study's
  metric every epoch for the pruner;
- plain-journal: the same on an Optuna journal file (`JournalFileBackend`), the durable storage
  `pack` writes by default (a resumable study the dashboard reads): every report and attribute is
  a locked, fsynced append, as it is for `pack`;
- processes: the co-location baseline, as a user runs it: P spawned processes
  (default: one per core available) share one Optuna journal file, each runs
  the same objective under `study.optimize` with the same torch thread count
  (P jobs on one device: CUDA MPS, or one job per core), on all the cores this
  process may use (not pinned further). Trials are split between them exactly
  (the budget is not overshot); each has its own sampler seed (the same seed
  would make them propose the same values). Start-up, imports and a one-epoch
  warm-up trial are not timed (`extra["startup_s"]`): the clock starts when all
  P have passed a barrier;
- ray: Ray Tune, `OptunaSearch` (the space's sampler, seeded) + `ASHAScheduler`,
  P concurrent trials, each the plain objective (benchmarks/_ray_search.py);
- hfta: HFTA-style search, random sampler and equal shapes fused only
  (`run_search` with `sampler: random` and `array.max_waste: 0`);
- replicate: `run_search` with `array.fill: replicate` (each array's other
  slots copy its first trial's architecture);
- pack: `run_search` as shipped (the sampler's trials packed by measured cost);
- pack-workers: the same in P worker processes on one study, as `hfta-nas search
  --workers P` runs it (benchmarks/_pack_workers.py): the 2-core answer to `processes`.

Every method gets the same space, budget (trials and epochs), per-trial seeds
(`trial_seeds(space seed, trial number)`) and torch thread count per trial; all
but `ray` the space's pruner (Ray prunes with ASHA, see its module).
"""

from __future__ import annotations

import functools
import math
import multiprocessing as mp
import os
import queue as queue_module
import time
import traceback
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
import torch
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from benchmarks._pack_workers import run_pack_workers
from benchmarks._ray_search import run_ray
from benchmarks._search_common import PROCESS_TIMEOUT_S, SearchRun, barrier_wait, one_epoch, plain_objective
from hfta_nas.search import open_storage
from hfta_nas.search_spaces import SearchSpace, run_search

METHODS = ("plain", "plain-journal", "processes", "ray", "hfta", "replicate", "pack", "pack-workers")
DEFAULT_METHODS = ("plain", "plain-journal", "processes", "ray", "pack", "pack-workers")


# ------------------------------------------------------------- the objective
# ----------------------------------------------------------------- methods
def warm_up(space: SearchSpace, device: str, dtype: str, datasets: dict[str, Any]) -> None:
    """One throw-away trial of one epoch in a memory study: loads the data into `datasets` and
    pays the process's first-use costs (lazy imports, kernels) before any clock starts."""
    study = optuna.create_study(directions=space.directions, sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(plain_objective(one_epoch(space), device, dtype, datasets), n_trials=1)


def run_plain(
    space: SearchSpace, n_trials: int, device: str, dtype: str, folder: Path, processes: int, journal: bool = False
) -> SearchRun:
    storage = None
    if journal:
        folder.mkdir(parents=True, exist_ok=True)
        storage = optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(folder / "plain.journal"))
        )
    start, wall, cpu = datetime.now(), time.perf_counter(), time.process_time()
    study = optuna.create_study(
        storage=storage,
        directions=space.directions,
        sampler=space.make_sampler(seed=space.seed),
        pruner=space.make_pruner(),
    )
    study.optimize(plain_objective(space, device, dtype), n_trials=n_trials)
    return SearchRun(time.perf_counter() - wall, time.process_time() - cpu, study.get_trials(), start)


def available_cores() -> list[int]:
    """The cores this process may run on (its CPU affinity): what a user's processes would share."""
    return sorted(os.sched_getaffinity(0))


def _worker(
    index: int,
    space: SearchSpace,
    share: int,
    storage_path: str,
    study_name: str,
    device: str,
    dtype: str,
    threads: int,
    barrier: Any,
    results: Any,
) -> None:
    try:
        torch.set_num_threads(threads)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = JournalStorage(JournalFileBackend(storage_path))
        study = optuna.load_study(
            study_name=study_name,
            storage=storage,
            pruner=space.make_pruner(),
            sampler=space.make_sampler(seed=space.seed * 1009 + index),
        )
        datasets: dict[str, Any] = {}
        warm_up(space, device, dtype, datasets)
        objective = plain_objective(space, device, dtype, datasets)
        barrier.wait(timeout=PROCESS_TIMEOUT_S)
        cpu = time.process_time()
        study.optimize(objective, n_trials=share)
        # perf_counter is CLOCK_MONOTONIC on Linux: one clock for all processes
        results.put((index, time.perf_counter(), time.process_time() - cpu, None))
    except BaseException:  # the parent reports it; a child must not hang the barrier
        barrier.abort()
        results.put((index, math.nan, 0.0, traceback.format_exc()))


def run_processes(
    space: SearchSpace, n_trials: int, device: str, dtype: str, folder: Path, processes: int
) -> SearchRun:
    started = time.perf_counter()
    storage_path, name = str(folder / "processes.journal"), "bench-processes"
    storage = JournalStorage(JournalFileBackend(storage_path))
    optuna.create_study(study_name=name, storage=storage, directions=space.directions)
    shares = [n_trials // processes + (i < n_trials % processes) for i in range(processes)]
    context = mp.get_context("spawn")
    barrier, results = context.Barrier(processes + 1), context.Queue()
    children = [
        context.Process(
            target=_worker,
            args=(i, space, share, storage_path, name, device, dtype, torch.get_num_threads(), barrier, results),
            daemon=True,
        )
        for i, share in enumerate(shares)
        if share
    ]
    for child in children:
        child.start()
    barrier_wait(barrier, children)
    start, wall = datetime.now(), time.perf_counter()
    startup = wall - started  # spawning, imports, the data and each worker's warm-up trial: not the search's
    cpu, end, errors = 0.0, wall, []
    for _ in children:
        try:
            _, finished, seconds, error = results.get(timeout=PROCESS_TIMEOUT_S)
        except queue_module.Empty:
            errors.append("a worker process gave no result")
            break
        cpu, end = cpu + seconds, max(end, finished)
        if error:
            errors.append(error)
    for child in children:
        child.join(timeout=10)
    seconds = end - wall  # to the last worker's last trial; process teardown is not the search's
    if errors:
        raise RuntimeError("a worker process failed:\n" + "\n".join(errors))
    trials = optuna.load_study(study_name=name, storage=storage).get_trials()
    return SearchRun(
        seconds, cpu, trials, start, {"processes": len(children), "cores": available_cores(), "startup_s": startup}
    )


def variant(space: SearchSpace, method: str) -> SearchSpace:
    """The space as `method` runs it (hfta: random sampler, equal shapes only; replicate: copies fill arrays)."""
    if method == "hfta":
        space = space.with_overrides(sampler="random")
        return space.model_copy(update={"array": space.array.model_copy(update={"max_waste": 0.0})})
    if method == "replicate":
        return space.model_copy(update={"array": space.array.model_copy(update={"fill": "replicate"})})
    return space


def run_arrays(method: str) -> Callable[..., SearchRun]:
    def run(space: SearchSpace, n_trials: int, device: str, dtype: str, folder: Path, processes: int) -> SearchRun:
        storage = str(folder / f"{method}.journal")
        start, wall, cpu = datetime.now(), time.perf_counter(), time.process_time()
        summary = run_search(
            variant(space, method),
            storage=storage,
            study_name=f"bench-{method}",
            n_trials=n_trials,
            device=device,
            dtype=dtype,
            out_dir=folder / method,
        )
        seconds, cpu = time.perf_counter() - wall, time.process_time() - cpu
        trials = optuna.load_study(study_name=summary.study_name, storage=open_storage(storage)[0]).get_trials()
        extra = {"arrays": len(summary.arrays), "mean_occupancy": summary.mean_occupancy, "waste": summary.waste}
        # ---- hook: the search's time account (SearchSummary.time_account: phase -> seconds, or phase ->
        # {"seconds", "share"}), kept as phase -> seconds; benchmarks/search.py prints it as shares of wall time.
        account = getattr(summary, "time_account", None)
        if account:
            extra["time_account"] = {
                phase: float(value["seconds"] if isinstance(value, dict) else value) for phase, value in account.items()
            }
        return SearchRun(seconds, cpu, trials, start, extra)

    return run


RUNNERS: dict[str, Callable[..., SearchRun]] = {
    "plain": run_plain,
    "plain-journal": functools.partial(run_plain, journal=True),
    "processes": run_processes,
    "ray": run_ray,
    "hfta": run_arrays("hfta"),
    "replicate": run_arrays("replicate"),
    "pack": run_arrays("pack"),
    "pack-workers": run_pack_workers,
}
