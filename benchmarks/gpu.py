"""The array on a GPU against every alternative (issue 45), in one command under a budget, as one JSON.

    python -m benchmarks.gpu --device cuda --out gpu.json               # about 9 minutes on an H100/H200
    python -m benchmarks.gpu --device cuda --budget-s 240 --out g.json  # the most important phases only
    python -m benchmarks.gpu --device cpu --quick --out /tmp/g.json     # tiny phases on the CPU: checks it

Phases in priority order (benchmarks/_phases.py: each a subprocess with its
share of the budget; a short budget drops phases from the end):

1. throughput of mlp at B in 1, 16, 64, 256: serial (one model at a time), the
   torch.func vmap recipe, the array, and the physical limit (one model on
   B x the data);
2. the lowering per layer kind and size (benchmarks/lowering.py): one call per
   slot against one grouped call, conv1d/conv2d/BatchNorm at B=64;
3. the knee (benchmarks/knee.py): the array's throughput at B = 1, 2, 4, ...
   and `auto`'s rule applied to it, per workload;
4. throughput of cnn1d as of mlp, then of ResNet-18 on 3x32x32 at B in 1, 8, 64;
   then B = 16 processes sharing the GPU (mlp, cnn1d) against serial;
5. mixed sizes: padded envelope arrays against one equal-shape array per
   shape (the same models: equal useful multiply-adds), benchmarks/envelope.py;
6. one profile of a training step (benchmarks/_profile.py, array, B=64) for
   each workload that missed a target in the phases before;
7. bf16 autocast: mlp, cnn1d, resnet18 at B=64;
8. the lowering forced on whole models: cnn1d, bn_cnn, resnet18 at B=64 with
   HFTA_NAS_LOWERING=loop, then =grouped;
9. the remaining workloads: bn_cnn and the HFTA paper's PointNet, DCGAN and
   Transformer at B in 1, 8, 64;
10. per-slot dropout against torch's (benchmarks/dropout.py) at B in 1, 8, 64:
   a mask is ~15 small ops, on a GPU ~15 kernel launches a layer, which an
   array of one pays where plain PyTorch launches a few.

The JSON holds every phase's figures and, for the code to cite, `rules`
(the CUDA lowering per layer kind and size, the whole-model check of it,
the knee per workload and the array-size limit it suggests) and `targets`
(issue 45's, each with its value, whether it was met and its profile).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._phases import Phase, machine_record, run_phases

RESULTS = Path(__file__).resolve().parent / "results"
BUDGET_S = 530.0  # one command of at most 9 minutes, with ~10 s for start-up and the JSON
TARGET_B = "64"
QUICK_B = "2"  # --quick's one array size
PROFILE_SHARE, PROFILE_MIN_S = 0.09, 30.0
# (what, workload, ratio in the throughput table at B=64, goal): issue 45's targets
TARGETS = [
    ("mlp array/serial", "mlp", "array/serial", 30.0),
    ("mlp array/vmap", "mlp", "array/vmap", 1.5),
    ("mlp array vs the physical limit", "mlp", "fusion_efficiency", 0.8),
    ("cnn1d array/serial", "cnn1d", "array/serial", 30.0),
    ("cnn1d array/vmap", "cnn1d", "array/vmap", 1.5),
    ("cnn1d array vs the physical limit", "cnn1d", "fusion_efficiency", 0.8),
    ("resnet18 array/serial", "resnet18", "array/serial", 3.0),
]
DROPOUT = ["--repeats", "5", "--inner", "20"]  # a few seconds of timing, after the interpreter's start-up
ENVELOPE_GOAL = 0.8  # padded/grouped: a mixed-width array against equal-shape arrays of the same models


def throughput(workloads: str, batches: str, processes: int, cell_s: int, *extra: str) -> list[str]:
    """benchmarks.throughput's arguments for a phase (no per-cell progress: the phase's record keeps the tail)."""
    return [
        "--workloads",
        workloads,
        "--batches",
        batches,
        "--max-processes",
        str(processes),
        "--cell-budget",
        str(cell_s),
        "--quiet",
        *extra,
    ]


def phases(quick: bool) -> list[Phase]:
    """The phases in priority order (quick: tiny versions of the same, to check the script)."""
    if quick:
        small = ["--quick", "--quiet", "--batches", QUICK_B, "--no-memory"]
        return [
            Phase("throughput mlp", 0.3, 5, "benchmarks.throughput", [*small, "--workloads", "mlp"]),
            Phase("lowering layers", 0.2, 5, "benchmarks.lowering", ["--quick"]),
            Phase("knee", 0.2, 5, "benchmarks.knee", ["--quick"]),
            Phase("profiles", 0.1, 5, "benchmarks._profile", expand=_profiles(quick=True)),
            Phase(
                "lowering grouped",
                0.2,
                5,
                "benchmarks.throughput",
                [*small, "--workloads", "cnn1d", "--methods", "array"],
                {"HFTA_NAS_LOWERING": "grouped"},
            ),
            Phase("dropout", 0.1, 5, "benchmarks.dropout", [*DROPOUT, "--shapes", "mlp-64", "--slots", QUICK_B]),
        ]
    fused = ["--methods", "serial,vmap,array,limit"]  # B processes sharing the GPU: the "processes" phase
    forced = throughput("cnn1d,bn_cnn,resnet18", TARGET_B, 1, 8, "--methods", "array", "--no-memory")
    return [
        Phase("throughput mlp", 0.1, 45, "benchmarks.throughput", throughput("mlp", "1,16,64,256", 1, 10, *fused)),
        Phase("lowering layers", 0.06, 25, "benchmarks.lowering"),
        Phase("knee", 0.11, 40, "benchmarks.knee", deadline_margin_s=10),
        Phase("throughput cnn1d", 0.1, 45, "benchmarks.throughput", throughput("cnn1d", "1,16,64,256", 1, 10, *fused)),
        Phase("throughput resnet18", 0.1, 40, "benchmarks.throughput", throughput("resnet18", "1,8,64", 1, 12, *fused)),
        Phase(
            "processes",
            0.08,
            40,
            "benchmarks.throughput",
            throughput("mlp,cnn1d", "16", 16, 10, "--methods", "serial,processes", "--no-memory"),
        ),
        Phase(
            "envelope",
            0.08,
            40,
            "benchmarks.envelope",
            [
                "--workloads",
                "none",
                "--sweep",
                "cnn1d,mlp",
                "--mixes",
                "balanced,ladder",
                "--ratios",
                "1,0.5",
                "--min-time",
                "0.1",
                "--quiet",
            ],
        ),
        Phase("profiles", PROFILE_SHARE, PROFILE_MIN_S, "benchmarks._profile", expand=_profiles(quick=False)),
        Phase(
            "throughput bf16",
            0.06,
            30,
            "benchmarks.throughput",
            throughput(
                "mlp,cnn1d,resnet18", TARGET_B, 1, 8, "--methods", "serial,vmap,array,limit", "--precision", "bf16"
            ),
        ),
        Phase("lowering loop", 0.05, 20, "benchmarks.throughput", forced, {"HFTA_NAS_LOWERING": "loop"}),
        Phase("lowering grouped", 0.05, 20, "benchmarks.throughput", forced, {"HFTA_NAS_LOWERING": "grouped"}),
        Phase(
            "throughput others",
            0.08,
            35,
            "benchmarks.throughput",
            throughput("bn_cnn,pointnet,dcgan,transformer", "1,8,64", 8, 8),
        ),
        Phase("dropout", 0.04, 15, "benchmarks.dropout", [*DROPOUT, "--slots", "1,8,64"]),
    ]


def _table(records: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """A finished phase's figures by its name ({} where it did not run or wrote none)."""
    found = next((r for r in records if r.get("phase") == name), None)
    return (found or {}).get("figures") or {}


