"""The whole GPU table in one command, under a time budget, as one JSON file.

    python -m benchmarks.gpu                         # on a CUDA machine: about 9 minutes
    python -m benchmarks.gpu --budget 300            # a shorter table (phases get their share)
    python -m benchmarks.gpu --device cpu --quick    # checks the script on a CPU in ~1 minute

Phases, each a subprocess with its share of the budget (a phase that runs out
is stopped and recorded as such; the others go on):

1. throughput, float32: mlp, cnn1d, bn_cnn at B in 1, 8, 32, 64, 128, 256;
   serial, processes (B processes sharing the GPU: the co-location baseline),
   the torch.func vmap recipe, the array, the limit (one model on B x data);
2. throughput, float32: the HFTA paper's families at small input size
   (ResNet-18 on 3x32x32, PointNet, DCGAN's discriminator, a TransformerEncoder)
   at B in 1, 8, 32, 64;
3. throughput, bf16 autocast: mlp, cnn1d, resnet18 at B in 8, 64;
4. the lowering: cnn1d, bn_cnn and resnet18 at B = 64 with HFTA_NAS_LOWERING
   forced to loop and to grouped (which one the GPU wants);
5. a whole job: a 64-seed stability study as one array against 64 plain runs.

The GPU's name, driver and its utilisation (nvidia-smi, sampled every half
second, averaged per phase) are recorded beside the figures.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"

# (name, share of the budget, module, arguments, environment)
PHASES: list[tuple[str, float, str, list[str], dict[str, str]]] = [
    (
        "throughput float32",
        0.30,
        "benchmarks.throughput",
        [
            "--workloads",
            "mlp,cnn1d,bn_cnn",
            "--batches",
            "1,8,32,64,128,256",
            "--max-processes",
            "16",
            "--cell-budget",
            "12",
        ],
        {},
    ),
    (
        "paper families float32",
        0.25,
        "benchmarks.throughput",
        [
            "--workloads",
            "resnet18,pointnet,dcgan,transformer",
            "--batches",
            "1,8,32,64",
            "--max-processes",
            "8",
            "--cell-budget",
            "15",
        ],
        {},
    ),
    (
        "throughput bf16",
        0.12,
        "benchmarks.throughput",
        [
            "--workloads",
            "mlp,cnn1d,resnet18",
            "--batches",
            "8,64",
            "--methods",
            "serial,vmap,array,limit",
            "--precision",
            "bf16",
            "--cell-budget",
            "10",
        ],
        {},
    ),
    (
        "lowering loop",
        0.06,
        "benchmarks.throughput",
        ["--workloads", "cnn1d,bn_cnn,resnet18", "--batches", "64", "--methods", "array", "--cell-budget", "10"],
        {"HFTA_NAS_LOWERING": "loop"},
    ),
    (
        "lowering grouped",
        0.06,
        "benchmarks.throughput",
        ["--workloads", "cnn1d,bn_cnn,resnet18", "--batches", "64", "--methods", "array", "--cell-budget", "10"],
        {"HFTA_NAS_LOWERING": "grouped"},
    ),
    ("stability 64 seeds", 0.21, "benchmarks.stability", ["--seeds", "64"], {}),
]
QUICK_PHASES: list[tuple[str, float, str, list[str], dict[str, str]]] = [
    ("throughput float32", 0.5, "benchmarks.throughput", ["--quick", "--workloads", "mlp", "--batches", "2"], {}),
    (
        "lowering grouped",
        0.2,
        "benchmarks.throughput",
        ["--quick", "--workloads", "cnn1d", "--batches", "2", "--methods", "array"],
        {"HFTA_NAS_LOWERING": "grouped"},
    ),
    ("stability", 0.3, "benchmarks.stability", ["--quick"], {}),
]


class GpuWatch:
    """nvidia-smi's utilisation and memory, sampled in the background (nothing where it is missing)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuWatch:
        if _smi(["--query-gpu=name", "--format=csv,noheader"]) is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            line = _smi(["--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"])
            if line:
                used, memory = (float(v) for v in line.splitlines()[0].split(","))
                self.samples.append((time.monotonic(), used, memory))

    def between(self, start: float, end: float) -> dict[str, float] | None:
        window = [(u, m) for t, u, m in self.samples if start <= t <= end]
        if not window:
            return None
        return {
            "utilisation_mean_pct": sum(u for u, _ in window) / len(window),
            "utilisation_max_pct": max(u for u, _ in window),
            "memory_max_mib": max(m for _, m in window),
        }


def _smi(arguments: list[str]) -> str | None:
    try:
        done = subprocess.run(["nvidia-smi", *arguments], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def run_phase(
    name: str, module: str, arguments: list[str], environment: dict[str, str], device: str, seconds: float, folder: Path
) -> dict[str, Any]:
    out = folder / f"{name.replace(' ', '-')}.json"
    command = [sys.executable, "-m", module, *arguments, "--device", device, "--out", str(out)]
    started = time.monotonic()
    try:
        done = subprocess.run(
            command,
            cwd=ROOT,
            env={**os.environ, **environment, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=max(seconds, 10),
        )
        how = "finished" if done.returncode == 0 else f"exited with status {done.returncode}"
        tail = (done.stdout + done.stderr)[-3000:]
    except subprocess.TimeoutExpired as expired:
        how = f"stopped at its budget of {seconds:.0f} s"
        tail = ((expired.stdout or b"").decode(errors="replace") + (expired.stderr or b"").decode(errors="replace"))[
            -3000:
        ]
    figures = json.loads(out.read_text()) if out.exists() else None
    return {
        "phase": name,
        "command": " ".join(command),
        "environment": environment,
        "how": how,
        "seconds": round(time.monotonic() - started, 1),
        "figures": figures,
        "output_tail": tail,
        "_window": (started, time.monotonic()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (to check the script)")
    parser.add_argument("--budget", type=float, default=530.0, help="seconds for all phases (default 530: under 9 min)")
    parser.add_argument("--quick", action="store_true", help="tiny phases: checks the script")
    parser.add_argument(
        "--out", type=Path, default=None, help="the JSON file [default: benchmarks/results/gpu-<time>.json]"
    )
    args = parser.parse_args(argv)
    phases = QUICK_PHASES if args.quick else PHASES
    started = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory() as scratch, GpuWatch() as watch:
        for name, share, module, arguments, environment in phases:
            left = args.budget - (time.monotonic() - started)
            if left <= 5:
                results.append({"phase": name, "how": "not run: the budget was spent"})
                continue
            result = run_phase(
                name, module, arguments, environment, args.device, min(share * args.budget, left), Path(scratch)
            )
            result["gpu"] = watch.between(*result.pop("_window"))
            results.append(result)
            print(f"{name}: {result['how']} in {result['seconds']} s", flush=True)
    record = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": args.device,
        "gpu": _smi(["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]),
        "budget_s": args.budget,
        "seconds": round(time.monotonic() - started, 1),
        "phases": results,
    }
    out = args.out or RESULTS / f"gpu-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, default=str))
    print(f"{len(results)} phases in {record['seconds']} s; JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
