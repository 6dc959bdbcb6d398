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

import json
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from hfta_nas._autosize import step_seconds
from hfta_nas._files import atomic_write_text, cache_dir

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


CACHE_FILE = "step_costs.json"


def device_name(device: torch.device) -> str:
    """What a step cost depends on besides the model: the device's name, and on a CPU the
    processor and the thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device).replace(" ", "_")
    return f"cpu{torch.get_num_threads()}:{platform.machine()}:{platform.processor() or 'unknown'}"


class StepCostCache:
    """Measured step costs kept on disk between searches (`hfta_nas._files.cache_dir()`), one
    entry per structure, array size, device, thread count, dtype and version of torch and
    hfta-nas: a second search of the same structure on the same machine measures nothing.
    A missing, unreadable or foreign file is an empty cache; writes replace the file whole."""

    def __init__(self) -> None:
        folder = cache_dir()
        self.path = folder / CACHE_FILE if folder is not None else None

    @staticmethod
    def key(structure: str, slots: int, device: torch.device, dtype: torch.dtype) -> str:
        from hfta_nas import __version__  # noqa: PLC0415 - the package imports this module

        return f"{structure}|{slots}|{device_name(device)}|{dtype}|torch-{torch.__version__}|hfta-nas-{__version__}"

    def _entries(self) -> dict[str, dict[str, float]]:
        if self.path is None:
            return {}
        try:
            entries = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return entries if isinstance(entries, dict) else {}

    def get(self, key: str) -> StepCost | None:
        entry = self._entries().get(key)
        try:
            return StepCost(float(entry["fixed_s"]), float(entry["per_gmac_s"])) if entry else None
        except (KeyError, TypeError, ValueError):
            return None

    def put(self, key: str, cost: StepCost) -> None:
        if self.path is None:
            return
        entries = {**self._entries(), key: cost.as_dict()}  # another process's entries are kept
        try:
            atomic_write_text(self.path, json.dumps(entries, indent=1, sort_keys=True))
        except OSError:  # a read-only home: the search goes on, it measures again next time
            pass