def ratio_at(records: list[dict[str, Any]], workload: str, ratio: str, batch: str = TARGET_B) -> float | None:
    """A ratio of the throughput table at B=`batch`, from whichever phase measured the workload."""
    for record in records:
        cell = ((record.get("figures") or {}).get("results") or {}).get(workload, {}).get(batch)
        if cell and not record.get("environment") and (record["figures"].get("precision") or "float32") == "float32":
            return cell["ratios"].get(ratio)
    return None


def targets(records: list[dict[str, Any]], batch: str = TARGET_B) -> list[dict[str, Any]]:
    """Issue 45's targets at B=`batch`: each value (None: not measured), goal and whether it was met."""
    out = []
    for what, workload, ratio, goal in TARGETS:
        value = ratio_at(records, workload, ratio, batch)
        met = None if value is None else value >= goal
        out.append({"target": what, "workload": workload, "value": value, "goal": f">= {goal:g}", "met": met})
    padded = [
        point["ratios"]["padded/grouped"]
        for point in _table(records, "envelope").get("sweep", [])
        if point.get("padding") and point["padding"]["waste"] > 1e-9 and point["ratios"].get("padded/grouped")
    ]
    worst = min(padded, default=None)
    out.append(
        {
            "target": "envelope padded/grouped (worst mixed point)",
            "workload": "envelope",
            "value": worst,
            "goal": f">= {ENVELOPE_GOAL:g}",
            "met": None if worst is None else worst >= ENVELOPE_GOAL,
        }
    )
    return out


