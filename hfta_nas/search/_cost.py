"""How long an array trains on this device: measured once per structure, then interpolated.

`StepCurve` is what a search measures: real training steps (the timing
`--array-size auto` uses) of arrays of 1, 2, 4, ... copies of a group's
largest model, so the cost of a step against the array's size is a measured
curve, not a line (per-slot cost falls while fixed costs are shared, and can
rise again once the array outgrows a cache); one array of the group's smallest
model says how much of a step scales with the envelope's multiply-adds; and
building and verifying one array is a fixed cost per array. On a GPU, small
models are launch-bound: most of a step is fixed, padding a small model into a
bigger envelope is nearly free and one full array beats several small ones. On
a CPU the arithmetic dominates: padding costs what it computes. The packing
policy (`_packing`) follows whichever this device measured. The curve's knee
(the smallest array within 10% of the best measured throughput) is the array
size `auto` chooses. Each size is timed in turns with the one before it, so a
busy machine's load weighs on both sides of every ratio alike.

`StepCost` is a fixed line (`fixed_s + per_gmac_s x multiply-adds`) a user can
pin to repeat a packing exactly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hfta_nas._files import atomic_write_text, cache_dir
from hfta_nas._version import __version__
from hfta_nas.training._autosize import interleaved_step_seconds

log = logging.getLogger(__name__)

# Seconds each array of a pair timed in turns steps for (and at least MIN_STEPS steps: their medians make
# the ratio); a structure's curve is measured once per machine (`StepCostCache`), before its first array
# trains, and on a 16-trial search of small models its seconds are a share of the search's.
MIN_SECONDS = 0.05
MIN_STEPS = 7
KNEE_GAIN = 1.1  # no measured array steps this much more throughput than the knee


@dataclass(frozen=True)
class StepCost:
    """Seconds of one training step: `fixed_s + per_gmac_s * (multiply-adds of the step) / 1e9`,
    where the step's multiply-adds are (per sample, over all slots) x batch size."""

    fixed_s: float
    per_gmac_s: float

    array_s = 0.0  # no fixed cost per array

    def seconds(self, macs_per_sample: float, batch_size: int, slots: int | None = None) -> float:
        """One step of an array executing `macs_per_sample` (over all its slots) per sample."""
        return self.fixed_s + self.per_gmac_s * macs_per_sample * batch_size / 1e9

    def as_dict(self) -> dict[str, float]:
        return {"fixed_s": self.fixed_s, "per_gmac_s": self.per_gmac_s}

    def describe(self) -> str:
        return f"{self.fixed_s * 1e3:.2f} ms + {self.per_gmac_s:.3f} s per GMAC per step"


# A larger array's step may measure a little faster than a smaller one's (timer noise, a warmer
# cache); more than this factor faster means the machine was busy while the curve was measured.
STEADY_DIP = 0.9


@dataclass(frozen=True)
class StepCurve:
    """A structure's measured step seconds against array size (see the module docstring).

    - macs: multiply-adds per sample of the model the curve was measured with (the envelope);
    - sizes, step_s: array sizes and the median seconds of one training step at each;
    - fixed_share: the share of a step that does not shrink with a smaller envelope;
    - array_s: seconds to build and verify one array (paid once per array).
    """

    macs: int
    sizes: tuple[int, ...]
    step_s: tuple[float, ...]
    fixed_share: float
    array_s: float

    def step_seconds(self, slots: int, envelope_macs: float) -> float:
        """One step of an array of `slots` slots whose envelope executes `envelope_macs` per sample and slot."""
        at_size = _interpolated(self.sizes, self.step_s, slots)
        scale = envelope_macs / max(self.macs, 1)
        return at_size * (self.fixed_share + (1.0 - self.fixed_share) * scale)

    def seconds(self, macs_per_sample: float, batch_size: int, slots: int | None = None) -> float:
        """`StepCost.seconds`: one step of an array executing `macs_per_sample` over its `slots` slots."""
        slots = slots or 1
        return self.step_seconds(slots, macs_per_sample / slots)

    @property
    def knee(self) -> int:
        """The array size `auto` takes from this curve (`_knee`)."""
        return _knee(self.sizes, self.step_s)

    @property
    def steady(self) -> bool:
        """Whether the curve looks measured on a quiet machine: a larger array's step never takes clearly
        less time than a smaller one's (it does more work). A curve that dips was disturbed by other
        load, and is not kept for later searches (`StepCostCache`)."""
        return all(later >= STEADY_DIP * earlier for earlier, later in zip(self.step_s, self.step_s[1:]))

    def describe(self) -> str:
        steps = ", ".join(f"{size}: {s * 1e3:.2f}" for size, s in zip(self.sizes, self.step_s))
        return (
            f"ms per step by array size {{{steps}}}, {self.fixed_share:.0%} of a step fixed, "
            f"{self.array_s * 1e3:.0f} ms per array; knee {self.knee}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "macs": self.macs,
            "sizes": list(self.sizes),
            "step_s": list(self.step_s),
            "fixed_share": self.fixed_share,
            "array_s": self.array_s,
        }


