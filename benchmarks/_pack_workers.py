"""`pack-workers`: the shipped packing in W worker processes on one study, as `hfta-nas search
--workers W` runs it (each worker a process with `HFTA_NAS_WORKER` set and 1 torch thread; the
budget is counted in the shared journal). The workers share the space's sampler seed, as under
`--workers` today; the figures in the README were measured when each worker had its own.

Like `processes`, the workers warm up (imports, data, first kernels) before a barrier and the
clock starts when all have passed it: start-up is not the search's. The wall time runs to the
last worker's end (a worker with nothing left to ask waits for the others' trials, as under
`--workers`). The time account is the workers' mean, phase by phase.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import queue as queue_module
import tempfile
import time
import traceback
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
import torch

from benchmarks._search_common import SearchRun, barrier_wait, one_epoch
from hfta_nas.search import open_storage
from hfta_nas.search_spaces import SearchSpace, open_space_study, run_search

PROCESS_TIMEOUT_S = 1800.0


def _pack_worker(
    index: int,
    space: SearchSpace,
    n_trials: int,
    storage: str,
    study_name: str,
    device: str,
    dtype: str,
    folder: str,
    barrier: Any,
    results: Any,
) -> None:
    try:
        os.environ["HFTA_NAS_WORKER"] = str(index)  # as `--workers` sets it for each worker
        torch.set_num_threads(1)
        optuna.logging.set_verbosity(optuna.logging.WARNING)

        with tempfile.TemporaryDirectory(prefix="bench-pack-warm-") as warm:
            run_search(
                one_epoch(space),
                storage=str(Path(warm) / "warm.journal"),
                study_name="warm",
                n_trials=2,
                device=device,
                dtype=dtype,
                out_dir=Path(warm) / "out",
            )
        barrier.wait(timeout=PROCESS_TIMEOUT_S)
        cpu = time.process_time()
        summary = run_search(
            space,
            storage=storage,
            study_name=study_name,
            n_trials=n_trials,
            device=device,
            dtype=dtype,
            out_dir=Path(folder) / f"worker{index}",
        )
        results.put((index, time.perf_counter(), time.process_time() - cpu, _extra(summary), None))
    except BaseException:  # the parent reports it; a child must not hang the barrier
        barrier.abort()
        results.put((index, math.nan, 0.0, {}, traceback.format_exc()))


def _extra(summary: Any) -> dict[str, Any]:
    return {
        "arrays": len(summary.arrays),
        "mean_occupancy": summary.mean_occupancy,
        "time_account": {k: v["seconds"] for k, v in summary.time_account.items()},
    }


def run_pack_workers(space: SearchSpace, n_trials: int, device: str, dtype: str, folder: Path, processes: int) -> Any:
    """The SearchRun of `processes` pack workers on one journal study."""

    storage, name = str(folder / "pack-workers.journal"), "bench-pack-workers"
    open_space_study(space, storage, name)  # created once, before the workers race for it
    context = mp.get_context("spawn")
    barrier, results = context.Barrier(processes + 1), context.Queue()
    children = [
        context.Process(
            target=_pack_worker,
            args=(i, space, n_trials, storage, name, device, dtype, str(folder), barrier, results),
            daemon=True,
        )
        for i in range(processes)
    ]
    for child in children:
        child.start()
    barrier_wait(barrier, children)
    start, wall = datetime.now(), time.perf_counter()
    cpu, end, errors, extras = 0.0, wall, [], []
    for _ in children:
        try:
            _, finished, seconds, extra, error = results.get(timeout=PROCESS_TIMEOUT_S)
        except queue_module.Empty:
            errors.append("a worker process gave no result")
            break
        cpu, end = cpu + seconds, max(end, finished)
        extras.append(extra)
        if error:
            errors.append(error)
    for child in children:
        child.join(timeout=10)
    if errors:
        raise RuntimeError("a pack worker failed:\n" + "\n".join(errors))
    trials = optuna.load_study(study_name=name, storage=open_storage(storage)[0]).get_trials()
    account: dict[str, float] = {}  # the workers' mean: shares of the wall time, as for one process
    for extra in extras:
        for phase, seconds in extra["time_account"].items():
            account[phase] = account.get(phase, 0.0) + seconds / len(extras)
    occupancy = sum(e["mean_occupancy"] for e in extras) / len(extras)
    return SearchRun(
        end - wall,
        cpu,
        trials,
        start,
        {
            "workers": processes,
            "arrays": sum(e["arrays"] for e in extras),
            "mean_occupancy": occupancy,
            "time_account": account,
        },
    )
