"""How long an array's training step takes on this device: measured, then extrapolated.

A step costs a fixed part (kernel launches, Python, the optimizer's loop
over tensors) plus a part that grows with the arithmetic (multiply-adds per
sample x slots x batch). The search times real training steps of arrays of
1 and of B copies of a candidate (the same timing `--array-size auto` uses)
and fits both parts. On a GPU, small models are launch-bound: the fixed part
dominates, padding a small model into a bigger envelope is nearly free and
one full array beats several small ones. On a CPU the arithmetic dominates:
padding costs what it computes, and models of very different sizes are
cheaper in separate arrays. The packing policy (`_packing`) follows whichever
this device measured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from hfta_nas._autosize import step_seconds

# Timed seconds per array size (a median of at least 5 steps): two points fit a line, and
# each search of a new structure pays this twice before its first array trains.
MIN_SECONDS = 0.15


@dataclass(frozen=True)
class StepCost:
    """Seconds of one training step: `fixed_s + per_gmac_s * (multiply-adds of the step) / 1e9`,
    where the step's multiply-adds are (per sample, over all slots) x batch size."""

    fixed_s: float
    per_gmac_s: float

    def seconds(self, macs_per_sample: float, batch_size: int) -> float:
        return self.fixed_s + self.per_gmac_s * macs_per_sample * batch_size / 1e9

    def as_dict(self) -> dict[str, float]:
        return {"fixed_s": self.fixed_s, "per_gmac_s": self.per_gmac_s}


def fit_step_cost(points: Sequence[tuple[float, float]]) -> StepCost:
    """The least-squares line through (multiply-adds of a step, seconds) points, both
    parts kept >= 0 (timings on a shared machine are noisy)."""
    if len(points) == 1 or len({w for w, _ in points}) == 1:
        work = max(points[0][0], 1.0)
        return StepCost(0.0, min(s for _, s in points) / work * 1e9)
    n = len(points)
    mean_w = sum(w for w, _ in points) / n
    mean_s = sum(s for _, s in points) / n
    slope = sum((w - mean_w) * (s - mean_s) for w, s in points) / sum((w - mean_w) ** 2 for w, _ in points)
    slope = max(slope, 0.0)
    fixed = max(mean_s - slope * mean_w, 0.0)
    return StepCost(fixed, slope * 1e9)


def measure_step_cost(factory: Callable[[], nn.Module], macs_per_sample: int, *, input_shape: Sequence[int],
                      num_classes: int, batch_size: int, dtype: torch.dtype, optimizer: str, device: torch.device,
                      slots: int) -> StepCost:
    """Time training steps of arrays of 1 and `slots` (at least 2) models from `factory`
    and fit the step cost; the global random state is left as it was."""
    points = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for size in sorted({1, max(2, slots)}):
            seconds = step_seconds(factory, input_shape, num_classes, slots=size, batch_size=batch_size, dtype=dtype,
                                   optimizer=optimizer, device=device, min_steps=5, min_seconds=MIN_SECONDS)
            points.append((float(size * macs_per_sample * batch_size), seconds))
    return fit_step_cost(points)
