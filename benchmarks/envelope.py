"""Models of one structure and different sizes: one padded array, one array per shape, or serial.

    python -m benchmarks.envelope   # default: cnn1d and mlp mixes + the padding sweep (~4 min on 2 cores)
    python -m benchmarks.envelope --quick          # small mixes, a short sweep, few steps (< 30 s): checks the harness
    python -m benchmarks.envelope --threads 1 --json /tmp/envelope.json

A workload is a list of model configs of one family (slot b built right after
`torch.manual_seed(b)`), trained three ways on the same batches (slot b walks
MNIST-1D in the order `EpochOrder` gives data seed b), batch 100 per model,
Adam with lr 1e-3:

- `padded`: ONE `hfta_nas.ModelArray` of all the models: the different sizes are
  padded into an envelope (`hfta_nas/envelope/_merge.py`) + `hfta_nas.optim.Adam`.
- `grouped`: the models grouped by identical config (exact shape), one
  `ModelArray` + `hfta_nas.optim.Adam` per group, the groups trained one after
  another; its time is the sum over the groups.
- `serial`: every model alone, plain PyTorch with `torch.optim.Adam`, one after
  another.

As in `benchmarks/throughput.py`, each method warms up, takes a calibration
step that sets its steps per repeat, and the three methods of a workload are
then timed together, their repeats in turns, so that a shared machine's
drifting speed affects them alike; samples/s (summed over all models) is the
median repeat. Slot b's first-step loss in every method is compared with a
plain model's (rtol 1e-4); a mismatch is flagged.

The padding waste is `ModelArray.padding_cost()` of the padded array: the
multiply-adds per sample the models need (useful) against what the envelope
executes. The sweep pairs a large model with small ones whose width shrinks
(ratio 1, 0.875, 0.75, 0.5, 0.25 of the large width) in several mixes (a pair,
as many small as large, many small + one large, one small + many large, and a
ladder of 8 widths from r to 1) and reports for each point executed/useful
multiply-adds and padded/grouped throughput, so the waste at which one padded
array stops beating one array per shape can be read off (`crossover` in the
JSON, interpolated per series). Ratio 1 (equal shapes: both methods run the
same single array) is the noise control.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import itertools
import json
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich import box
from rich.table import Table
from torch import nn
from torch.nn import functional as F

import hfta_nas
from benchmarks._cli import comma_list, write_result
from benchmarks._methods import LR, Runner, Timing, Warmed, measure_together, slot_losses, warm_up
from benchmarks._report import make_console
from benchmarks._workloads import BATCH_SIZE
from benchmarks.throughput import _load_average, machine_info
from hfta_nas.data import EpochOrder, gather, load_dataset
from hfta_nas.models import count_parameters, model_factory

METHODS = ("padded", "grouped", "serial")
# name -> (numerator, denominator, what it says)
RATIOS: dict[str, tuple[str, str, str]] = {
    "padded/serial": ("padded", "serial", "one padded array over training the models one after another"),
    "grouped/serial": ("grouped", "serial", "one array per exact shape over training the models one after another"),
    "padded/grouped": ("padded", "grouped", "one padded array over one array per exact shape (> 1: padding pays)"),
}
DATASET = "mnist1d"  # [N, 1, 40] samples, 10 classes
EQUIVALENCE_RTOL = 1e-4
DEFAULT_TIMING = Timing(warmup=2, repeats=3, min_time_s=0.3, max_steps=200, max_cell_s=20.0)
QUICK_TIMING = Timing(warmup=1, repeats=2, min_time_s=0.02, max_steps=3, max_cell_s=5.0)
RESULTS_DIR = Path(__file__).resolve().parent / "results"

Config = dict[str, Any]


# ------------------------------------------------------------------------------ workloads
@dataclass
class Mixed:
    """One row: models of one family and different configs, slot b's config `configs[b]`."""

    name: str
    family: str
    configs: list[Config]
    note: str = ""
    sweep: dict[str, Any] = field(default_factory=dict)  # sweep coordinates (family, mix, ratio), else empty

    def groups(self) -> list[list[int]]:
        """Slots grouped by identical config (exact shape), in order of first appearance."""
        by_key: dict[str, list[int]] = {}
        for slot, config in enumerate(self.configs):
            by_key.setdefault(json.dumps(config, sort_keys=True), []).append(slot)
        return list(by_key.values())


