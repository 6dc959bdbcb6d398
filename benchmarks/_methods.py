"""The in-process training methods, each a `Runner` that trains for a range of steps.

Every step of every method does the same work a real training loop does:
gather the batch from the device-resident training tensors, forward,
cross-entropy, backward, optimizer step. Nothing in a step reads a value back
to the host (no `.item()`), so on CUDA the timed loop is not serialised.

- `SerialRunner`: plain PyTorch, one model after another, each with its own
  `torch.optim.Adam`; what B separate jobs on one device cost back to back.
- `VmapRunner`: the torch.func model-ensembling recipe, verbatim from the
  tutorial: `stack_module_state` + `functional_call` + `vmap`, and
  `torch.optim.Adam` over the stacked leaves.
- `ArrayRunner`: `hfta_nas.ModelArray` + `hfta_nas.optim.Adam`.
- `LimitRunner`: one model on B x N samples per step: the same FLOPs in the
  biggest kernels with one optimizer step, the ceiling fusion can approach.

The multi-process method lives in `_processes.py`.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.func import functional_call, stack_module_state, vmap
from torch.nn import functional as F

import hfta_nas
from benchmarks._workloads import BATCH_SIZE, Prepared
from hfta_nas.data import gather

LR = 1e-3


def slot_losses(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[B] each slot's mean cross-entropy; their sum gives each slot its own gradient."""
    batch, n = y.shape
    flat = F.cross_entropy(logits.reshape(batch * n, logits.shape[-1]), y.reshape(batch * n), reduction="none")
    return flat.view(batch, n).mean(dim=1)


def mixed(device: torch.device) -> Any:
    """Autocast in $HFTA_NAS_BENCH_PRECISION (bf16 or fp16; unset: float32, nothing) on `device`, for
    every method alike (the processes' workers inherit the variable)."""
    precision = os.environ.get("HFTA_NAS_BENCH_PRECISION", "float32")
    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[precision])


def _no_phase(name: str) -> contextlib.nullcontext:
    return contextlib.nullcontext()


class Runner:
    """Trains `models` models on `samples_per_unit` samples per step unit.

    `run(steps, phase)` wraps each part of a step (gather, forward, loss,
    backward, optimizer) in `phase(name)`: a no-op when timing, a
    `torch.profiler.record_function` when profiling (benchmarks/_profile.py).
    """

    models: int
    samples_per_unit: int
    first_loss: torch.Tensor | None = None  # slot 0's loss on its first step (detached)

    def run(self, steps: range, phase: Callable[[str], Any] = _no_phase) -> None:
        raise NotImplementedError


class SerialRunner(Runner):
    """`count` models, trained one after another, each for all the given steps."""

    def __init__(self, prep: Prepared, table: torch.Tensor, count: int, device: torch.device) -> None:
        self.models = count
        self.samples_per_unit = count * BATCH_SIZE
        self.x, self.y = prep.x_train, prep.y_train
        self.jobs = []
        for slot in range(count):
            model = prep.build(slot, device).train()
            optimizer = torch.optim.Adam(model.parameters(), lr=LR)
            indices = [table[slot, t].contiguous() for t in range(table.shape[1])]
            self.jobs.append((model, optimizer, indices))

    def run(self, steps: range, phase: Callable[[str], Any] = _no_phase) -> None:
        for model, optimizer, indices in self.jobs:
            for t in steps:
                with phase("gather"):
                    index = indices[t % len(indices)]
                    x, y = self.x[index], self.y[index]
                with phase("forward"), mixed(self.x.device):
                    logits = model(x)
                with phase("loss"), mixed(self.x.device):
                    loss = F.cross_entropy(logits, y)
                with phase("backward"):
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                with phase("optimizer"):
                    optimizer.step()
                if self.first_loss is None:
                    self.first_loss = loss.detach()