def _profiles(quick: bool):
    """The profile phases for the workloads whose targets the phases before missed."""

    def expand(records: list[dict[str, Any]]) -> list[Phase]:
        if quick:  # one profile of what the quick run measured, whatever its figures: checks the path
            missed = ["mlp"]
        else:
            missed = sorted(
                {t["workload"] for t in targets(records) if t["met"] is False and t["workload"] != "envelope"}
            )
        batch = QUICK_B if quick else TARGET_B
        steps = ["--steps", "1" if quick else "3", "--top", "15"]
        return [
            Phase(
                f"profile {name}",
                0,
                0,
                "benchmarks._profile",
                ["--workload", name, "--batch", batch, "--method", "array", *steps],
                writes_json=False,
                tail_chars=12000,
            )
            for name in missed
        ]

    return expand


def _array_rate(table: dict[str, Any], workload: str) -> float | None:
    """The array's samples/s at B=64 in a throughput table (None where it is missing)."""
    cell = (table.get("results") or {}).get(workload, {}).get(TARGET_B, {})
    return cell.get("methods", {}).get("array", {}).get("samples_per_s")


def rules(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What the code's CUDA rules are to be set from, in the form they cite (see the module docstring)."""
    loop, grouped = _table(records, "lowering loop"), _table(records, "lowering grouped")
    whole = {}
    for workload in loop.get("results") or {}:
        a, b = _array_rate(loop, workload), _array_rate(grouped, workload)
        whole[workload] = {
            "loop_samples_per_s": a,
            "grouped_samples_per_s": b,
            "grouped_over_loop": b / a if a and b else None,
        }
    layers, knee = _table(records, "lowering layers"), _table(records, "knee")
    return {
        "cuda_lowering": {
            "per_layer": layers.get("rule"),
            "slots": layers.get("slots"),
            "whole_models_at_B64": whole,
            "sets": "hfta_nas/layers/_slot_ops.py conv_per_slot / batch_norm_per_slot on a GPU",
        },
        "array_size": {
            "knee_per_workload": {name: w["knee"] for name, w in (knee.get("workloads") or {}).items()},
            "suggested_cap": knee.get("suggested_cap"),
            "sets": "hfta_nas/search/_optimize.py AUTO_CAP (the most models array_size='auto' puts in one array)",
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda, or cpu to check the script")
    parser.add_argument(
        "--budget-s", type=float, default=BUDGET_S, help=f"seconds for all phases (default {BUDGET_S:g}: < 9 min)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny phases: checks the script")
    parser.add_argument("--out", type=Path, default=None, help="the JSON [default: benchmarks/results/gpu-<time>.json]")
    args = parser.parse_args(argv)
    if args.budget_s <= 0:
        print("error: --budget-s must be positive", file=sys.stderr)
        return 2
    started = time.monotonic()
    record = machine_record(args.device, args.budget_s)
    with tempfile.TemporaryDirectory() as scratch:
        record["phases"] = run_phases(phases(args.quick), args.budget_s, args.device, Path(scratch))
    record["rules"] = rules(record["phases"])
    record["targets"] = targets(record["phases"], QUICK_B if args.quick else TARGET_B)
    for target in record["targets"]:
        profile = f"profile {target['workload']}"
        target["profile"] = profile if any(r.get("phase") == profile for r in record["phases"]) else None
    record["seconds"] = round(time.monotonic() - started, 1)
    record["quick"] = args.quick
    out = args.out or RESULTS / f"gpu-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"{len(record['phases'])} phases in {record['seconds']} s; JSON: {out}")
    for target in record["targets"]:
        shown = "not measured" if target["value"] is None else f"{target['value']:.2f}"
        print(f"  {target['target']}: {shown} (goal {target['goal']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