def cost_from_dict(stored: dict[str, Any]) -> StepCost | StepCurve:
    """A StepCost or StepCurve from its `as_dict()`."""
    if "sizes" in stored:
        return StepCurve(
            int(stored["macs"]),
            tuple(int(s) for s in stored["sizes"]),
            tuple(float(s) for s in stored["step_s"]),
            float(stored["fixed_share"]),
            float(stored["array_s"]),
        )
    return StepCost(float(stored["fixed_s"]), float(stored["per_gmac_s"]))


def _interpolated(sizes: Sequence[int], seconds: Sequence[float], slots: int) -> float:
    """Seconds at `slots`, piecewise linear between measured sizes (and along the last segment beyond)."""
    if len(sizes) == 1:
        return seconds[0] * slots / sizes[0]
    index = next((i for i in range(1, len(sizes)) if sizes[i] >= slots), len(sizes) - 1)
    (s0, t0), (s1, t1) = (sizes[index - 1], seconds[index - 1]), (sizes[index], seconds[index])
    return max(t0 + (t1 - t0) * (slots - s0) / (s1 - s0), 1e-9)


def measure_step_cost(
    factory: Callable[[], nn.Module],
    macs_per_sample: int,
    *,
    input_shape: Sequence[int],
    num_classes: int,
    batch_size: int,
    dtype: torch.dtype,
    optimizer: str,
    device: torch.device,
    slots: int,
    smallest: tuple[Callable[[], nn.Module], int] | None = None,
) -> StepCurve:
    """The StepCurve of arrays of `factory`'s models (`macs_per_sample` each) at sizes 1, 2, 4, ... up to
    `slots` (at least 2; the doubling stops once two doublings in a row gain less than KNEE_GAIN: the
    curve is flat there; a knee of 1 means arrays of one, and nothing more is measured);
    `smallest` (a factory and its multiply-adds) gives the share of a step that does not scale with
    the envelope. The global random state is left as it was."""

    def in_turns(*arrays: tuple[Callable[[], nn.Module], int]) -> list[float]:
        return interleaved_step_seconds(
            arrays,
            input_shape,
            num_classes,
            batch_size=batch_size,
            dtype=dtype,
            optimizer=optimizer,
            device=device,
            min_steps=MIN_STEPS,
            min_seconds=MIN_SECONDS,
        )

    limit = max(2, slots)
    candidates = sorted({*(2**k for k in range(limit.bit_length()) if 2**k <= limit), limit})
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        started = time.perf_counter()
        sizes, step_s = [1], []
        for size in candidates[1:]:
            # each size is timed in turns with the one before it, and the curve chains those ratios: the
            # knee is read from ratios, which a shared machine's load moves far less than it moves
            # timings taken one after the other (one slow timing of the array of one made fusion look
            # twice as good as it was)
            before, after = in_turns((factory, sizes[-1]), (factory, size))
            step_s = step_s or [before]
            sizes.append(size)
            step_s.append(step_s[-1] * after / before)
            if len(sizes) >= 3 and all(_gain(sizes, step_s, i) < KNEE_GAIN for i in (-1, -2)):
                break
        if _knee(sizes, step_s) == 1:
            log.info("no gain from fusion (sizes %s, seconds %s): arrays of one, as plain", sizes, step_s)
            return _no_gain_curve(macs_per_sample, sizes, step_s)
        array_s = _array_seconds(factory, device, dtype)
        if smallest is not None and smallest[1] < macs_per_sample:
            ratio = smallest[1] / macs_per_sample
            big, small = in_turns((factory, sizes[-1]), (smallest[0], sizes[-1]))
            fixed_share = (small / big - ratio) / (1.0 - ratio)
        else:  # one size of model
            fixed_share = _intercept_share(step_s)
    log.info("measured the step curve in %.2f s: sizes %s, seconds %s", time.perf_counter() - started, sizes, step_s)
    return StepCurve(macs_per_sample, tuple(sizes), tuple(step_s), min(max(fixed_share, 0.0), 1.0), array_s)