class VmapRunner(Runner):
    """The torch.func ensembling tutorial, with a training step added."""

    def __init__(self, prep: Prepared, table: torch.Tensor, count: int, device: torch.device) -> None:
        self.models = count
        self.samples_per_unit = count * BATCH_SIZE
        self.x, self.y = prep.x_train, prep.y_train
        models = [prep.build(slot, device).train() for slot in range(count)]
        self.params, self.buffers = stack_module_state(models)
        base = copy.deepcopy(models[0]).to("meta")

        def fmodel(params, buffers, x):
            return functional_call(base, (params, buffers), (x,))

        # Buffers are batched too: BatchNorm updates each slot's running stats in place.
        self.ensemble = vmap(fmodel, in_dims=(0, 0, 0))
        self.optimizer = torch.optim.Adam(list(self.params.values()), lr=LR)
        self.indices = [table[:, t].contiguous() for t in range(table.shape[1])]

    def run(self, steps: range, phase: Callable[[str], Any] = _no_phase) -> None:
        for t in steps:
            with phase("gather"):
                index = self.indices[t % len(self.indices)]
                x, y = self.x[index], self.y[index]
            with phase("forward"), mixed(self.x.device):
                logits = self.ensemble(self.params, self.buffers, x)
            with phase("loss"), mixed(self.x.device):
                losses = slot_losses(logits, y)
                total = losses.sum()
            with phase("backward"):
                self.optimizer.zero_grad(set_to_none=True)
                total.backward()
            with phase("optimizer"):
                self.optimizer.step()
            if self.first_loss is None:
                self.first_loss = losses.detach()[0]


class ArrayRunner(Runner):
    """hfta_nas.ModelArray with the array Adam."""

    def __init__(self, prep: Prepared, table: torch.Tensor, count: int, device: torch.device) -> None:
        self.models = count
        self.samples_per_unit = count * BATCH_SIZE
        self.x, self.y = prep.x_train, prep.y_train
        self.array = hfta_nas.ModelArray.from_factory(prep.factory(), seeds=list(range(count)), device=device).train()
        self.optimizer = hfta_nas.optim.Adam(self.array, lr=LR)
        self.indices = [table[:, t].contiguous() for t in range(table.shape[1])]

    def run(self, steps: range, phase: Callable[[str], Any] = _no_phase) -> None:
        for t in steps:
            with phase("gather"):
                index = self.indices[t % len(self.indices)]
                x, y = gather(self.x, index), gather(self.y, index)
            with phase("forward"), mixed(self.x.device):
                logits = self.array(x)
            with phase("loss"), mixed(self.x.device):
                losses = slot_losses(logits, y)
                total = losses.sum()
            with phase("backward"):
                self.optimizer.zero_grad()
                total.backward()
            with phase("optimizer"):
                self.optimizer.step()
            if self.first_loss is None:
                self.first_loss = losses.detach()[0]


class LimitRunner(Runner):
    """One model, one optimizer, B x N samples per step."""

    def __init__(self, prep: Prepared, table: torch.Tensor, count: int, device: torch.device) -> None:
        self.models = 1
        self.samples_per_unit = count * BATCH_SIZE
        self.x, self.y = prep.x_train, prep.y_train
        self.model = prep.build(0, device).train()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=LR)
        self.indices = [table[:, t].reshape(-1) for t in range(table.shape[1])]

    def run(self, steps: range, phase: Callable[[str], Any] = _no_phase) -> None:
        for t in steps:
            with phase("gather"):
                index = self.indices[t % len(self.indices)]
                x, y = self.x[index], self.y[index]
            with phase("forward"), mixed(self.x.device):
                logits = self.model(x)
            with phase("loss"), mixed(self.x.device):
                loss = F.cross_entropy(logits, y)
            with phase("backward"):
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
            with phase("optimizer"):
                self.optimizer.step()


RUNNERS = {"serial": SerialRunner, "vmap": VmapRunner, "array": ArrayRunner, "limit": LimitRunner}


