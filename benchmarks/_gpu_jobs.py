"""The jobs a GPU user runs, on one device: the OOM split and `--array-size auto` under a real memory
limit, then the main job (a 32-seed stability study) and the shipped PBT space from the command line.

The memory limit is real on CUDA: torch.cuda.set_per_process_memory_fraction caps the caching
allocator at the memory measured for about half an array, so the whole array runs out of memory
on the device and is split. The CPU has no such cap: there the limit checks are skipped
(tests/test_oom.py covers the CPU's budget) and the runs go through unlimited.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks._gpu_compare import Recorder
from hfta_nas.search import ArraySizeChosen, ArraySplit, ArrayStarted
from hfta_nas.stability import LabelledConfig, run_stability
from tests.test_search import search, space_text
from tests.test_stability import mlp_config

ROOT = Path(__file__).resolve().parents[1]
# Each command-line job on the GPU (the whole check has 6 minutes there); on a CPU, as long as it takes.
JOB_TIMEOUT_S = {"cuda": 150, "cpu": None}
# A quick run trains on 1000 generated MNIST-1D samples, not 5000, for one or two epochs.
QUICK_DATA = "data.num_samples=1000"
# Sane results: a quick job (one or two epochs on 1000 samples) beats chance (10 classes); the full
# jobs (8 and 30 epochs on 5000) are far past it (the PBT space's median final best on the CPU was
# 95.75% val acc, docs/performance.md).
SANE_ACCURACY = {True: 0.1, False: 0.5}


def _wide_mlp(quick: bool):
    """digits through an MLP wide enough that an array's memory is tens of MB a slot on a GPU."""
    width = 256 if quick else 2048
    return mlp_config(model_config={"width": width, "depth": 2})


@contextlib.contextmanager
def _cuda_memory_cap(device: torch.device, cap_bytes: int):
    """The allocator capped at what it holds now plus `cap_bytes`; lifted afterwards."""
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = (torch.cuda.memory_reserved(device) + cap_bytes) / total
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    try:
        yield fraction
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()


