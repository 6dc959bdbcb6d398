"""Where a bigger array stops paying on this device: the knee `--array-size auto` looks for, measured.

    python -m benchmarks.knee --device cuda --out knee.json     # mlp, cnn1d, bn_cnn, resnet18 up to B=1024
    python -m benchmarks.knee --quick --out /tmp/knee.json      # mlp up to B=4 on the CPU: checks the script

`--array-size auto` doubles the array from 1 while doubling raises the summed
throughput by at least `hfta_nas.search`'s 10% (the knee), and never past
`AUTO_CAP` models (64, a guess on a GPU). This times the throughput
benchmark's `array` method (ModelArray + hfta_nas.optim.Adam, batch 100 per
model) at B = 1, 2, 4, ... per workload, stops two doublings past the knee, at
`--max-slots` or where the GPU runs out of memory, and applies the search's
own rule to the curve (`hfta_nas.search.StepCurve.knee`). The JSON gives per
workload the curve and its knee, and `suggested_cap`: the largest knee
measured, the array-size limit these workloads want on this device. It is
rewritten after every workload, so a run stopped at its budget keeps what it
measured; `--deadline-s` gives each workload an equal share of the time left
(a curve cut short says so in `stopped`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks._methods import RUNNERS, Timing, measure_together, warm_up
from benchmarks._workloads import BATCH_SIZE, WORKLOADS, prepare
from hfta_nas.search import StepCurve

DEFAULT_WORKLOADS = ("mlp", "cnn1d", "bn_cnn", "resnet18")
TIMING = Timing(warmup=2, repeats=3, min_time_s=0.2, max_steps=100, max_cell_s=8.0)
QUICK_TIMING = Timing(warmup=1, repeats=2, min_time_s=0.01, max_steps=2, max_cell_s=4.0)
PAST_KNEE = 2  # doublings below the 10% gain before the curve is taken as flat (as the search does)
GAIN = 1.1  # hfta_nas.search's KNEE_GAIN, here only to stop measuring early


def samples_per_s(name: str, slots: int, device: torch.device, timing: Timing) -> float:
    """The throughput benchmark's `array` method for `slots` models of workload `name`."""
    prep = prepare(WORKLOADS[name], device)
    warmed = warm_up(RUNNERS["array"](prep, prep.index_table(slots, device), slots, device), timing, device)
    return measure_together({"array": warmed}, timing, device)["array"].samples_per_s


def curve(name: str, device: torch.device, max_slots: int, timing: Timing, seconds: float) -> dict[str, Any]:
    """Throughput at B = 1, 2, 4, ... (for at most about `seconds`) and the search's knee of it."""
    sizes: list[int] = []
    rates: list[float] = []
    stopped = f"--max-slots {max_slots}"
    slots, started = 1, time.monotonic()
    while slots <= max_slots:
        if time.monotonic() - started > seconds:
            stopped = f"its share of the deadline, {seconds:.0f} s"
            break
        try:
            rates.append(samples_per_s(name, slots, device, timing))
        except RuntimeError as error:  # OutOfMemoryError, or cuDNN/cuBLAS failing to allocate: where B ends
            stopped = f"at B={slots}: {str(error).splitlines()[0][:200]}"
            break
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        sizes.append(slots)
        gains = [rates[i] / rates[i - 1] for i in range(1, len(rates))]
        if len(gains) >= PAST_KNEE and all(g < GAIN for g in gains[-PAST_KNEE:]):
            stopped = "flat: two doublings below the knee's gain"
            break
        slots *= 2
    # StepCurve wants seconds per step of the whole array: B x batch / samples per second.
    step_s = tuple(size * BATCH_SIZE / rate for size, rate in zip(sizes, rates))
    knee = StepCurve(0, tuple(sizes), step_s, 0.0, 0.0).knee if sizes else None
    return {"sizes": sizes, "samples_per_s": rates, "knee": knee, "stopped": stopped}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.knee", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS), help="comma-separated workloads")
    parser.add_argument("--max-slots", type=int, default=1024, help="the largest B tried (default 1024)")
    parser.add_argument(
        "--deadline-s", type=float, default=float("inf"), help="seconds for all workloads, shared equally"
    )
    parser.add_argument("--quick", action="store_true", help="mlp up to B=4, few steps: checks the script")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file (rewritten after every workload)")
    args = parser.parse_args(argv)
    names = ["mlp"] if args.quick else [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or (args.device == "cuda" and not torch.cuda.is_available()):
        print(f"error: unknown workloads {unknown} or no CUDA device; workloads: {list(WORKLOADS)}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    device = torch.device(args.device)
    max_slots, timing = (4, QUICK_TIMING) if args.quick else (args.max_slots, TIMING)
    result: dict[str, Any] = {"batch": BATCH_SIZE, "rule": "hfta_nas.search.StepCurve.knee", "workloads": {}}
    started = time.monotonic()
    for done, name in enumerate(names):  # each workload gets an equal share of what is left
        share = (args.deadline_s - (time.monotonic() - started)) / (len(names) - done)
        result["workloads"][name] = curve(name, device, max_slots, timing, share)
        knees = [w["knee"] for w in result["workloads"].values() if w["knee"]]
        result["suggested_cap"] = max(knees, default=None)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"{name}: knee {result['workloads'][name]['knee']}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
