"""Per-slot dropout against torch's own: the time of a dropout layer in an array of B slots over
the time of `torch.nn.functional.dropout` on the same elements, forward and backward.

    python -m benchmarks.dropout                    # MLP- and conv-shaped activations, B = 1, 8, 32, 1 thread
    python -m benchmarks.dropout --out dropout.json

The array's layer (`SlotDropout` on physical [B, ...] tensors) draws each slot's mask from its
own seed by hashing coordinates; torch's draws from its global generator. Both then scale the
kept entries by 1 / (1 - p) and multiply, forward and backward. The two are timed in turns in one
run (medians of repeats), so the ratio survives a shared machine's drift. The target is a ratio
of at most ~1.2 on this CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from benchmarks._cli import comma_list, write_result
from hfta_nas._slot_layers import SlotDropout
from hfta_nas._slot_random import slot_keys

# one slot's activation: (name, shape)
SHAPES = {"mlp-256": (100, 256), "mlp-64": (100, 64), "conv1d": (100, 32, 40), "conv2d": (32, 16, 16, 16)}
P = 0.25


def _timed(step: Callable[[], None], repeats: int, inner: int) -> list[float]:
    for _ in range(3):
        step()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(inner):
            step()
        samples.append((time.perf_counter() - started) / inner)
    return samples


def measure(shape: tuple[int, ...], slots: int, repeats: int, inner: int) -> dict[str, Any]:
    """Seconds per forward + backward of the array's dropout and of torch's, timed in turns."""
    x = torch.randn(slots, *shape, requires_grad=True)
    layer = SlotDropout(P).train()
    keys = slot_keys(torch.arange(slots, dtype=torch.int64) * 7919, 0)
    calls = torch.zeros(slots, dtype=torch.int64)

    def ours() -> None:
        layer.native_forward(x, keys, calls).sum().backward()

    def torchs() -> None:
        F.dropout(x, P, training=True).sum().backward()

    times: dict[str, list[float]] = {"array": [], "torch": []}
    for _ in range(repeats):  # in turns: drift hits both alike
        times["array"] += _timed(ours, 1, inner)
        times["torch"] += _timed(torchs, 1, inner)
    array_s, torch_s = statistics.median(times["array"]), statistics.median(times["torch"])
    return {"slots": slots, "elements": x.numel(), "array_s": array_s, "torch_s": torch_s, "ratio": array_s / torch_s}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--shapes", type=comma_list(str, SHAPES), default=list(SHAPES), help="activation shapes")
    parser.add_argument("--slots", type=comma_list(int), default=[1, 8, 32], help="array sizes B")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=7, help="timed turns per method (the median is kept)")
    parser.add_argument("--inner", type=int, default=20, help="forward+backward passes per turn")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    print(f"dropout p={P}, forward + backward, {args.threads} torch thread(s): array / torch.nn.functional.dropout")
    for name in args.shapes:
        for slots in args.slots:
            row = {"shape": name, "per_slot": list(SHAPES[name]), **measure(SHAPES[name], slots, args.repeats, args.inner)}
            rows.append(row)
            print(f"  {name:8s} B={slots:3d} ({row['elements']:>9,} elements): array {row['array_s'] * 1e3:7.3f} ms, "
                  f"torch {row['torch_s'] * 1e3:7.3f} ms, ratio {row['ratio']:.2f}")
    ratios = [row["ratio"] for row in rows]
    print(f"ratio median {statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}]")
    if args.out:
        write_result({"p": P, "threads": args.threads, "rows": rows}, args.out, "benchmarks.dropout", argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