def _peak_bytes_of(device: torch.device, run):
    """run() and the most memory it allocated beyond what was allocated before."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    result = run()
    return result, torch.cuda.max_memory_allocated(device) - before


def oom_split(rec: Recorder, device: torch.device, quick: bool) -> None:
    """A 4-seed stability run whose array does not fit the cap is split in halves and ends as the
    unsplit run (float64); with auto sizing, a search under the same cap completes every trial."""
    config = [LabelledConfig("wide", _wide_mlp(quick))]
    run = lambda **kw: run_stability(config, n_seeds=4, dtype="float64", device=str(device), **kw)  # noqa: E731
    if device.type != "cuda":
        run()  # the CPU has no allocator cap to split under: the run itself is the check there
        rec.skip("memory limit", "OOM split under a real cap", "no per-process memory cap on the CPU")
        _auto_search(rec, device, quick, cap=None)
        return
    (whole, _), peak = _peak_bytes_of(device, run)
    events = []
    with _cuda_memory_cap(device, int(peak * 0.6)) as fraction:  # about half an array (and its slack) fits
        split, _ = run(on_event=lambda kind, info: events.append((kind, info)))
        _auto_search(rec, device, quick, cap=fraction)
    sizes = [array["size"] for array in split.metadata["arrays"]]
    splits = [info["size"] for kind, info in events if kind == "split"]
    rec.condition(
        "memory limit",
        "array of 4 split on CUDA out of memory",
        bool(splits) and max(sizes) < 4,
        f"peak {peak / 2**20:.0f} MiB for 4 slots, cap fraction {fraction:.5f}, split {splits}, arrays {sizes}",
    )
    difference = _seeds_difference(split.seeds, whole.seeds)
    rec.compare("memory limit", "split run's seeds vs unsplit (float64 test_acc, train_loss)", difference, 1e-10)


def _seeds_difference(got, want) -> float:
    if list(got["status"]) != list(want["status"]):
        return math.inf
    columns = ["test_acc", "train_loss"]
    return float((got[columns] - want[columns]).abs().to_numpy().max())


def _auto_search(rec: Recorder, device: torch.device, quick: bool, cap: float | None) -> None:
    """`array.size: auto` (the step curve measured on the device, memory from the device's free
    memory, which the cap does not lower: arrays it sizes may then run out and split)."""
    width = _wide_mlp(quick).model_config["width"]
    text = space_text(
        model={"family": "mlp", "config": {"depth": 2, "width": width}},
        params={"training.optimizer.lr": {"distribution": "log_uniform", "min": 1e-3, "max": 3e-2}},
        training={"epochs": 1, "optimizer": {"name": "adam", "lr": 1e-3}},
    )
    events = []
    with tempfile.TemporaryDirectory() as folder:
        summary = search(Path(folder), text, array_size="auto", device=str(device), on_event=events.append)
    chosen = {event.structure: event.size for event in events if isinstance(event, ArraySizeChosen)}
    started = [len(event.trials) for event in events if isinstance(event, ArrayStarted)]
    splits = [(event.slots, event.half) for event in events if isinstance(event, ArraySplit)]
    under = "under the cap" if cap is not None else "no cap"
    rec.condition(
        "array size auto",
        f"every trial completes ({under})",
        summary.trials == {"COMPLETE": 6},
        f"trials {summary.trials}, auto chose {list(chosen.values())}, arrays {started}, splits {splits}",
    )


def _cli(device: torch.device, *arguments: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "hfta_nas.cli", *arguments],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S[device.type],
    )


def _last_line(process: subprocess.CompletedProcess) -> str:
    lines = (process.stderr or process.stdout).strip().splitlines()
    return f"exit {process.returncode}: {lines[-1][:300] if lines else ''}"


def stability_study(rec: Recorder, device: torch.device, quick: bool, out: Path) -> None:
    """`hfta-nas stability --seeds 32 --device DEVICE`: exit 0, every seed completed, accuracy above
    chance (10 classes; the full job: above 0.5) and finite losses."""
    seeds = 4 if quick else 32
    folder = out / "stability"
    budget = ["--set", "epochs=1", "--set", QUICK_DATA] if quick else []
    process = _cli(
        device,
        "stability",
        "--seeds",
        str(seeds),
        "--device",
        str(device),
        *budget,
        "--storage",
        str(folder / "seeds.journal"),
        "--out",
        str(folder / "report"),
        "--format",
        "json,md",
        "--plot-format",
        "png",
    )
    rec.condition("main job", f"stability --seeds {seeds} exits 0", process.returncode == 0, _last_line(process))
    table = folder / "report" / "result" / "seeds.csv"
    rows = list(csv.DictReader(table.open())) if table.exists() else []
    accuracies = [float(row["test_acc"]) for row in rows if row["status"] == "completed"]
    mean = sum(accuracies) / len(accuracies) if accuracies else math.nan
    rec.condition(
        "main job",
        f"stability: {seeds} seeds completed, mean test_acc above {SANE_ACCURACY[quick]}",
        len(accuracies) == seeds
        and mean > SANE_ACCURACY[quick]
        and all(math.isfinite(float(r["train_loss"])) for r in rows),
        f"{len(accuracies)}/{seeds} completed, mean test_acc {mean:.3f}",
    )


def pbt_space(rec: Recorder, device: torch.device, quick: bool, out: Path) -> None:
    """The shipped PBT space (8 members, exploit every 3 epochs, 30 epochs) on DEVICE: exit 0, every
    member completed, the best val_acc above chance (the full job: above 0.5)."""
    folder = out / "pbt"
    budget = ["--set", "training.epochs=2", "--set", "pbt.interval=1", "--set", QUICK_DATA] if quick else []
    process = _cli(
        device,
        "search",
        str(ROOT / "search_spaces" / "mnist1d_cnn_pbt.yaml"),
        "--device",
        str(device),
        *budget,
        "--storage",
        str(folder / "pbt.journal"),
        "--out",
        str(folder / "best"),
        "--json",
        "--quiet",
    )
    rec.condition("main job", "PBT space exits 0", process.returncode == 0, _last_line(process))
    try:
        summary = json.loads(process.stdout)
    except json.JSONDecodeError:
        summary = {}
    (folder / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    best = (summary.get("best") or {}).get("value")
    exploits = summary.get("exploits")
    exploits = len(exploits) if isinstance(exploits, list) else exploits
    rec.condition(
        "main job",
        f"PBT: 8 members, exploits made, best val_acc above {SANE_ACCURACY[quick]}",
        summary.get("population") == 8 and bool(exploits) and best is not None and best > SANE_ACCURACY[quick],
        f"population {summary.get('population')}, epochs {summary.get('epochs')}, exploits {exploits}, "
        f"best val_acc {best}",
    )
