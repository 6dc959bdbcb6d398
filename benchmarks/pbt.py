"""Population-based training in one array against TPE, plain Optuna and Ray Tune's PBT: like for like.

    python -m benchmarks.pbt            # search_spaces/mnist1d_cnn_pbt.yaml as shipped, 5 seeds, every method
    python -m benchmarks.pbt --quick    # population 4, 4 epochs, interval 2, 1000 samples, 1 seed: checks the script
    python -m benchmarks.pbt --seeds 5 --methods pbt,tpe --epochs 30 --population 8

Methods (benchmarks/_pbt_methods.py), all on the one space file, its model,
data and the per-trial seeds `trial_seeds(search seed, trial number)`:
`pbt` (the space as written: its `pbt:` block makes `run_search` train the
population in one array, exploiting and exploring every `interval` epochs in
synchronous rounds), `tpe` (`run_search` on the space without the block: the
default hfta-nas search, n_trials = population, the median pruner where the
file names none), `plain` (Optuna's `study.optimize` of the plain PyTorch loop
on that space, one trial at a time, same pruner), `ray_pbt` (Ray Tune's
PopulationBasedTraining of the plain loop with the block's settings,
asynchronous as Ray runs it by default) and `ray_pbt_sync` (the same with
`synch=True`: synchronous rounds, hfta-nas's algorithm). Ray gets the cores
this process may use (`num_cpus`; `--ray-cpus` to change it), one torch thread
per worker; pbt, tpe and plain run in this process with `--threads` threads.

Like for like (issue 43):
- one statistic for every method: the final value of what it exports (tpe,
  plain: the best completed trial; pbt, Ray: the best member at the last
  epoch), and a curve of that value against time (for the PBT methods one
  point at the end: a member's value mid-run is a transient, neither kept nor
  exported; it is in the JSON as `peak_curve` and enters no statistic);
- head to head, seed by seed, both sides measured in the same run: wall time,
  wall time per slot-epoch trained (the pruners stop tpe's and plain's trials
  early, Ray may train past the budget), and time to a common target: the
  worse of the two methods' final values on that seed, which both reach;
- start-up on both sides or on neither: the in-process methods run warm (each
  once on a tiny budget before any clock starts); Ray's `ray.init` and
  prestarted workers are measured apart (`startup_s`), and so is the part of
  its `tuner.fit()` before its first epoch (`actor_startup_s`). Ratios against
  Ray are given with neither side's start-up (Ray's fit less its actors'
  start) and with both (Ray's start-up added; for hfta-nas a fresh process's
  interpreter, imports and data, `cold_startup_s`, measured once per run);
- at least 5 seeds by default; the machine's load before and after, the
  package versions and the thread and core counts are in the JSON.

Clocks: each method's wall time is what its call took (`run_search`,
`study.optimize`, Ray's `tuner.fit()`), the data load and the study's set-up
included. Search seed s sets the space's `seed` for every method (sampler,
trial seeds, PBT's draws; Ray's explore draws from a NumPy generator seeded
with s); the methods run in an order rotated per seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import platform
import sys
import tempfile
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import optuna
import torch

from benchmarks._anytime import metric_text, spread, spread_text, time_to
from benchmarks._cli import comma_list, package_versions, write_result
from benchmarks._pbt_methods import IN_PROCESS, METHODS, RUNNERS_PBT, cold_startup_s, resized
from benchmarks._ray_search import MISSING_RAY, ray_available
from benchmarks.search import check_space
from hfta_nas.errors import HftaNasError
from hfta_nas.runtime import DTYPES
from hfta_nas.search_spaces import SearchSpace, load_space, pbt_options

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SPACE = ROOT / "search_spaces" / "mnist1d_cnn_pbt.yaml"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "pbt.json"
QUICK = {"population": 4, "epochs": 4, "interval": 2, "num_samples": 1000, "seeds": 1}
# head to head, (numerator, denominator): each ratio's two methods, measured on the same seeds in one run
PAIRS = (("pbt", "tpe"), ("pbt", "plain"), ("tpe", "plain"), ("ray_pbt", "pbt"), ("ray_pbt_sync", "pbt"))


def quick_space(space: SearchSpace) -> SearchSpace:
    space = resized(space, QUICK["population"], QUICK["epochs"], QUICK["interval"])
    num_samples = min(space.data.num_samples or QUICK["num_samples"], QUICK["num_samples"])
    return space.model_copy(update={"data": space.data.model_copy(update={"num_samples": num_samples})})


# ---------------------------------------------------------------- all runs
def warm_up(space: SearchSpace, methods: list[str], device: str, dtype: str) -> None:
    """Each in-process method once on 2 members / trials of 2 epochs, untimed (Ray starts afresh each run);
    pbt exploits after the first, so its exploit path is warm too."""
    tiny = resized(space, 2, 2, 1)
    with tempfile.TemporaryDirectory(prefix="bench-pbt-warm-") as folder:
        for method in methods:
            if method in IN_PROCESS:
                RUNNERS_PBT[method](tiny, Path(folder) / method, device, dtype, None)


def run(
    space: SearchSpace, seeds: list[int], methods: list[str], device: str, dtype: str, cpus: int | None
) -> dict[str, Any]:
    metric, direction, options = check_space(space), space.directions[0], pbt_options(space)
    warm_up(space, methods, device, dtype)
    load_before = os.getloadavg()
    cold_s = cold_startup_s(space, device, dtype) if any(m.startswith("ray") for m in methods) else None
    runs: dict[str, list[dict[str, Any]]] = {method: [] for method in methods}
    for turn, seed in enumerate(seeds):
        seeded = space.with_overrides(seed=seed)
        for method in methods[turn % len(methods) :] + methods[: turn % len(methods)]:
            with tempfile.TemporaryDirectory(prefix="bench-pbt-") as folder:
                figures = RUNNERS_PBT[method](seeded, Path(folder), device, dtype, cpus)
            runs[method].append({"seed": seed, **figures})
            best = figures["best_value"]
            shown = "-" if best is None else f"{best:.4f}"
            print(f"  seed {seed} {method:>7}: {figures['seconds']:6.1f} s, best {shown}", file=sys.stderr, flush=True)
    return {
        "space": str(space.source),
        "metric": metric,
        "direction": direction,
        "population": options["population"],
        "epochs": space.training.epochs,
        "interval": options["interval"],
        "quantile": options["quantile"],
        "resample_probability": options["resample_probability"],
        "explore": {name: dataclasses.asdict(how) for name, how in options["explore"].items()},
        "num_samples": space.data.num_samples,
        "seeds": seeds,
        "methods": methods,
        "device": device,
        "dtype": dtype,
        "threads": torch.get_num_threads(),
        "ray_cpus": cpus or len(os.sched_getaffinity(0)),
        "cold_startup_s": cold_s,
        "runs": runs,
        "summary": summarize(runs, direction, cold_s),
        "versions": package_versions(),
        "machine": {
            "cpu_count": os.cpu_count(),
            "cores_available": len(os.sched_getaffinity(0)),
            "platform": platform.platform(),
            "load_average_before": list(load_before),
            "load_average_after": list(os.getloadavg()),
            # a load above the cores during the run: other work shared the CPU, timings are not a quiet machine's
            "busy": max(*load_before, *os.getloadavg()) > len(os.sched_getaffinity(0)),
        },
    }


# ---------------------------------------------------------------- summary
def summarize(runs: dict[str, list[dict[str, Any]]], direction: str, cold_s: float | None = None) -> dict[str, Any]:
    """Per method, over seeds: median [min, max] of the table's figures; then the ratios, seed by seed."""
    target = spread([r["best_value"] for r in runs["tpe"]], direction)["median"] if "tpe" in runs else None
    methods = {}
    for method, rows in runs.items():
        methods[method] = {
            "seconds": spread([r["seconds"] for r in rows]),
            "best_value": spread([r["best_value"] for r in rows], direction),
            "time_to_target": spread([_time_to(r, target, direction) for r in rows]),
            "epochs_trained": spread([r["epochs_trained"] for r in rows]),
            "seconds_per_slot_epoch": spread([r["seconds"] / r["epochs_trained"] for r in rows]),
        }
    return {
        "target": target,
        "methods": methods,
        "head_to_head": head_to_head(runs, direction, cold_s),
        "ray": ray_shares(runs),
        "same_start": same_start(runs),
    }


