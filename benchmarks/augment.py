"""What on-device augmentation costs: training epochs of one array with each augmentation, as ratios.

    python -m benchmarks.augment                  # CIFAR-shaped 3x32x32, 8 slots, 3 repeats per variant
    python -m benchmarks.augment --quick          # small: checks the script
    python -m benchmarks.augment --device cuda --out benchmarks/results/augment-gpu.json

Every variant trains the same array (the example CNN of examples/cifar_shaped, Adam,
per-slot data orders) for one epoch of synthetic data in the same run; the time of
an epoch without augmentation is the baseline and each variant's cost is printed as
its epoch time over the baseline's (median of the repeats, variants interleaved so
that load on the machine falls on all alike).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

import hfta_nas
from hfta_nas.data import Augmentation, Dataset

VARIANTS: dict[str, Augmentation | None] = {
    "none": None,
    "shift 4": Augmentation(shift=4),
    "flip": Augmentation(flip=True),
    "noise 0.1": Augmentation(noise=0.1),
    "mixup 0.2": Augmentation(mixup=0.2),
    "cutmix 1.0": Augmentation(cutmix=1.0),
    "shift + flip + mixup": Augmentation(shift=4, flip=True, mixup=0.2),
}


def synthetic(samples: int, side: int, device: torch.device) -> Dataset:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(samples, 3, side, side, generator=g)
    y = torch.randint(0, 10, (samples,), generator=g)
    empty_x, empty_y = x[:0], y[:0]
    return Dataset("synthetic", x, y, empty_x, empty_y, empty_x, empty_y, 10).to(device=device)


def build(width: int):
    from hfta_nas.models import load_factory

    build_cnn = load_factory(
        str(Path(__file__).resolve().parents[1] / "examples" / "cifar_shaped" / "model.py") + ":build_cnn"
    )
    return lambda: build_cnn(width=width)


def epoch_seconds(
    data: Dataset, augmentation: Augmentation | None, slots: int, width: int, batch: int, device: torch.device
) -> float:
    """Seconds of two timed training epochs: between the ends of epochs 1 and 3 (each epoch's end reads
    its metrics to the host, so a GPU has finished its work there)."""
    seeds = list(range(slots))
    array = hfta_nas.ModelArray.from_factory(build(width), seeds=seeds, device=device)
    optimizer = hfta_nas.optim.Adam(array, lr=1e-3)
    trainer = hfta_nas.ArrayTrainer(
        array, optimizer, data, batch_size=batch, data_seeds=seeds, augmentation=augmentation, evaluate_test=False
    )
    ends: list[float] = []
    # epoch 1 is the warm-up (the first call checks the fusion and allocates); epochs 2 and 3 are timed
    trainer.fit(3, on_epoch=lambda report, _: ends.append(time.perf_counter()))
    return ends[2] - ends[0]


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    data = synthetic(args.samples, 32, device)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.repeats):
        for name, augmentation in VARIANTS.items():
            times[name].append(epoch_seconds(data, augmentation, args.slots, args.width, args.batch_size, device))
    base = statistics.median(times["none"])
    return {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "slots": args.slots,
        "width": args.width,
        "samples": args.samples,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "epoch_seconds": {name: statistics.median(values) for name, values in times.items()},
        "cost_ratio": {name: statistics.median(values) / base for name, values in times.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 slots, 128 samples, 1 repeat")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.slots, args.samples, args.repeats = 2, 128, 1
    torch.set_num_threads(args.threads)
    figures = run(args)
    print(
        f"augmentation cost, {figures['slots']} slots, CIFAR-shaped batches of {figures['batch_size']}, "
        f"{figures['device']}, {figures['threads']} thread(s): epoch time / epoch time without"
    )
    for name, ratio in figures["cost_ratio"].items():
        print(f"  {name:22s} {ratio:5.2f}x  ({figures['epoch_seconds'][name]:.2f} s for 2 epochs)")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
