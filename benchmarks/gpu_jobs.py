"""Whole jobs on one GPU against what users run today (issue 46), in one command under a budget, one JSON.

    python -m benchmarks.gpu_jobs --device cuda --out jobs.json               # about 9 minutes on an H100/H200
    python -m benchmarks.gpu_jobs --device cuda --budget-s 240 --out j.json   # the most important jobs only
    python -m benchmarks.gpu_jobs --device cpu --quick --out /tmp/j.json      # tiny jobs on the CPU: checks it

Jobs in priority order (benchmarks/_phases.py: each a subprocess with its share
of the budget, told a deadline so it stops itself in time; a short budget
drops jobs from the end), each run by benchmarks/_job_phases.py with the
benchmarks' own runners:

1. stability: 64 seeds of the shipped config (`hfta-nas stability`'s default)
   as one array, as 8 processes sharing the GPU (the plain loop, 8 seeds
   each), and as 64 plain runs one after another (past the deadline the rest
   are extrapolated from the mean run, and the JSON says so);
2. search, the shipped CNN space (search_spaces/mnist1d_cnn.yaml), and
3. search, a CIFAR-shaped 2-D CNN space (benchmarks/spaces/cifar_shaped_cnn2d.yaml,
   synthetic 3x32x32 images made offline): hfta-nas's default pack against
   plain Optuna (one process) and 4 Optuna processes sharing the GPU, over up
   to 3 search seeds: wall time, time to plain's median best, final best;
4. PBT: the shipped PBT space at population 16 against TPE (hfta-nas's search
   of the same space without the pbt block) at equal slot-epochs.

Ray Tune is left out (not on the GPU image, too big to travel; the JSON says
so). `targets` gathers issue 46's figures from the jobs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._job_phases import RAY_LEFT_OUT
from benchmarks._phases import Phase, machine_record, run_phases

RESULTS = Path(__file__).resolve().parent / "results"
BUDGET_S = 530.0  # one command of at most 9 minutes, with ~10 s for start-up and the JSON
CIFAR_SPACE = "benchmarks/spaces/cifar_shaped_cnn2d.yaml"
MARGIN_S = 20.0  # of a job's seconds kept for its imports, its last write and whatever runs past the deadline
JOB = "benchmarks._job_phases"


def phases(quick: bool) -> list[Phase]:
    """The jobs in priority order (quick: the same jobs at tiny budgets, to check the script)."""
    if quick:
        return [
            Phase(
                "stability",
                0.3,
                5,
                JOB,
                ["stability", "--quick", "--seeds", "4", "--processes", "2"],
                deadline_margin_s=0,
            ),
            Phase(
                "search cnn1d",
                0.25,
                5,
                JOB,
                ["search", "--quick", "--seeds", "1", "--processes", "2"],
                deadline_margin_s=0,
            ),
            Phase(
                "search cifar-shaped",
                0.25,
                5,
                JOB,
                ["search", "--quick", "--seeds", "1", "--processes", "2", "--space", CIFAR_SPACE],
                deadline_margin_s=0,
            ),
            Phase("pbt", 0.2, 5, JOB, ["pbt", "--quick", "--seeds", "1"], deadline_margin_s=0),
        ]
    search = ["search", "--seeds", "3", "--processes", "4"]
    return [
        Phase(
            "stability", 0.3, 90, JOB, ["stability", "--seeds", "64", "--processes", "8"], deadline_margin_s=MARGIN_S
        ),
        Phase("search cnn1d", 0.24, 60, JOB, search, deadline_margin_s=MARGIN_S),
        Phase("search cifar-shaped", 0.24, 60, JOB, [*search, "--space", CIFAR_SPACE], deadline_margin_s=MARGIN_S),
        Phase("pbt", 0.22, 60, JOB, ["pbt", "--population", "16", "--seeds", "3"], deadline_margin_s=MARGIN_S),
    ]


def targets(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 46's figures, by job (None where the job did not run or finish its part)."""
    figures = {r["phase"]: r.get("figures") or {} for r in records}
    stability = figures.get("stability", {}).get("summary") or {}
    pbt = figures.get("pbt", {}).get("summary") or {}
    return {
        "stability_plain_over_array": stability.get("plain_over_array"),
        "stability_goal": ">= 16",
        "stability_processes_over_array": stability.get("processes_over_array"),
        "search cnn1d": figures.get("search cnn1d", {}).get("targets"),
        "search cifar-shaped": figures.get("search cifar-shaped", {}).get("targets"),
        "pbt_vs_tpe": pbt.get("head_to_head", pbt.get("ratios")),  # benchmarks/pbt.py's seed-by-seed ratios
        "ray": RAY_LEFT_OUT,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_jobs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda, or cpu to check the script")
    parser.add_argument(
        "--budget-s", type=float, default=BUDGET_S, help=f"seconds for all jobs (default {BUDGET_S:g}: < 9 min)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny jobs: checks the script")
    parser.add_argument(
        "--out", type=Path, default=None, help="the JSON [default: benchmarks/results/gpu-jobs-<time>.json]"
    )
    args = parser.parse_args(argv)
    if args.budget_s <= 0:
        print("error: --budget-s must be positive", file=sys.stderr)
        return 2
    started = time.monotonic()
    record = machine_record(args.device, args.budget_s)
    with tempfile.TemporaryDirectory() as scratch:
        record["phases"] = run_phases(phases(args.quick), args.budget_s, args.device, Path(scratch))
    record["targets"] = targets(record["phases"])
    record["seconds"] = round(time.monotonic() - started, 1)
    record["quick"] = args.quick
    out = args.out or RESULTS / f"gpu-jobs-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"{len(record['phases'])} jobs in {record['seconds']} s; JSON: {out}")
    print(json.dumps(record["targets"], indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