def _product_workload(name: str, family: str, axes: dict[str, Sequence[Any]], copies: int, note: str) -> Mixed:
    configs = [dict(zip(axes, values)) for values in itertools.product(*axes.values())]
    return Mixed(name, family, [dict(c) for c in configs * copies], note)


def mixed_workloads(quick: bool) -> dict[str, Mixed]:
    if quick:
        cnn = {"channels": [[16, 16], [32, 32]], "kernel_size": [3, 5]}
        mlp = {"width": [32, 128], "depth": [1, 2]}
        copies = 1
    else:
        cnn = {"channels": [[16, 16], [32, 32], [16, 32]], "kernel_size": [3, 5, 7]}
        mlp = {"width": [32, 64, 128], "depth": [1, 2, 3]}
        copies = 2
    return {
        "cnn1d": _product_workload(
            "cnn1d",
            "cnn1d",
            cnn,
            copies,
            "Conv1d x len(channels) (same padding) + ReLU -> Linear; channels x kernel_size",
        ),
        "mlp": _product_workload(
            "mlp", "mlp", mlp, copies, "Flatten -> depth x [Linear(width) + ReLU] -> Linear; width x depth"
        ),
    }


# The sweep: a family's large model and smaller ones, `ratio` times as wide, in several mixes.
# name -> (family, config of width ratio r; r = 1 is the large model)
SWEEP_FAMILIES: dict[str, tuple[str, Callable[[float], Config]]] = {
    "cnn1d": ("cnn1d", lambda r: {"channels": [max(1, round(32 * r))] * 2, "kernel_size": 5}),
    "mlp": ("mlp", lambda r: {"width": max(1, round(128 * r)), "depth": 2}),
    "mlp512": ("mlp", lambda r: {"width": max(1, round(512 * r)), "depth": 2}),
}


@dataclass(frozen=True)
class Mix:
    """How many models of which relative width: n_small at ratio r and n_large at 1, or
    (`ladder`) n_small + n_large widths evenly spaced from r to 1 (as many shapes as models)."""

    n_small: int
    n_large: int
    ladder: bool = False

    def ratios(self, r: float) -> list[float]:
        n = self.n_small + self.n_large
        if self.ladder:
            return [r + (1.0 - r) * i / (n - 1) for i in range(n)] if n > 1 else [1.0]
        return [r] * self.n_small + [1.0] * self.n_large

    def label(self) -> str:
        return f"ladder {self.n_small + self.n_large}" if self.ladder else f"{self.n_small}+{self.n_large}"


MIXES = {
    "pair": Mix(1, 1),
    "balanced": Mix(8, 8),
    "many-small": Mix(15, 1),
    "many-large": Mix(1, 15),
    "ladder": Mix(1, 7, ladder=True),
}
QUICK_MIXES = {
    "pair": Mix(1, 1),
    "balanced": Mix(2, 2),
    "many-small": Mix(3, 1),
    "many-large": Mix(1, 3),
    "ladder": Mix(1, 3, ladder=True),
}
DEFAULT_SWEEP = ("cnn1d", "mlp", "mlp512")
QUICK_SWEEP = ("cnn1d", "mlp")
DEFAULT_RATIOS = (1.0, 0.875, 0.75, 0.5, 0.25)
QUICK_RATIOS = (1.0, 0.5)
DEFAULT_MIX_NAMES = tuple(MIXES)
QUICK_MIX_NAMES = ("pair", "many-small", "ladder")


def _size(config: Config) -> str:
    return f"ch {config['channels'][0]}" if "channels" in config else f"w {config['width']}"