def _time_to(row: dict[str, Any], target: float | None, direction: str) -> float | None:
    return None if target is None or row["best_value"] is None else time_to(row["curve"], target, direction)


def _per_seed(values: list[float | None]) -> dict[str, Any]:
    return {"per_seed": values, **spread(values)}


def _to_common_target(a: dict[str, Any], b: dict[str, Any], direction: str) -> float | None:
    """a's time to the worse of the two final values / b's time to it (both reach it); None without finals."""
    if a["best_value"] is None or b["best_value"] is None:
        return None
    target = (min if direction == "maximize" else max)(a["best_value"], b["best_value"])
    a_s, b_s = time_to(a["curve"], target, direction), time_to(b["curve"], target, direction)
    return None if a_s is None or not b_s else a_s / b_s


def _difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def head_to_head(runs: dict[str, list[dict[str, Any]]], direction: str, cold_s: float | None) -> dict[str, Any]:
    """For each of PAIRS present, seed by seed: wall time, wall time per slot-epoch and time to a common
    target as ratios (numerator / denominator), and the difference of their final values; against Ray
    also the wall ratio with neither side's start-up and with both sides'."""
    found: dict[str, Any] = {}
    for a, b in PAIRS:
        if a not in runs or b not in runs:
            continue
        rows = list(zip(runs[a], runs[b]))
        cell = {
            "wall": _per_seed([x["seconds"] / y["seconds"] for x, y in rows]),
            "per_slot_epoch": _per_seed(
                [(x["seconds"] / x["epochs_trained"]) / (y["seconds"] / y["epochs_trained"]) for x, y in rows]
            ),
            "time_to_common_target": _per_seed([_to_common_target(x, y, direction) for x, y in rows]),
            "final_difference": _per_seed([_difference(x["best_value"], y["best_value"]) for x, y in rows]),
        }
        if a.startswith("ray") and b in IN_PROCESS:
            cell["wall_startup_neither"] = _per_seed(
                [(x["seconds"] - (x["actor_startup_s"] or 0.0)) / y["seconds"] for x, y in rows]
            )
            if cold_s is not None:
                cell["wall_startup_both"] = _per_seed(
                    [(x["seconds"] + x["startup_s"]) / (y["seconds"] + cold_s) for x, y in rows]
                )
        found[f"{a}_over_{b}"] = cell
    return found


