"""A seed study as a user co-locates it: P processes sharing one device, each training its share
of the seeds with the plain loop of benchmarks/stability.py (`plain_run`), one after another.

Each process loads the data and trains one throw-away epoch before a barrier (the
imports, the CUDA context and the first kernels are not the study's: `startup_s`);
the clock runs from the barrier to the last process's last seed. Seed plan i goes
to process i mod P, so every process gets the same number of seeds (+-1).
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import queue as queue_module
import time
import traceback
from typing import Any

import torch

from benchmarks._search_common import PROCESS_TIMEOUT_S, barrier_wait
from benchmarks.stability import plain_run
from hfta_nas.data import load_dataset
from hfta_nas.runtime import DTYPES
from hfta_nas.search_spaces import ResolvedConfig


def _worker(
    config: ResolvedConfig, plans: list[dict[str, int]], device: str, dtype: str, barrier: Any, results: Any
) -> None:
    try:
        torch.set_num_threads(1)
        torch_device, torch_dtype = torch.device(device), DTYPES[dtype]
        data = load_dataset(config.dataset, **config.dataset_kwargs(), device=torch_device, dtype=torch_dtype)
        warm = dataclasses.replace(config, epochs=1, schedule=config.schedule and {**config.schedule, "t_max": 1})
        plain_run(warm, data, plans[0], torch_device, torch_dtype)
        barrier.wait(timeout=PROCESS_TIMEOUT_S)
        accuracies = [plain_run(config, data, seeds, torch_device, torch_dtype) for seeds in plans]
        results.put((time.perf_counter(), accuracies, None))  # CLOCK_MONOTONIC: one clock for all processes
    except BaseException:  # the parent reports it; a child must not hang the barrier
        barrier.abort()
        results.put((math.nan, [], traceback.format_exc()))


def run_processes(
    config: ResolvedConfig, plans: list[dict[str, int]], processes: int, device: str, dtype: str
) -> dict[str, Any]:
    """Train every plan's seeds in `processes` spawned processes at once; wall time, start-up, accuracies."""
    started = time.perf_counter()
    context = mp.get_context("spawn")
    shares = [plans[i::processes] for i in range(processes) if plans[i::processes]]
    barrier, results = context.Barrier(len(shares) + 1), context.Queue()
    children = [
        context.Process(target=_worker, args=(config, share, device, dtype, barrier, results), daemon=True)
        for share in shares
    ]
    for child in children:
        child.start()
    barrier_wait(barrier, children)
    wall = time.perf_counter()
    end, accuracies, errors = wall, [], []
    for _ in children:
        try:
            finished, values, error = results.get(timeout=PROCESS_TIMEOUT_S)
        except queue_module.Empty:
            errors.append("a worker process gave no result")
            break
        end, accuracies = max(end, finished), accuracies + values
        if error:
            errors.append(error)
    for child in children:
        child.join(timeout=10)
    if errors:
        raise RuntimeError("a worker process failed:\n" + "\n".join(errors))
    return {"seconds": end - wall, "startup_s": wall - started, "processes": len(children), "acc": accuracies}
