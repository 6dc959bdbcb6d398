"""`--array-size auto`: how many models to fuse into one array.

Two limits, the smaller wins:

1. Memory: the largest B whose estimate (`hfta_nas.training._oom.estimate_array_bytes`)
   fits the budget: `HFTA_NAS_MEMORY_BUDGET` when set, else 80% of the free
   memory of the device (CUDA: `torch.cuda.mem_get_info`; CPU: available RAM plus
   what this process's allocator holds free for reuse).
2. The knee: training steps of arrays of B = 1, 2, 4, ... are timed, and B stops
   doubling once doubling raises the summed throughput (samples/s over all
   models) by less than `gain` (10%). Past the knee a larger array only makes
   each model wait longer for the same total work, and it takes diversity from
   the search (fewer rounds, fewer architectures).

The timings are real steps (forward, per-slot loss, backward, optimizer step) on
random inputs of the data's shape; they take a few seconds and are made once per
shape signature by the search.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from hfta_nas.training._allocator import retained_free_bytes
from hfta_nas.training._oom import estimate_array_bytes, memory_budget

# Free memory an automatic array may take: the rest is left for the allocator's slack,
# the data and other processes.
FREE_FRACTION = 0.8


@dataclass
class AutoSize:
    """The chosen array size and why."""

    size: int
    memory_limit: int  # the largest B that fits the memory budget
    reason: str
    throughput: dict[int, float] = field(default_factory=dict)  # B -> samples/s summed over models


def free_memory(device: torch.device) -> int:
    """Bytes an automatic array may use on `device` (see FREE_FRACTION), or the budget when set."""
    budget = memory_budget()
    if budget is not None:
        return budget
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
    else:  # memory this process keeps free for reuse (keep_freed_memory) is available too
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") + retained_free_bytes()
    return int(free * FREE_FRACTION)


def memory_limit(
    factory: Callable[[], nn.Module],
    input_shape: Sequence[int],
    *,
    batch_size: int,
    dtype: torch.dtype,
    optimizer: str,
    available: int,
    cap: int,
) -> int:
    """The largest B <= cap whose array estimate fits `available` bytes (at least 1)."""
    one = estimate_array_bytes(factory, input_shape, batch_size=batch_size, slots=1, dtype=dtype, optimizer=optimizer)
    return max(1, min(cap, available // max(one, 1)))  # the estimate is linear in B


class _StepTimer:
    """One array of `slots` models with its optimizer and random inputs of the data's shape, ready to
    time single training steps (forward, per-slot loss, backward, optimizer step)."""

    def __init__(
        self,
        factory: Callable[[], nn.Module],
        input_shape: Sequence[int],
        num_classes: int,
        *,
        slots: int,
        batch_size: int,
        dtype: torch.dtype,
        optimizer: str,
        device: torch.device,
    ) -> None:
        from hfta_nas.array._model_array import ModelArray
        from hfta_nas.optim import OPTIMIZERS

        self.slots, self.device = slots, device
        self.array = ModelArray.from_factory(factory, list(range(slots)), device=device, dtype=dtype)
        self.optimizer = OPTIMIZERS[optimizer](self.array)
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(slots, batch_size, *input_shape, generator=generator, dtype=dtype).to(device)
        self.y = torch.randint(num_classes, (slots, batch_size), generator=generator).to(device)

    def step(self) -> float:
        started = time.perf_counter()
        logits = self.array(self.x)
        flat = F.cross_entropy(logits.flatten(0, 1), self.y.flatten(), reduction="none")
        loss = flat.view(self.slots, -1).mean(1).sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - started


def interleaved_step_seconds(
    arrays: Sequence[tuple[Callable[[], nn.Module], int]],
    input_shape: Sequence[int],
    num_classes: int,
    *,
    batch_size: int,
    dtype: torch.dtype,
    optimizer: str,
    device: torch.device,
    min_steps: int = 3,
    min_seconds: float = 0.3,
    max_steps: int = 50,
) -> list[float]:
    """Median wall time of one training step of each array (a model factory and a number of slots),
    timed in turns: one step of each, then the next round, after one warm-up step each, for at least
    `min_steps` rounds and until each array has stepped `min_seconds`. Taking turns gives every array
    the same share of whatever else this machine runs meanwhile, so their ratios (which decide the
    array size) hold on a shared machine, where timings taken one after the other could differ by
    the load alone."""
    timers = [
        _StepTimer(
            factory,
            input_shape,
            num_classes,
            slots=slots,
            batch_size=batch_size,
            dtype=dtype,
            optimizer=optimizer,
            device=device,
        )
        for factory, slots in arrays
    ]
    times: list[list[float]] = [[] for _ in timers]

    def enough(spent: list[float]) -> bool:
        measured = spent[1:]  # the first step warms up
        return len(measured) >= min_steps and (sum(measured) >= min_seconds or len(measured) >= max_steps)

    while not all(enough(spent) for spent in times):
        for timer, spent in zip(timers, times):
            spent.append(timer.step())
    return [statistics.median(spent[1:]) for spent in times]


def step_seconds(
    factory: Callable[[], nn.Module],
    input_shape: Sequence[int],
    num_classes: int,
    *,
    slots: int,
    batch_size: int,
    dtype: torch.dtype,
    optimizer: str,
    device: torch.device,
    min_steps: int = 3,
    min_seconds: float = 0.3,
    max_steps: int = 50,
) -> float:
    """Median wall time of one training step of an array of `slots` models, after one warm-up
    step, over at least `min_steps` steps and `min_seconds` (a median of several steps: this
    machine may be shared)."""
    (seconds,) = interleaved_step_seconds(
        [(factory, slots)],
        input_shape,
        num_classes,
        batch_size=batch_size,
        dtype=dtype,
        optimizer=optimizer,
        device=device,
        min_steps=min_steps,
        min_seconds=min_seconds,
        max_steps=max_steps,
    )
    return seconds


def choose_array_size(
    limit: int, seconds_per_step: Callable[[int], float], *, batch_size: int, gain: float = 1.1
) -> tuple[int, dict[int, float]]:
    """The knee: double B from 1 while that raises summed throughput by at least `gain`,
    up to `limit` (taken whole when throughput still rises there)."""
    throughput = {1: batch_size / seconds_per_step(1)}
    size = 1
    while size * 2 <= limit:
        throughput[size * 2] = size * 2 * batch_size / seconds_per_step(size * 2)
        if throughput[size * 2] < gain * throughput[size]:
            return size, throughput
        size *= 2
    if size < limit:  # still rising when memory stops the doubling: as many as fit
        throughput[limit] = limit * batch_size / seconds_per_step(limit)
        if throughput[limit] >= throughput[size]:
            size = limit
    return size, throughput


def auto_array_size(
    factory: Callable[[], nn.Module],
    input_shape: Sequence[int],
    num_classes: int,
    *,
    batch_size: int,
    dtype: torch.dtype,
    optimizer: str,
    device: torch.device | str,
    cap: int = 256,
) -> AutoSize:
    """The array size `--array-size auto` uses for models made by `factory` (see the module docstring)."""
    device = torch.device(device)
    available = free_memory(device)
    fits = memory_limit(
        factory, input_shape, batch_size=batch_size, dtype=dtype, optimizer=optimizer, available=available, cap=cap
    )

    def timed(slots: int) -> float:
        return step_seconds(
            factory,
            input_shape,
            num_classes,
            slots=slots,
            batch_size=batch_size,
            dtype=dtype,
            optimizer=optimizer,
            device=device,
        )

    size, throughput = choose_array_size(fits, timed, batch_size=batch_size)
    if size == fits or size * 2 > fits:
        reason = f"memory: {fits} models fit in {available / 2**20:,.0f} MiB"
    else:
        reason = (
            f"throughput knee: {size * 2} models give {throughput[size * 2]:,.0f} samples/s, "
            f"{size} give {throughput[size]:,.0f} (less than 10% more)"
        )
    return AutoSize(size, fits, reason, throughput)
