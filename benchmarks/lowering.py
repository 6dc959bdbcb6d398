"""Which lowering a device wants, per layer kind and size: one call per slot, or one grouped call.

    python -m benchmarks.lowering --device cuda --out lowering.json    # ~30 s on a GPU
    python -m benchmarks.lowering --quick                              # a few small layers on the CPU: checks it

An array runs each convolution either as one ordinary convolution per slot
(`loop`) or as one grouped convolution over all slots (`grouped`), and each
BatchNorm as one call per slot or as one batch norm over the B*C channels;
`hfta_nas.layers`' `conv_per_slot` decides from the device and the layer's
multiply-adds per slot (`HFTA_NAS_LOWERING` forces either). On the CPU the
bound was measured; on a GPU it is a guess (always grouped). This measures
one layer of each kind and size in an array of B slots, forward and backward
(no optimizer: its cost does not depend on the lowering), both lowerings timed
in turns (median of the repeats), and derives the rule the code can cite:

- per convolution kind, `loop_from_per_slot_macs`: the smallest measured size
  from which the loop is at least `CLEAR` times faster at that size and every
  larger one (None: grouped wins or ties everywhere measured);
- for BatchNorm, `prefer`: the lowering faster at most sizes.

The JSON is written after every layer, so a run stopped at its budget keeps
what it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import hfta_nas
from benchmarks._methods import synchronizer

BATCH = 100  # samples per slot, as in every benchmark
SLOTS = 64
CLEAR = 1.05  # the loop must beat grouped by this factor to count as faster (timing noise)

# (kind, channels, spatial size): per-slot multiply-adds from ~1e5 to ~4e9 for each kind
LAYERS: list[tuple[str, int, int]] = [  # the cheapest and most used first: a run cut short keeps them
    *(("batchnorm2d", c, 32) for c in (8, 32, 64)),
    *(("conv2d", c, 32) for c in (4, 8, 16, 32, 64)),  # CIFAR's 32x32, k=3
    *(("conv1d", c, 40) for c in (4, 8, 16, 32, 64, 128)),  # MNIST-1D's length, k=5
    *(("conv2d", c, 8) for c in (4, 8, 16, 32, 64)),  # digits' 8x8, k=3
]
QUICK_LAYERS: list[tuple[str, int, int]] = [
    ("conv1d", 4, 40),
    ("conv1d", 16, 40),
    ("conv2d", 4, 8),
    ("batchnorm2d", 4, 8),
]


def layer(kind: str, channels: int, size: int) -> tuple[Callable[[], nn.Module], tuple[int, ...], int]:
    """The layer's factory, one sample's shape and its multiply-adds per slot (BatchNorm: its elements)."""
    if kind == "conv1d":
        macs = BATCH * size * channels * channels * 5
        return (lambda: nn.Conv1d(channels, channels, 5, padding=2)), (channels, size), macs
    if kind == "conv2d":
        macs = BATCH * size * size * channels * channels * 9
        return (lambda: nn.Conv2d(channels, channels, 3, padding=1)), (channels, size, size), macs
    return (lambda: nn.BatchNorm2d(channels)), (channels, size, size), BATCH * channels * size * size


def time_lowerings(kind: str, channels: int, size: int, slots: int, device: torch.device, min_s: float) -> dict:
    """Seconds per forward + backward of the layer in an array of `slots`, under each lowering."""
    factory, shape, macs = layer(kind, channels, size)
    x = torch.randn(slots, BATCH, *shape, device=device, requires_grad=True)
    sync = synchronizer(device)
    # One array per lowering: an array remembers which calls ran without vmap, per input shape, and
    # that memory does not expect HFTA_NAS_LOWERING to change under it.
    arrays = {
        lowering: hfta_nas.ModelArray.from_factory(factory, seeds=range(slots), device=device).train()
        for lowering in ("loop", "grouped")
    }

    def step(lowering: str) -> None:
        os.environ["HFTA_NAS_LOWERING"] = lowering
        arrays[lowering](x).square().mean().backward()

    seconds: dict[str, list[float]] = {name: [] for name in arrays}
    per_step: dict[str, float] = {}
    for lowering in arrays:  # warm-up and calibration
        step(lowering)
        sync()
        started = time.perf_counter()
        step(lowering)
        sync()
        per_step[lowering] = time.perf_counter() - started
    steps = {name: max(1, min(200, math.ceil(min_s / max(s, 1e-6)))) for name, s in per_step.items()}
    try:
        for _ in range(3):
            for lowering in arrays:  # in turns: drift hits both alike
                sync()
                started = time.perf_counter()
                for _ in range(steps[lowering]):
                    step(lowering)
                sync()
                seconds[lowering].append((time.perf_counter() - started) / steps[lowering])
    finally:
        os.environ.pop("HFTA_NAS_LOWERING", None)
    loop, grouped = statistics.median(seconds["loop"]), statistics.median(seconds["grouped"])
    return {
        "kind": kind,
        "channels": channels,
        "size": size,
        "slots": slots,
        "per_slot_macs": macs,
        "loop_ms": loop * 1e3,
        "grouped_ms": grouped * 1e3,
        "grouped_over_loop": grouped / loop,
    }


def rule(points: list[dict[str, Any]]) -> dict[str, Any]:
    """The lowering rule per layer kind from the measured points (see the module docstring)."""
    rules: dict[str, Any] = {}
    for kind in sorted({p["kind"] for p in points}):
        mine = sorted((p for p in points if p["kind"] == kind), key=lambda p: p["per_slot_macs"])
        if kind.startswith("batchnorm"):
            loop_wins = sum(p["grouped_over_loop"] >= 1.0 for p in mine)
            rules[kind] = {"prefer": "loop" if 2 * loop_wins > len(mine) else "grouped", "points": len(mine)}
            continue
        start = None
        for index in range(len(mine) - 1, -1, -1):  # walk down from the largest while the loop keeps winning
            if mine[index]["grouped_over_loop"] < CLEAR:
                break
            start = mine[index]["per_slot_macs"]
        rules[kind] = {"loop_from_per_slot_macs": start, "points": len(mine)}
    return rules


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lowering", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--slots", type=int, default=SLOTS, help=f"B, the array's size (default {SLOTS})")
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds a repeat lasts at least (default 0.05)")
    parser.add_argument("--quick", action="store_true", help="4 small layers, B=4: checks the script")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file (rewritten after every layer)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda was asked for but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    device = torch.device(args.device)
    layers, slots = (QUICK_LAYERS, 4) if args.quick else (LAYERS, args.slots)
    result: dict[str, Any] = {"slots": slots, "batch": BATCH, "clear_factor": CLEAR, "points": [], "failed": []}
    for kind, channels, size in layers:
        try:
            point = time_lowerings(kind, channels, size, slots, device, 0.01 if args.quick else args.min_time)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as error:  # a size the device cannot hold: a result
            result["failed"].append({"kind": kind, "channels": channels, "size": size, "error": str(error)[:300]})
            continue
        result["points"].append(point)
        result["rule"] = rule(result["points"])
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"{kind} c={channels} n={size}: grouped/loop {point['grouped_over_loop']:.2f}", file=sys.stderr)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
