"""What the engine's safety nets cost: a forward run slot by slot, and the running check.

    python -m benchmarks.forward_checks      # ~1 min on 2 cores; writes benchmarks/results/forward_checks.json
    python -m benchmarks.forward_checks --quick --json /tmp/f.json   # seconds: checks the harness

1. Slot by slot. A forward that branches on a tensor's value cannot run as one fused call, so the array
   runs its slots one by one (`hfta_nas/array/_slot_loop.py`). An MLP (64 inputs, two hidden layers of
   128, 10 classes, batch 128, Adam) is trained as an array of B slots twice on the same batches: its
   plain forward (fused) and the same forward behind an always-true branch on `x.mean()` (slot by slot).
   Statistic: the median of repeated timed training steps (forward, backward, Adam), the two variants'
   repeats interleaved; the ratio is slot-by-slot step time / fused step time at each B.
2. The running check. An array of 4 MLPs of widths 32, 64, 96, 128 (an envelope) trains with
   `recheck_every = 1` (a check at every call) and `= 0` (none), interleaved; the check's cost is the
   difference of the median step times, and its share at the default (one check per 100 calls) is
   cost / (100 x the unchecked step). Since the check reads the whole batch, it is measured at two batch
   sizes.

The thread count is fixed (`--threads`, default 1) and the machine's load average is recorded before and
after, since a busy 2-core machine slows small steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import hfta_nas

RESULTS = Path(__file__).parent / "results" / "forward_checks.json"


class MLP(nn.Module):
    def __init__(self, width: int = 128, branch: bool = False) -> None:
        super().__init__()
        self.branch = branch
        self.body = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.branch and x.mean() > float("-inf"):  # always true, but vmap cannot know
            x = x + 0.0
        return self.head(self.body(x))


def _step(arr: hfta_nas.ModelArray, opt, x: torch.Tensor, y: torch.Tensor) -> None:
    logits = arr(x)
    loss = sum(F.cross_entropy(logits[b], y[b]) for b in range(len(arr)))
    opt.zero_grad()
    loss.backward()
    opt.step()


def _timed(arrays: dict[str, tuple], batches: list, repeats: int) -> dict[str, float]:
    """Median seconds per step of each (array, optimizer), their repeats interleaved."""
    times: dict[str, list[float]] = {name: [] for name in arrays}
    for arr, opt in arrays.values():  # warm up: first calls, checks and allocations
        for x, y in batches[:2]:
            _step(arr, opt, x, y)
    for _ in range(repeats):
        for name, (arr, opt) in arrays.items():
            started = time.perf_counter()
            for x, y in batches:
                _step(arr, opt, x, y)
            times[name].append((time.perf_counter() - started) / len(batches))
    return {name: statistics.median(values) for name, values in times.items()}


def _batches(slots: int, batch: int, steps: int) -> list:
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(slots, batch, 64, generator=g), torch.randint(0, 10, (slots, batch), generator=g))
        for _ in range(steps)
    ]


def slot_by_slot(sizes: list[int], steps: int, repeats: int) -> list[dict]:
    rows = []
    for slots in sizes:
        arrays = {}
        for name, branch in (("fused", False), ("slot_by_slot", True)):
            arr = hfta_nas.ModelArray.from_factory(lambda b=branch: MLP(branch=b), seeds=range(slots))
            arrays[name] = (arr, hfta_nas.optim.Adam(arr, lr=1e-3))
        with torch.random.fork_rng(), _quiet():
            seconds = _timed(arrays, _batches(slots, 128, steps), repeats)
        assert arrays["slot_by_slot"][0]._one_by_one is not None and arrays["fused"][0]._one_by_one is None
        rows.append(
            {
                "slots": slots,
                **{f"{k}_step_s": v for k, v in seconds.items()},
                "ratio": seconds["slot_by_slot"] / seconds["fused"],
            }
        )
    return rows


def running_check(batches_per_slot: list[int], steps: int, repeats: int) -> list[dict]:
    rows = []
    for batch in batches_per_slot:
        arrays = {}
        for name, every in (("checked_every_call", 1), ("unchecked", 0)):
            models = []
            for seed, width in enumerate((32, 64, 96, 128)):
                torch.manual_seed(seed)
                models.append(MLP(width))
            arr = hfta_nas.ModelArray(models)
            arr.recheck_every = every
            arrays[name] = (arr, hfta_nas.optim.Adam(arr, lr=1e-3))
        seconds = _timed(arrays, _batches(4, batch, steps), repeats)
        check = seconds["checked_every_call"] - seconds["unchecked"]
        rows.append(
            {
                "batch": batch,
                "step_s": seconds["unchecked"],
                "check_s": check,
                "check_per_step": check / seconds["unchecked"],
                "share_at_default": check / (hfta_nas.ModelArray.RECHECK_EVERY * seconds["unchecked"]),
            }
        )
    return rows


class _quiet:
    """The slot-by-slot variant warns once that it runs its slots one by one: expected here."""

    def __enter__(self):
        import warnings

        self._context = warnings.catch_warnings()
        self._context.__enter__()
        warnings.simplefilter("ignore", hfta_nas.FusionFallbackWarning)

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few steps and repeats: checks the harness")
    parser.add_argument("--threads", type=int, default=1, help="torch threads [default: 1]")
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"where to write the results [default: {RESULTS}]")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    steps, repeats = (3, 2) if args.quick else (10, 7)
    load_before = os.getloadavg()
    started = time.monotonic()
    result = {
        "slot_by_slot": slot_by_slot([2, 4] if args.quick else [4, 16], steps, repeats),
        "running_check": running_check([32, 64] if args.quick else [64, 256], steps, repeats),
        "quick": args.quick,
        "machine": {
            "torch": torch.__version__,
            "threads": args.threads,
            "usable_cpus": len(os.sched_getaffinity(0)),
            "load_average_before": [round(v, 2) for v in load_before],
            "load_average_after": [round(v, 2) for v in os.getloadavg()],
        },
        "duration_s": round(time.monotonic() - started, 1),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    for row in result["slot_by_slot"]:
        print(f"slot by slot, B={row['slots']}: {row['ratio']:.2f}x the fused step time (median step)")
    for row in result["running_check"]:
        print(
            f"running check, batch {row['batch']}: one check costs {row['check_per_step']:.2f} steps; "
            f"{row['share_at_default']:.2%} of training at one check per {hfta_nas.ModelArray.RECHECK_EVERY} calls"
        )
    machine = result["machine"]
    print(f"load average before {machine['load_average_before']}, after {machine['load_average_after']}: {args.json}")
    return result


if __name__ == "__main__":
    main()