@dataclass
class Timing:
    """Settings of one measurement.

    `warmup` untimed steps, then one calibration step that sets the steps per
    repeat (so a repeat lasts at least `min_time_s`, at most `max_steps`
    steps), then `repeats` timed repeats. `max_cell_s` is a soft budget for
    very slow cells (seconds per step): warm-up stops after the step that
    spends a quarter of it, and repeats drop to 2 (at the least) when the
    budget would be exceeded. Cells record how many repeats they ran.
    """

    warmup: int = 2
    repeats: int = 3
    min_time_s: float = 0.3
    max_steps: int = 200
    max_cell_s: float = 45.0

    def settings(self) -> dict[str, Any]:
        """These settings under the names the benchmarks' JSON documents use."""
        return {
            "warmup_steps": self.warmup,
            "repeats": self.repeats,
            "min_repeat_seconds": self.min_time_s,
            "max_steps_per_repeat": self.max_steps,
            "cell_budget_seconds": self.max_cell_s,
        }


@dataclass
class Measured:
    models: int
    samples_per_s: float
    repeat_seconds: list[float]
    steps_per_repeat: int
    samples_per_repeat: int
    first_loss: float | None
    warnings: list[str] = field(default_factory=list)


def synchronizer(device: torch.device):
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def steps_for(seconds_per_step: float, timing: Timing) -> int:
    """Steps per repeat so that a repeat lasts at least `min_time_s` (at least 1, at most `max_steps`)."""
    if seconds_per_step <= 0:
        return timing.max_steps
    return max(1, min(timing.max_steps, math.ceil(timing.min_time_s / seconds_per_step)))


@dataclass
class Warmed:
    """A runner after `warm_up`: where its step counter stands and how many steps a repeat takes."""

    runner: Runner
    position: int
    per_step_s: float
    steps_per_repeat: int
    spent_s: float
    warnings: list[str]


def warm_up(runner: Runner, timing: Timing, device: torch.device) -> Warmed:
    """Untimed warm-up steps (recording slot 0's first loss), then one step that sets the steps per repeat.

    Warnings raised meanwhile (e.g. vmap falling back to a loop) are
    returned, not raised.
    """
    sync = synchronizer(device)
    spent = 0.0
    position = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        while position < max(1, timing.warmup) and spent <= timing.max_cell_s / 4:
            started = time.perf_counter()
            runner.run(range(position, position + 1))
            sync()
            spent += time.perf_counter() - started
            position += 1
    started = time.perf_counter()
    runner.run(range(position, position + 1))
    sync()
    per_step = time.perf_counter() - started
    messages = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    return Warmed(runner, position + 1, per_step, steps_for(per_step, timing), spent + per_step, messages)


def measure_together(warmed: dict[str, Warmed], timing: Timing, device: torch.device) -> dict[str, Measured]:
    """Time the warmed runners' repeats round-robin: repeat 1 of every runner, then repeat 2, ...

    On a shared machine the speed of the hardware drifts over seconds; taking
    the methods' repeats in turns exposes them all to the same drift, so their
    ratios hold even when the absolute rates do not. Throughput is each
    runner's median repeat. The rounds stop early (at 2) when they would
    exceed the cells' budget of `max_cell_s` each.
    """
    sync = synchronizer(device)
    round_s = sum(w.steps_per_repeat * w.per_step_s for w in warmed.values())
    left = timing.max_cell_s * len(warmed) - sum(w.spent_s for w in warmed.values())
    affordable = int(left // round_s) if round_s > 0 else timing.repeats
    repeats = max(min(2, timing.repeats), min(timing.repeats, affordable))
    seconds: dict[str, list[float]] = {name: [] for name in warmed}
    for _ in range(repeats):
        for name, w in warmed.items():
            sync()
            started = time.perf_counter()
            w.runner.run(range(w.position, w.position + w.steps_per_repeat))
            sync()
            seconds[name].append(time.perf_counter() - started)
            w.position += w.steps_per_repeat
    measured = {}
    for name, w in warmed.items():
        samples = w.runner.samples_per_unit * w.steps_per_repeat
        first = None if w.runner.first_loss is None else float(w.runner.first_loss)
        measured[name] = Measured(
            w.runner.models,
            samples / statistics.median(seconds[name]),
            seconds[name],
            w.steps_per_repeat,
            samples,
            first,
            w.warnings,
        )
    return measured