def sweep_workloads(families: Sequence[str], ratios: Sequence[float], mixes: Sequence[str], quick: bool) -> list[Mixed]:
    """One workload per (family, mix, ratio): the small models first, then the large."""
    out = []
    for name in families:
        family, config_of = SWEEP_FAMILIES[name]
        for mix_name in mixes:
            mix = (QUICK_MIXES if quick else MIXES)[mix_name]
            for ratio in ratios:
                configs = [config_of(r) for r in mix.ratios(ratio)]
                small, large = config_of(ratio), config_of(1.0)
                sizes = f"{_size(small)}/{_size(large).split()[-1]}"
                out.append(
                    Mixed(
                        f"{name} {mix_name} {sizes}",
                        family,
                        configs,
                        f"{mix.label()}: widths {[_size(c).split()[-1] for c in configs]}",
                        {
                            "family": name,
                            "mix": mix_name,
                            "mix_label": mix.label(),
                            "ratio": ratio,
                            "sizes": sizes,
                            "small": small,
                            "large": large,
                        },
                    )
                )
    return out


# ------------------------------------------------------------------------------ data and models
@dataclass
class Data:
    x: torch.Tensor
    y: torch.Tensor
    input_shape: tuple[int, ...]
    num_classes: int

    def index_table(self, slots: int, device: torch.device) -> torch.Tensor:
        """[slots, T, BATCH_SIZE] int64: slot b's sample indices for step t (one epoch, cycled)."""
        order = EpochOrder(len(self.y), BATCH_SIZE, list(range(slots)), drop_last=True, device=device)
        return torch.stack(order.next_epoch(), dim=1)


def load_data(device: torch.device) -> Data:
    data = load_dataset(DATASET, device=device, dtype=torch.float32)
    return Data(data.x_train, data.y_train, tuple(data.input_shape), data.num_classes)


def build(workload: Mixed, slot: int, data: Data, device: torch.device) -> nn.Module:
    """Slot `slot`'s model, built right after torch.manual_seed(slot): the same in every method."""
    factory = model_factory(
        workload.family, workload.configs[slot], input_shape=data.input_shape, num_classes=data.num_classes
    )
    torch.manual_seed(slot)
    return factory().to(device).train()


# ------------------------------------------------------------------------------ methods
class _MixedRunner(Runner):
    """Records every slot's first-step loss (`first_losses`, [B]) besides slot 0's."""

    first_losses: torch.Tensor | None = None

    def _init(self, workload: Mixed, data: Data, table: torch.Tensor) -> None:
        self.models = len(workload.configs)
        self.samples_per_unit = self.models * BATCH_SIZE
        self.x, self.y = data.x, data.y
        self.first_losses = torch.full((self.models,), float("nan"))

    def _record(self, slots: Sequence[int], losses: torch.Tensor) -> None:
        if torch.isnan(self.first_losses[list(slots)]).all():
            self.first_losses[list(slots)] = losses.detach().to("cpu", torch.float32)
            self.first_loss = self.first_losses[0]


class _Group:
    """One ModelArray + array Adam over some slots, with their batch indices."""

    def __init__(self, models: list[nn.Module], slots: list[int], table: torch.Tensor, device: torch.device) -> None:
        self.slots = slots
        self.array = hfta_nas.ModelArray(models, dropout_seeds=slots, device=device).train()
        self.optimizer = hfta_nas.optim.Adam(self.array, lr=LR)
        self.indices = [table[slots, t].contiguous() for t in range(table.shape[1])]

    def step(self, x_all: torch.Tensor, y_all: torch.Tensor, t: int) -> torch.Tensor:
        index = self.indices[t % len(self.indices)]
        x, y = gather(x_all, index), gather(y_all, index)
        losses = slot_losses(self.array(x), y)
        self.optimizer.zero_grad()
        losses.sum().backward()
        self.optimizer.step()
        return losses


class PaddedRunner(_MixedRunner):
    """All the models in ONE ModelArray (different sizes padded into an envelope)."""

    def __init__(self, workload: Mixed, data: Data, table: torch.Tensor, device: torch.device) -> None:
        self._init(workload, data, table)
        slots = list(range(self.models))
        self.group = _Group([build(workload, s, data, device) for s in slots], slots, table, device)

    def run(self, steps: range, phase=None) -> None:
        for t in steps:
            losses = self.group.step(self.x, self.y, t)
            if self.first_loss is None:
                self._record(self.group.slots, losses)


