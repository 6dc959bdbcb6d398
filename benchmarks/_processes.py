"""The `processes` method: B processes each training one model, all at the same time.

This is the co-location baseline (CUDA MPS / several jobs on one machine):
B spawned processes, each with one torch thread, its own copy of the data on
the device, its own model (slot b's seed and data order) and `torch.optim.Adam`.
They start each timed repeat together at a barrier; a repeat's throughput is
all samples of all processes divided by the wall time from the first start to
the last finish (time.perf_counter is CLOCK_MONOTONIC on Linux, one clock for
all processes). Process start-up, imports and warm-up are not timed.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_module
import statistics
import time
import traceback
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from benchmarks._memory import PeakMemory, current_rss_mb
from benchmarks._methods import LR, Timing, mixed, steps_for, synchronizer
from benchmarks._workloads import BATCH_SIZE, Prepared, Workload
from hfta_nas import keep_freed_memory

BARRIER_TIMEOUT_S = 300.0


def _prime(prep: Prepared, device: torch.device) -> None:
    """A throw-away step, so torch's lazy initialisation is not counted as the model's memory."""
    x, y = prep.x_train[:BATCH_SIZE], prep.y_train[:BATCH_SIZE]
    model = prep.build(0, device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    with mixed(x.device):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()


def _child(
    slot: int,
    workload: Workload,
    x_train: np.ndarray,
    y_train: np.ndarray,
    rows: np.ndarray,
    input_shape: tuple[int, ...],
    num_classes: int,
    device_name: str,
    timing: Timing,
    measure_memory: bool,
    keep_memory: bool,
    barrier: Any,
    calibration: Any,
    results: Any,
) -> None:
    try:
        if keep_memory:
            keep_freed_memory()
        torch.set_num_threads(1)
        device = torch.device(device_name)
        sync = synchronizer(device)
        x, y = torch.from_numpy(x_train).to(device), torch.from_numpy(y_train).to(device)
        indices = [torch.from_numpy(row).to(device) for row in rows]
        prep = Prepared(workload, x, y, tuple(input_shape), num_classes, 0)
        _prime(prep, device)
        base_rss = current_rss_mb() if device.type == "cpu" else None
        first_loss = None

        def run(steps: range) -> None:
            nonlocal first_loss
            for t in steps:
                index = indices[t % len(indices)]
                with mixed(x.device):
                    loss = F.cross_entropy(model(x[index]), y[index])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if first_loss is None:
                    first_loss = loss.detach()

        with PeakMemory(device, measure_memory) as memory:
            model = prep.build(slot, device).train()
            optimizer = torch.optim.Adam(model.parameters(), lr=LR)
            run(range(0, max(1, timing.warmup)))
            sync()
            position = max(1, timing.warmup)
            # Calibrate while all processes run, then agree on the slowest one's step count.
            barrier.wait(BARRIER_TIMEOUT_S)
            started = time.perf_counter()
            run(range(position, position + 1))
            sync()
            calibration[slot] = time.perf_counter() - started
            position += 1
            barrier.wait(BARRIER_TIMEOUT_S)
            steps = steps_for(max(calibration[:]), timing)
            intervals = []
            for _ in range(timing.repeats):
                barrier.wait(BARRIER_TIMEOUT_S)
                started = time.perf_counter()
                run(range(position, position + steps))
                sync()
                intervals.append((started, time.perf_counter()))
                position += steps
        results.put(
            {
                "slot": slot,
                "ok": True,
                "intervals": intervals,
                "steps": steps,
                "first_loss": float(first_loss),
                "memory_mb": memory.mb,
                "memory_note": memory.note,
                "base_rss_mb": base_rss,
            }
        )
    except BaseException as error:  # report anything, so the parent never waits forever
        barrier.abort()
        results.put(
            {"slot": slot, "ok": False, "error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()}
        )


def run_processes(
    prep: Prepared,
    table: torch.Tensor,
    count: int,
    device: torch.device,
    timing: Timing,
    measure_memory: bool,
    keep_memory: bool = False,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """Spawn `count` single-threaded trainers; return throughput, timings, memory and slot 0's first loss."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(count)
    calibration = ctx.Array("d", count)
    results = ctx.Queue()
    x_train, y_train = prep.x_train.cpu().numpy(), prep.y_train.cpu().numpy()
    processes = [
        ctx.Process(
            target=_child,
            args=(
                slot,
                prep.workload,
                x_train,
                y_train,
                table[slot].cpu().numpy(),
                prep.input_shape,
                prep.num_classes,
                str(device),
                timing,
                measure_memory,
                keep_memory,
                barrier,
                calibration,
                results,
            ),
            daemon=True,
        )
        for slot in range(count)
    ]
    for process in processes:
        process.start()
    reports: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(reports) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"processes did not finish within {timeout_s:.0f} s")
            try:
                report = results.get(timeout=min(remaining, 5.0))
            except queue_module.Empty:
                dead = [p for p in processes if p.exitcode not in (None, 0)]
                if dead and results.empty():
                    raise RuntimeError(
                        f"a trainer process exited with code {dead[0].exitcode} without reporting"
                    ) from None
                continue
            reports[report["slot"]] = report
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
    failed = [r for r in reports.values() if not r["ok"]]
    if failed:
        # The first real error, not the BrokenBarrierError it caused in the others.
        real = [r for r in failed if "BrokenBarrierError" not in r["error"]] or failed
        raise RuntimeError(f"slot {real[0]['slot']}: {real[0]['error']}")
    steps = reports[0]["steps"]
    seconds = []
    for repeat in range(timing.repeats):
        starts = [reports[s]["intervals"][repeat][0] for s in range(count)]
        ends = [reports[s]["intervals"][repeat][1] for s in range(count)]
        seconds.append(max(ends) - min(starts))
    samples = count * steps * BATCH_SIZE
    memory = [reports[s]["memory_mb"] for s in range(count)]
    base_rss = [reports[s]["base_rss_mb"] for s in range(count)]
    note = reports[0]["memory_note"]
    if not note:
        note = "sum over the processes of each one's peak growth"
        if all(b is not None for b in base_rss):
            note += (
                f"; on top, each process holds its own interpreter, torch and data copy "
                f"({float(np.mean(base_rss)):.0f} MB RSS each before building its model)"
            )
    return {
        "samples_per_s": samples / statistics.median(seconds),
        "repeat_seconds": seconds,
        "repeats": len(seconds),
        "steps_per_repeat": steps,
        "samples_per_repeat": samples,
        "first_loss": reports[0]["first_loss"],
        "peak_memory_mb": None if any(m is None for m in memory) else float(sum(memory)),
        "memory_note": note,
        "process_base_rss_mb": base_rss,
    }
