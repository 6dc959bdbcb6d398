"""Per-slot dropout against torch's own: the time of a dropout layer in an array of B slots over
the time of `torch.nn.functional.dropout` on the same elements, forward and backward.

    python -m benchmarks.dropout                    # MLP- and conv-shaped activations, B = 1, 8, 32, 1 thread
    python -m benchmarks.dropout --out dropout.json
    python -m benchmarks.dropout --keep-freed-memory   # glibc keeps freed memory, as the hfta-nas commands set it
    python -m benchmarks.dropout --device cuda --slots 1,8,64   # on a GPU: the array's layer and torch's only

The array's layer (`SlotDropout` on physical [B, ...] tensors) draws each slot's mask from its
own seed by hashing coordinates; torch's draws from its global generator. Both then scale the
kept entries by 1 / (1 - p) and multiply, forward and backward. Also timed, as ratios to torch's
too: the two algorithms this one replaced, `previous` (coordinates hashed dim by dim with a full
mix per leading dim and the scale applied by `torch.where`) and `flat` (a flat index into the
envelope's shape, two full mixes, mask and scale as two multiplies). All are timed in turns in one
run (medians of repeats), so the ratios survive a shared machine's drift. The target is a ratio
of at most ~1.2 on this CPU.

On a GPU only the array's layer and torch's are timed (the replaced algorithms were CPU-only),
each turn ended by a synchronize. There a mask's ~15 small ops are ~15 kernel launches against
torch's few, which a small model's array of one pays at each dropout layer of each step.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from benchmarks._cli import comma_list, write_result
from benchmarks._methods import synchronizer
from hfta_nas.layers import SlotDropout, mix32, slot_keys

# one slot's activation: (name, shape)
SHAPES = {"mlp-256": (100, 256), "mlp-64": (100, 64), "conv1d": (100, 32, 40), "conv2d": (32, 16, 16, 16)}
P = 0.25
REPLACED = ("previous", "flat")  # the algorithms this one replaced, timed on the CPU only
METHODS = ("array", *REPLACED, "torch")
_MASK32, _MULTIPLIER = 0xFFFFFFFF, 0x45D9F3B


# ------------------------------------------------------------------ the algorithms this one replaced
def _threshold(p: float, dtype: torch.dtype) -> int:
    return math.ceil(torch.tensor(p, dtype=dtype).item() * (1 << 24)) << 8


def _mix32_(x: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    for last in (False, False, True):
        x.bitwise_xor_(torch.bitwise_right_shift(x, 16, out=scratch))
        if not last:
            x.mul_(_MULTIPLIER).bitwise_and_(_MASK32)
    return x


def previous_multiplier(
    shape: tuple[int, ...], key: torch.Tensor, counter: torch.Tensor, p: float, dtype: torch.dtype
) -> torch.Tensor:
    """The coordinate hash as it was before (mix32 per leading dim, one full mix32 in place over the
    last dim, keep = bits >= threshold, the scale by `torch.where`); key, counter [B, 1, ...]."""
    bits = mix32(key ^ mix32(counter & _MASK32))
    for dim, size in enumerate(shape):
        view = [1] * (len(shape) + 1)
        view[dim + 1] = size
        index = torch.arange(size, dtype=torch.int64).view(view)
        if dim < len(shape) - 1:
            bits = mix32(bits ^ index)
        else:
            bits = bits ^ index
            _mix32_(bits, torch.empty_like(bits))
    keep = bits >= _threshold(p, dtype)
    return torch.where(keep, torch.tensor(1.0 / (1.0 - p), dtype=dtype), 0.0)


def flat_keep(
    shape: tuple[int, ...], key: torch.Tensor, counter: torch.Tensor, p: float, dtype: torch.dtype
) -> torch.Tensor:
    """The flat-index hash the coordinates replaced (a padded slot drew other masks than alone)."""
    state = mix32(key ^ mix32(counter & _MASK32))
    bits = torch.arange(math.prod(shape), dtype=torch.int64).view(1, *shape) ^ state
    scratch = torch.empty_like(bits)
    _mix32_(bits, scratch).bitwise_xor_(state)
    return _mix32_(bits, scratch) >= _threshold(p, dtype)


# ------------------------------------------------------------------ timing
def _timed(step: Callable[[], None], inner: int, sync: Callable[[], None]) -> float:
    sync()
    started = time.perf_counter()
    for _ in range(inner):
        step()
    sync()
    return (time.perf_counter() - started) / inner


def measure(
    shape: tuple[int, ...], slots: int, repeats: int, inner: int, device: torch.device | None = None
) -> dict[str, Any]:
    """Seconds per forward + backward of each method over the same [B, *shape] activation, timed in turns
    (on a device other than the CPU: the array's layer and torch's only)."""
    device = device or torch.device("cpu")
    methods = METHODS if device.type == "cpu" else tuple(m for m in METHODS if m not in REPLACED)
    sync = synchronizer(device)
    x = torch.randn(slots, *shape, requires_grad=True, device=device)
    layer = SlotDropout(P).train()
    keys = slot_keys(torch.arange(slots, dtype=torch.int64, device=device) * 7919, 0)
    calls = torch.zeros(slots, dtype=torch.int64, device=device)
    lead = (slots,) + (1,) * len(shape)
    scale = 1.0 / (1.0 - P)

    def array() -> None:
        layer.native_forward(x, keys, calls).sum().backward()

    def previous() -> None:
        calls.add_(1)
        (x * previous_multiplier(shape, keys.view(lead), calls.view(lead), P, x.dtype)).sum().backward()

    def flat() -> None:
        calls.add_(1)
        (x * flat_keep(shape, keys.view(lead), calls.view(lead), P, x.dtype) * scale).sum().backward()

    def torchs() -> None:
        F.dropout(x, P, training=True).sum().backward()

    steps = {"array": array, "previous": previous, "flat": flat, "torch": torchs}
    for name in methods:  # warm up (caches, allocator, kernels)
        for _ in range(2):
            steps[name]()
    if inner <= 0:  # auto: about 50 ms per turn of torch's
        inner = max(1, min(50, round(0.05 / _timed(torchs, 1, sync))))
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(repeats):  # in turns: drift hits all alike
        for name in methods:
            times[name].append(_timed(steps[name], inner, sync))
    seconds = {name: statistics.median(values) for name, values in times.items()}
    ratios = {f"{name}_ratio": seconds[name] / seconds["torch"] for name in REPLACED if name in seconds}
    return {
        "slots": slots,
        "elements": x.numel(),
        "inner": inner,
        **{f"{name}_s": value for name, value in seconds.items()},
        "ratio": seconds["array"] / seconds["torch"],
        **ratios,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--shapes", type=comma_list(str, SHAPES), default=list(SHAPES), help="activation shapes")
    parser.add_argument("--slots", type=comma_list(int), default=[1, 8, 32], help="array sizes B")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--repeats", type=int, default=7, help="timed turns per method (the median is kept)")
    parser.add_argument(
        "--inner",
        type=int,
        default=0,
        help="forward+backward passes per turn (0: as many as take ~50 ms of torch's dropout)",
    )
    parser.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="glibc keeps freed memory for reuse, as the hfta-nas commands set it (no page faults "
        "for each step's large buffers); default: the allocator as plain PyTorch leaves it",
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    allocator = None
    if args.keep_freed_memory:
        from hfta_nas import keep_freed_memory

        allocator = keep_freed_memory()
    rows = []
    device = torch.device(args.device)
    print(
        f"dropout p={P}, forward + backward, on {device}, {args.threads} torch thread(s), "
        f"allocator: {allocator or 'default'}"
    )
    print(
        "  time per call; ratios to torch.nn.functional.dropout on the same elements "
        "(array: this one; previous, flat: the algorithms it replaced)"
    )
    for name in args.shapes:
        for slots in args.slots:
            row = {
                "shape": name,
                "per_slot": list(SHAPES[name]),
                **measure(SHAPES[name], slots, args.repeats, args.inner, device),
            }
            rows.append(row)
            replaced = ", ".join(f"{k} {row[f'{k}_ratio']:.2f}" for k in REPLACED if f"{k}_ratio" in row)
            print(
                f"  {name:8s} B={slots:3d} ({row['elements']:>9,} elements): array {row['array_s'] * 1e3:7.3f} ms, "
                f"torch {row['torch_s'] * 1e3:7.3f} ms, ratio {row['ratio']:.2f}",
                f"({replaced})" if replaced else "",
            )
    for key, label in (("ratio", "array"), *((f"{name}_ratio", name) for name in REPLACED)):
        ratios = [row[key] for row in rows if key in row]
        if ratios:
            print(f"{label:8s} ratio median {statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}]")
    if args.out:
        write_result(
            {"p": P, "threads": args.threads, "device": str(device), "allocator": allocator, "rows": rows},
            args.out,
            "benchmarks.dropout",
            argv,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