class GroupedRunner(_MixedRunner):
    """One ModelArray per exact shape; the groups train one after another."""

    def __init__(self, workload: Mixed, data: Data, table: torch.Tensor, device: torch.device) -> None:
        self._init(workload, data, table)
        self.groups = [
            _Group([build(workload, s, data, device) for s in slots], slots, table, device)
            for slots in workload.groups()
        ]

    def run(self, steps: range, phase=None) -> None:
        for group in self.groups:
            for t in steps:
                losses = group.step(self.x, self.y, t)
                if t == 0:
                    self._record(group.slots, losses)


class SerialRunner(_MixedRunner):
    """Each model alone, plain PyTorch with torch.optim.Adam, one after another."""

    def __init__(self, workload: Mixed, data: Data, table: torch.Tensor, device: torch.device) -> None:
        self._init(workload, data, table)
        self.jobs = []
        for slot in range(self.models):
            model = build(workload, slot, data, device)
            self.jobs.append(
                (
                    slot,
                    model,
                    torch.optim.Adam(model.parameters(), lr=LR),
                    [table[slot, t].contiguous() for t in range(table.shape[1])],
                )
            )

    def run(self, steps: range, phase=None) -> None:
        for slot, model, optimizer, indices in self.jobs:
            for t in steps:
                index = indices[t % len(indices)]
                loss = F.cross_entropy(model(self.x[index]), self.y[index])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if t == 0:
                    self._record([slot], loss.reshape(1))


RUNNERS = {"padded": PaddedRunner, "grouped": GroupedRunner, "serial": SerialRunner}


# ------------------------------------------------------------------------------ measuring
def _failure(error: BaseException) -> dict[str, Any]:
    text = f"{type(error).__name__}: {error}".strip().splitlines()[0]
    return {"samples_per_s": None, "unsupported": f"failed: {text}"}