def _no_gain_curve(macs_per_sample: int, sizes: list[int], step_s: list[float]) -> StepCurve:
    """The curve of a structure whose knee is 1 (no measured array steps clearly more models per second
    than one model alone), so nothing more is timed. Every array then holds one model: no envelope is
    padded (the smaller model's share is not needed) and an array's build is paid per trial, as a plain
    loop pays its model's (no fixed cost per array to weigh)."""
    return StepCurve(macs_per_sample, tuple(sizes), tuple(step_s), min(max(_intercept_share(step_s), 0.0), 1.0), 0.0)


def _intercept_share(step_s: Sequence[float]) -> float:
    """The step's fixed part: the intercept of the first two points (arrays of 1 and 2), as a share of one
    slot's step."""
    return (2 * step_s[0] - step_s[1]) / step_s[0]


def _knee(sizes: Sequence[int], step_s: Sequence[float]) -> int:
    """The smallest measured array size whose throughput (models stepped per second) is within KNEE_GAIN
    of the best measured: a larger array would gain less than that, and costs the search rounds. Not
    the first size where one doubling stops paying: on a CPU an array of two can step hardly faster
    per model than one while an array of four steps half again as fast (a small 1-D CNN, measured)."""
    throughput = [size / seconds for size, seconds in zip(sizes, step_s)]
    return next(size for size, rate in zip(sizes, throughput) if rate * KNEE_GAIN >= max(throughput))


def _gain(sizes: Sequence[int], step_s: Sequence[float], i: int) -> float:
    """Throughput at sizes[i] over throughput at sizes[i - 1]."""
    return (sizes[i] / step_s[i]) / (sizes[i - 1] / step_s[i - 1])


def _array_seconds(factory: Callable[[], nn.Module], device: torch.device, dtype: torch.dtype) -> float:
    """Seconds to build one array of two of the models and verify it: what each array pays once."""
    from hfta_nas.array._model_array import ModelArray  # noqa: PLC0415 - the array imports the optimizers, which import this

    started = time.perf_counter()
    ModelArray.from_factory(factory, [0, 1], device=device, dtype=dtype)
    return time.perf_counter() - started


CACHE_FILE = "step_costs.json"
# How a curve is measured, in its cache key: a change of method (sizes timed in turns since the curves
# timed one after the other misled the knee), or of what the engine's step costs (an array of one bound
# once instead of functional_call per forward: its point moved by 6%), measures every structure again
# instead of reading a curve the old way measured.
MEASURE_METHOD = "in-turns, alone bound"


def device_name(device: torch.device) -> str:
    """The device a step cost was measured on: the GPU's name, or `cpu` and the thread count (the
    key of a cost kept in a study, which workers on the same kind of device share)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device).replace(" ", "_")
    return f"cpu{torch.get_num_threads()}"


class StepCostCache:
    """Measured step costs kept on disk between searches (`hfta_nas._files.cache_dir()`), one
    entry per structure, array size, device, thread count, dtype, version of torch and hfta-nas,
    and way of measuring (MEASURE_METHOD): a second search of the same structure on the same machine measures nothing.
    A missing, unreadable or foreign file is an empty cache; writes replace the file whole."""

    def __init__(self) -> None:
        folder = cache_dir()
        self.path = folder / CACHE_FILE if folder is not None else None

    @staticmethod
    def key(structure: str, slots: int, device: torch.device, dtype: torch.dtype) -> str:

        machine = f"{device_name(device)}:{platform.machine()}:{platform.processor() or 'unknown'}"  # this machine's
        versions = f"torch-{torch.__version__}|hfta-nas-{__version__}|{MEASURE_METHOD}"
        return f"{structure}|{slots}|{machine}|{dtype}|{versions}"

    def _entries(self) -> dict[str, dict[str, float]]:
        if self.path is None:
            return {}
        try:
            entries = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return entries if isinstance(entries, dict) else {}

    def get(self, key: str) -> StepCost | StepCurve | None:
        entry = self._entries().get(key)
        try:
            return cost_from_dict(entry) if entry else None
        except (KeyError, TypeError, ValueError):
            return None

    def put(self, key: str, cost: StepCost | StepCurve) -> None:
        if self.path is None:
            return
        entries = {**self._entries(), key: cost.as_dict()}  # another process's entries are kept
        with contextlib.suppress(OSError):  # a read-only home: the search goes on, it measures again next time
            atomic_write_text(self.path, json.dumps(entries, indent=1, sort_keys=True))