def ray_shares(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per Ray method: start-up, restores and checkpoint seconds, and those as shares of its wall time and
    workers' time."""
    return {method: _ray_shares(rows) for method, rows in runs.items() if method.startswith("ray") and rows}


def _ray_shares(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "startup_s": spread([r["startup_s"] for r in rows]),
        "first_result_s": spread([r["first_result_s"] for r in rows]),
        "actor_startup_s": spread([r["actor_startup_s"] for r in rows]),
        "exploits": spread([r["exploits"] for r in rows]),
        "restores": spread([r["restores"] for r in rows]),
        "checkpoint_s": spread([r["checkpoint"]["total_s"] for r in rows]),
        "checkpoint_share_of_wall": spread([r["checkpoint"]["total_s"] / r["seconds"] for r in rows]),
        "checkpoint_share_of_workers": spread([r["checkpoint"]["total_s"] / (r["seconds"] * r["cpus"]) for r in rows]),
        "train_share_of_workers": spread([r["train_s"] / (r["seconds"] * r["cpus"]) for r in rows]),
    }


def same_start(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """First seed: each method's values before the first exploit against plain's, trial by trial (same
    params and seeds: one training run done two ways); the largest difference and how many were compared."""
    if "plain" not in runs:
        return {}
    plain = runs["plain"][0]["start_values"]
    found = {}
    for method, rows in runs.items():
        pairs = [
            (value, plain[number][epoch])
            for number, values in rows[0]["start_values"].items()
            for epoch, value in values.items()
            if method != "plain" and epoch in plain.get(number, {})
        ]
        if pairs:
            found[method] = {"compared": len(pairs), "max_difference": max(abs(a - b) for a, b in pairs)}
    return found


# ------------------------------------------------------------------ output
def print_table(figures: dict[str, Any], quick: bool) -> None:
    metric, summary = figures["metric"], figures["summary"]
    seconds = lambda v: "-" if v is None else f"{v:.1f}"
    value = lambda v: metric_text(v, metric)
    print(
        f"{Path(figures['space']).name}: population {figures['population']} x {figures['epochs']} epochs, "
        f"interval {figures['interval']}, quantile {figures['quantile']}, resample {figures['resample_probability']}, "
        f"seeds {figures['seeds']}, on {figures['device']} ({figures['threads']} torch threads per process, "
        f"{figures['ray_cpus']} Ray workers, {figures['machine']['cores_available']} cores)"
        + (" [quick: checks the script, not timings]" if quick else "")
    )
    print(f"median [min, max] over seeds; target = tpe's median final best, {value(summary['target'])}")
    print(f"{'method':>12}  {'wall s':>20}  {'best ' + metric:>28}  {'s to target':>18}  {'slot-epochs':>16}")
    for method, cell in summary["methods"].items():
        print(
            f"{method:>12}  {spread_text(cell['seconds'], seconds):>20}  {spread_text(cell['best_value'], value):>28}  "
            f"{spread_text(cell['time_to_target'], seconds):>18}  "
            f"{spread_text(cell['epochs_trained'], lambda v: f'{v:g}'):>16}"
        )
    print_head_to_head(summary["head_to_head"])
    for method, ray in summary["ray"].items():
        share, count = (lambda v: f"{v:.1%}"), (lambda v: f"{v:g}")
        print(
            f"{method}: start-up {spread_text(ray['startup_s'], seconds)} s, not in wall s; its actors' start "
            f"{spread_text(ray['actor_startup_s'], seconds)} s of wall s; "
            f"{spread_text(ray['exploits'], count)} exploits, "
            f"{spread_text(ray['restores'], count)} restores that trained on"
        )
        print(
            f"{method}: checkpoint saves + loads + copies {spread_text(ray['checkpoint_s'], lambda v: f'{v:.2f}')} s "
            f"summed over members = {spread_text(ray['checkpoint_share_of_wall'], share)} of wall s, "
            f"{spread_text(ray['checkpoint_share_of_workers'], share)} of the workers' time (wall s x workers; "
            f"training and evaluation: {spread_text(ray['train_share_of_workers'], share)})"
        )
    if figures.get("cold_startup_s") is not None:
        print(f"a fresh process's start-up (interpreter, imports, data): {figures['cold_startup_s']:.1f} s")
    if "pbt" in figures["runs"]:
        exploits = [r["exploits"] for r in figures["runs"]["pbt"]]
        print(f"pbt: exploits per run {exploits}")
    if summary["same_start"]:
        checks = "; ".join(
            f"{method} {metric_text(cell['max_difference'], metric)} ({cell['compared']} values)"
            for method, cell in summary["same_start"].items()
        )
        print(
            f"same start (seed {figures['seeds'][0]}, epochs 1-{figures['interval']}, same trial numbers, params and "
            f"seeds as plain): largest difference from plain's value: {checks}"
        )


def print_head_to_head(pairs: dict[str, Any]) -> None:
    """One line per pair: its ratios, median [min, max] over seeds (never: a side without a final value)."""
    ratio = lambda v: "never" if v is None else f"{v:.2f}"
    names = {
        "wall": "wall",
        "per_slot_epoch": "per slot-epoch",
        "time_to_common_target": "to the common target",
        "wall_startup_neither": "wall, no start-up",
        "wall_startup_both": "wall, start-up both sides",
    }
    for pair, cell in pairs.items():
        parts = [f"{label} {spread_text(cell[key], ratio)}" for key, label in names.items() if key in cell]
        gain = cell["final_difference"]
        shown = lambda v: "-" if v is None else f"{v:+.4f}"
        print(f"{pair}: " + "; ".join(parts) + f"; final value difference {spread_text(gain, shown)}")


# --------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--space", type=Path, default=DEFAULT_SPACE, help="a search space file with a pbt: block")
    parser.add_argument("--seeds", type=int, default=5, help="search seeds 0..N-1 (each method runs once per seed)")
    parser.add_argument(
        "--methods",
        type=comma_list(str, METHODS),
        default=list(METHODS),
        help=f"which methods, comma-separated, of {','.join(METHODS)}",
    )
    parser.add_argument("--population", type=int, default=None, help="members (= tpe's and plain's trials)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per member / trial; None: the space's")
    parser.add_argument("--interval", type=int, default=None, help="epochs between exploits; None: the space's")
    parser.add_argument("--ray-cpus", type=int, default=None, help="Ray's num_cpus; None: the cores available")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per process")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"population {QUICK['population']}, {QUICK['epochs']} epochs, interval {QUICK['interval']}, "
        f"{QUICK['num_samples']} samples, {QUICK['seeds']} seed: checks the script",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help=f"JSON (and a .txt table beside it); default {DEFAULT_OUT}, none --quick"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if min(args.threads, args.seeds, args.population or 2, args.epochs or 1, args.interval or 1) < 1:
        print("error: --threads, --seeds, --population, --epochs and --interval must be positive", file=sys.stderr)
        return 2
    if any(m.startswith("ray") for m in args.methods) and not ray_available():
        print(f"error: {MISSING_RAY}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        space = resized(load_space(args.space), args.population, args.epochs, args.interval)
    except HftaNasError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    seeds = args.seeds
    if args.quick:
        space, seeds = quick_space(space), min(seeds, QUICK["seeds"])
    methods = list(dict.fromkeys(args.methods))
    figures = run(space, list(range(seeds)), methods, args.device, args.dtype, args.ray_cpus)
    figures["quick"] = args.quick
    with redirect_stdout(io.StringIO()) as table:
        print_table(figures, args.quick)
    print(table.getvalue(), end="")
    out = args.out or (None if args.quick else DEFAULT_OUT)
    if out is not None:
        write_result(figures, out, "benchmarks.pbt", argv)
        out.with_suffix(".txt").write_text(table.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