def ratios(cells: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name, (top, bottom, _) in RATIOS.items():
        a, b = cells.get(top, {}).get("samples_per_s"), cells.get(bottom, {}).get("samples_per_s")
        out[name] = a / b if a and b else None
    return out


def _reference_losses(workload: Mixed, data: Data, table: torch.Tensor, device: torch.device) -> list[float]:
    """Each slot's first-step loss from its plain model: what every method must reproduce."""
    out = []
    with torch.no_grad():
        for slot in range(len(workload.configs)):
            index = table[slot, 0]
            out.append(float(F.cross_entropy(build(workload, slot, data, device)(data.x[index]), data.y[index])))
    return out


def _padding(runner: PaddedRunner, data: Data) -> dict[str, Any]:
    cost = runner.group.array.padding_cost(data.x[:BATCH_SIZE])
    return {
        "useful_macs_per_sample": cost.useful,
        "executed_macs_per_sample": cost.executed,
        "executed_over_useful": cost.executed / cost.useful if cost.useful else None,
        "waste": cost.waste,
        "per_slot": [list(pair) for pair in cost.per_slot],
    }


def measure(
    workload: Mixed,
    data: Data,
    methods: Sequence[str],
    timing: Timing,
    device: torch.device,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Build and warm up each method, time them together (repeats in turns), check first losses."""
    table = data.index_table(len(workload.configs), device)
    reference = _reference_losses(workload, data, table, device)
    groups = workload.groups()
    entry: dict[str, Any] = {
        "family": workload.family,
        "note": workload.note,
        "models": len(workload.configs),
        "configs": workload.configs,
        "groups": groups,
        "group_sizes": [len(g) for g in groups],
        "parameters": [count_parameters(build(workload, s, data, "cpu")) for s in range(len(workload.configs))],
        **({"sweep": workload.sweep} if workload.sweep else {}),
        "padding": None,
        "methods": {},
        "flags": [],
    }
    cells: dict[str, Any] = {}
    warmed: dict[str, Warmed] = {}
    started = time.perf_counter()
    for method in methods:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                built = time.perf_counter()
                runner = RUNNERS[method](workload, data, table, device)
                warmed[method] = warm_up(runner, timing, device)
                cells[method] = {"setup_and_warmup_s": time.perf_counter() - built}
            if method == "padded":
                entry["padding"] = _padding(runner, data)
        except Exception as error:
            say(traceback.format_exc(limit=4).rstrip())
            warmed.pop(method, None)
            cells[method] = _failure(error)
    try:
        measured = measure_together(warmed, timing, device)
    except Exception as error:
        say(traceback.format_exc(limit=4).rstrip())
        measured = {}
        cells.update({method: _failure(error) for method in warmed})
    for method, result in measured.items():
        runner = warmed[method].runner
        losses = [float(v) for v in runner.first_losses]
        worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference))
        ok = worst <= EQUIVALENCE_RTOL
        cells[method].update(
            {
                "samples_per_s": result.samples_per_s,
                "unsupported": None,
                "repeat_seconds": result.repeat_seconds,
                "repeats": len(result.repeat_seconds),
                "steps_per_repeat": result.steps_per_repeat,
                "samples_per_repeat": result.samples_per_repeat,
                "models_timed": result.models,
                "equivalence": {"max_rel_diff": worst, "ok": ok},
                "warnings": result.warnings,
            }
        )
        if not ok:
            entry["flags"].append(
                f"{method}: a slot's first-step loss differs from its plain model's by rel {worst:.1e}"
            )
    entry["methods"] = {method: cells[method] for method in methods}
    entry["ratios"] = ratios(entry["methods"])
    entry["seconds"] = time.perf_counter() - started
    return entry


NOISE_BAND = 0.05  # padded/grouped within 1 +- this is read as break-even (the equal-shape controls' spread)


def crossover(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Where padded/grouped falls below 1 along one sweep series, as padding waste (linear interpolation).

    Points without waste (every model the same shape: `padded` and `grouped`
    then run the same single array) only show the measurement's noise; they
    are reported as the control and left out. The others are taken in order
    of increasing waste; the crossing is after the last point that pays
    (padded/grouped >= 1), so one noisy point near 1.0 at low waste does not
    decide it. Besides, the largest waste at which padding still clearly pays
    (>= 1 + NOISE_BAND) and the smallest at which it clearly loses
    (<= 1 - NOISE_BAND) are given.
    """
    usable = sorted(
        (p["waste"], p["padded/grouped"]) for p in points if p["padded/grouped"] is not None and p["waste"] > 1e-9
    )
    controls = [p["padded/grouped"] for p in points if p["padded/grouped"] is not None and p["waste"] <= 1e-9]
    clear_win = max((w for w, r in usable if r >= 1 + NOISE_BAND), default=None)
    clear_loss = min((w for w, r in usable if r <= 1 - NOISE_BAND), default=None)
    out: dict[str, Any] = {
        "points": [{"waste": w, "padded/grouped": r} for w, r in usable],
        "equal_shape_control": controls,
        "clearly_pays_up_to_waste": clear_win,
        "clearly_loses_from_waste": clear_loss,
    }
    if not usable:
        return {**out, "waste_at_parity": None, "summary": "no measured points with padding"}
    pays = [ratio >= 1.0 for _, ratio in usable]
    last_paying = max((i for i, p in enumerate(pays) if p), default=None)
    if last_paying is None:
        summary, parity = f"never pays (padded/grouped {usable[0][1]:.2f} already at {usable[0][0]:.0%} waste)", None
    elif last_paying == len(usable) - 1:
        summary, parity = (
            f"pays at every point (up to {usable[-1][0]:.0%} waste, padded/grouped {usable[-1][1]:.2f})",
            None,
        )
    else:
        (w0, r0), (w1, r1) = usable[last_paying], usable[last_paying + 1]
        parity = w0 + (r0 - 1.0) * (w1 - w0) / (r0 - r1)
        summary = f"parity at ~{parity:.0%} waste ({r0:.2f} at {w0:.0%}, {r1:.2f} at {w1:.0%})"
    band = f"{1 + NOISE_BAND:.2f}"
    summary += f"; >= {band} up to {clear_win:.0%}" if clear_win is not None else f"; never >= {band}"
    summary += (
        f", <= {1 - NOISE_BAND:.2f} from {clear_loss:.0%}"
        if clear_loss is not None
        else f", never <= {1 - NOISE_BAND:.2f}"
    )
    if controls:
        summary += f"; equal-shape control {', '.join(f'{c:.2f}' for c in controls)}"
    return {**out, "waste_at_parity": parity, "summary": summary}


# ------------------------------------------------------------------------------ driver
def run_benchmark(
    workloads: Sequence[str] | None = None,
    sweep: Sequence[str] | None = None,
    ratios_: Sequence[float] | None = None,
    mixes: Sequence[str] | None = None,
    device: str | torch.device = "cpu",
    threads: int = 1,
    quick: bool = False,
    *,
    methods: Sequence[str] = METHODS,
    timing: Timing | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure the mixed workloads and the sweep; return the JSON document.

    `None` arguments take the mode's defaults; `sweep=[]` skips the sweep.
    """
    mixed = mixed_workloads(quick)
    workloads = list(mixed) if workloads is None else list(workloads)
    sweep = list(QUICK_SWEEP if quick else DEFAULT_SWEEP) if sweep is None else list(sweep)
    ratio_list = [float(r) for r in (ratios_ or (QUICK_RATIOS if quick else DEFAULT_RATIOS))]
    mixes = list(mixes or (QUICK_MIX_NAMES if quick else DEFAULT_MIX_NAMES))
    methods = [m for m in METHODS if m in methods]
    bad = (
        [w for w in workloads if w not in mixed]
        + [s for s in sweep if s not in SWEEP_FAMILIES]
        + [m for m in mixes if m not in MIXES]
    )
    if bad or not methods:
        raise ValueError(
            f"unknown {bad or 'methods'}; workloads {list(mixed)}, sweep {list(SWEEP_FAMILIES)}, "
            f"mixes {list(MIXES)}, methods {list(METHODS)}"
        )
    if any(not 0 < r <= 1 for r in ratio_list):
        raise ValueError(f"width ratios must be in (0, 1], got {ratio_list}")
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but torch.cuda.is_available() is False")
    timing = timing or (QUICK_TIMING if quick else DEFAULT_TIMING)
    say = progress or (lambda message: None)

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    started = time.perf_counter()
    result: dict[str, Any] = {
        "schema": 1,
        "created": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "settings": {
            "workloads": workloads,
            "sweep": sweep,
            "ratios": ratio_list,
            "mixes": {
                m: {"label": (QUICK_MIXES if quick else MIXES)[m].label(), **vars((QUICK_MIXES if quick else MIXES)[m])}
                for m in mixes
            },
            "methods": methods,
            "device": str(device),
            "threads": threads,
            "quick": quick,
            "dataset": DATASET,
            "batch_size": BATCH_SIZE,
            "optimizer": f"Adam(lr={LR:g})",
            **timing.settings(),
            "equivalence_rtol": EQUIVALENCE_RTOL,
        },
        "machine": machine_info(device, threads),
        "method_definitions": {
            "padded": "one hfta_nas.ModelArray of all models (sizes padded into an envelope) + hfta_nas.optim.Adam",
            "grouped": "one ModelArray + hfta_nas.optim.Adam per exact shape, groups trained one after another",
            "serial": "each model alone with torch.optim.Adam, one after another",
        },
        "ratio_definitions": {name: f"{a} / {b}: {what}" for name, (a, b, what) in RATIOS.items()},
        "results": {},
        "sweep": [],
        "crossover": {},
        "flags": [],
    }
    try:
        data = load_data(device)
        _prime(data, device)
        todo = [mixed[w] for w in workloads] + sweep_workloads(sweep, ratio_list, mixes, quick)
        for number, workload in enumerate(todo, start=1):
            entry = measure(workload, data, methods, timing, device, say)
            gc.collect()
            result["flags"] += [f"{workload.name}: {flag}" for flag in entry["flags"]]
            rates = ", ".join(
                f"{m} {c['samples_per_s']:,.0f}" if c.get("samples_per_s") else f"{m} n/a"
                for m, c in entry["methods"].items()
            )
            waste = entry["padding"]["waste"] if entry["padding"] else None
            say(
                f"[{number}/{len(todo)}] {workload.name} B={entry['models']} groups={len(entry['groups'])} "
                f"waste={'n/a' if waste is None else f'{waste:.0%}'}: {rates} samples/s ({entry['seconds']:.1f} s)"
            )
            if workload.sweep:
                result["sweep"].append({"name": workload.name, **entry})
            else:
                result["results"][workload.name] = entry
        series: dict[str, list[dict[str, Any]]] = {}
        for point in result["sweep"]:
            if point["padding"] is not None:
                key = f"{point['sweep']['family']} {point['sweep']['mix']}"
                series.setdefault(key, []).append({"waste": point["padding"]["waste"], **point["ratios"]})
        result["crossover"] = {key: crossover(points) for key, points in series.items()}
    finally:
        torch.set_num_threads(previous_threads)
    result["duration_s"] = time.perf_counter() - started
    result["machine"]["load_average_at_end"] = _load_average()
    return result


def _prime(data: Data, device: torch.device) -> None:
    """One throw-away step of a plain model and of a padded 2-slot array: torch's lazy first-use
    costs (kernels, autograd threads, functorch) stay out of the first measured method."""
    workload = Mixed("prime", "cnn1d", [{"channels": [8], "kernel_size": 3}, {"channels": [16], "kernel_size": 5}])
    table = data.index_table(2, device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for runner in (PaddedRunner(workload, data, table, device), SerialRunner(workload, data, table, device)):
            runner.run(range(1))


# ------------------------------------------------------------------------------ report
def _rate(cell: dict[str, Any] | None) -> str:
    if not cell or cell.get("samples_per_s") is None:
        return "n/a"
    ok = cell.get("equivalence", {}).get("ok", True)
    return f"{cell['samples_per_s']:,.0f}" + ("" if ok else " !")


def _num(value: float | None, form: str) -> str:
    return "" if value is None else format(value, form)


def _row(entry: dict[str, Any]) -> list[str]:
    padding = entry["padding"] or {}
    return [
        str(entry["models"]),
        str(len(entry["groups"])),
        _num(padding.get("executed_over_useful"), ".2f"),
        _num(padding.get("waste"), ".0%"),
        *[_rate(entry["methods"].get(m)) for m in entry["methods"]],
        *[_num(entry["ratios"][r], ".2f") for r in RATIOS],
    ]


def print_report(result: dict[str, Any], console=None) -> None:
    console = console or make_console()
    if not console.is_terminal and console.width < 180:  # a log or pipe: wide enough that no table wraps
        console = make_console(console.file)
        console.width = 180
    style = box.ASCII if not console.is_terminal else box.SIMPLE_HEAVY
    machine, settings = result["machine"], result["settings"]
    methods = settings["methods"]
    shown_ratios = list(RATIOS)

    def table(title: str, first: list[str]) -> Table:
        t = Table(title=title, box=style)
        for name in first:
            t.add_column(name)
        for name in ("B", "shapes", "exec/useful", "waste"):
            t.add_column(name, justify="right")
        for name in [*methods, *shown_ratios]:
            t.add_column(name, justify="right")
        return t

    main = table(
        f"Mixed sizes: samples/s summed over all models (batch {settings['batch_size']} per model, Adam, "
        f"{machine['device_name']}, {machine['threads']} thread(s))",
        ["workload"],
    )
    for name, entry in result["results"].items():
        main.add_row(name, *_row(entry))
    if result["results"]:
        console.print(main)
    if result["sweep"]:
        sweep = table(
            "Where padding stops paying: n_small + n_large models of width ratio r and 1 (ladder: widths "
            "evenly spaced from r to 1), samples/s",
            ["family", "mix", "small/large"],
        )
        previous = None
        for point in result["sweep"]:
            coords = point["sweep"]
            key = (coords["family"], coords["mix"])
            if previous is not None and key != previous:
                sweep.add_section()
            previous = key
            sweep.add_row(coords["family"], coords["mix_label"], coords["sizes"], *_row(point))
        console.print(sweep)
        for key, cross in result["crossover"].items():
            console.print(f"padded/grouped, {key}: {cross['summary']}", highlight=False, markup=False)
    console.print(
        "exec/useful: multiply-adds per sample the padded array executes / what the models need "
        "(ModelArray.padding_cost()); waste = 1 - useful/executed; shapes: arrays in 'grouped'",
        highlight=False,
        markup=False,
    )
    for entry in [*result["results"].values(), *result["sweep"]]:
        for method, cell in entry["methods"].items():
            if cell.get("unsupported"):
                console.print(
                    f"n/a  {entry.get('name', entry['family'])} {method}: {cell['unsupported']}",
                    highlight=False,
                    markup=False,
                )
    for flag in result["flags"]:
        console.print(f"!    {flag}", highlight=False, markup=False)
    console.print(
        f"torch {machine['torch']}, {machine['threads']} torch thread(s), {machine['usable_cpus']} usable CPU(s), "
        f"device {machine['device_name']}; {result['duration_s']:.0f} s; JSON: {result.get('out') or '(not written)'}",
        highlight=False,
        markup=False,
    )


# ------------------------------------------------------------------------------ command line
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.envelope",
        description="Models of one structure and different sizes trained as one padded ModelArray, as one array "
        "per exact shape, and serially: samples/s, ratios and padding waste, plus a sweep of where padding "
        "stops paying.",
    )
    parser.add_argument(
        "--workloads",
        type=comma_list(str, ("cnn1d", "mlp"), empty_ok=True),
        default=None,
        help="comma-separated mixed workloads from cnn1d,mlp, or 'none' (default: both)",
    )
    parser.add_argument(
        "--sweep",
        type=comma_list(str, list(SWEEP_FAMILIES), empty_ok=True),
        default=None,
        help=f"comma-separated sweep families from {','.join(SWEEP_FAMILIES)}, or 'none' "
        f"(default: {','.join(DEFAULT_SWEEP)}; --quick: {','.join(QUICK_SWEEP)})",
    )
    parser.add_argument(
        "--ratios",
        type=comma_list(float),
        default=None,
        help=f"small/large width ratios of the sweep (default: {','.join(map(str, DEFAULT_RATIOS))}; "
        f"--quick: {','.join(map(str, QUICK_RATIOS))})",
    )
    parser.add_argument(
        "--mixes",
        type=comma_list(str, list(MIXES)),
        default=None,
        help=f"sweep mixes from {', '.join(f'{k} ({m.label()})' for k, m in MIXES.items())} "
        f"(small+large models; --quick uses fewer) (default: all; --quick: {','.join(QUICK_MIX_NAMES)})",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument(
        "--warmup", type=int, default=None, help=f"untimed warm-up steps (default {DEFAULT_TIMING.warmup})"
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help=f"timed repeats, median reported (default {DEFAULT_TIMING.repeats})"
    )
    parser.add_argument(
        "--min-time",
        type=float,
        default=None,
        help=f"seconds a repeat lasts at least (default {DEFAULT_TIMING.min_time_s}; "
        f"--quick: {QUICK_TIMING.min_time_s})",
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help=f"most steps per repeat (default {DEFAULT_TIMING.max_steps}; --quick: {QUICK_TIMING.max_steps})",
    )
    parser.add_argument("--quick", action="store_true", help="a < 30 s run that checks the harness, not timings")
    parser.add_argument(
        "--json",
        "--out",
        dest="out",
        type=Path,
        default=None,
        help="JSON output path (default: benchmarks/results/envelope-<timestamp>.json)",
    )
    parser.add_argument("--quiet", action="store_true", help="no per-row progress lines on stderr")
    return parser


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    base = QUICK_TIMING if args.quick else DEFAULT_TIMING
    timing = Timing(
        warmup=base.warmup if args.warmup is None else args.warmup,
        repeats=base.repeats if args.repeats is None else args.repeats,
        min_time_s=base.min_time_s if args.min_time is None else args.min_time,
        max_steps=base.max_steps if args.max_steps is None else args.max_steps,
        max_cell_s=base.max_cell_s,
    )
    if timing.warmup < 1 or timing.repeats < 1 or timing.min_time_s < 0 or timing.max_steps < 1:
        build_parser().error("--warmup, --repeats and --max-steps must be >= 1 and --min-time >= 0")
    try:
        result = run_benchmark(
            args.workloads,
            args.sweep,
            args.ratios,
            args.mixes,
            args.device,
            args.threads,
            args.quick,
            timing=timing,
            progress=None if args.quiet else _log,
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = args.out or RESULTS_DIR / f"envelope-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    write_result(result, out, "benchmarks.envelope", argv)
    print_report(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
