"""Population-based training in one array against TPE, plain Optuna and Ray Tune's PBT, at equal slot-epochs.

    python -m benchmarks.pbt            # search_spaces/mnist1d_cnn_pbt.yaml as shipped, 3 seeds, all four methods
    python -m benchmarks.pbt --quick    # population 4, 4 epochs, interval 2, 1000 samples, 1 seed: checks the script
    python -m benchmarks.pbt --seeds 5 --methods pbt,tpe --epochs 30 --population 8

Methods (benchmarks/_pbt_methods.py), all on the one space file, its model,
data and the per-trial seeds `trial_seeds(search seed, trial number)`:
`pbt` (the space as written: its `pbt:` block makes `run_search` train the
population in one array, exploiting and exploring every `interval` epochs),
`tpe` (`run_search` on the space without the block: the default hfta-nas
search, n_trials = population, the median pruner where the file names none),
`plain` (Optuna's `study.optimize` of the plain PyTorch loop on that space,
one trial at a time, same pruner) and `ray_pbt` (Ray Tune's PopulationBasedTraining of the
plain loop with the block's settings, one Ray trial per member, all at once;
benchmarks/_ray_pbt.py). Budget: population x epochs slot-epochs for every
method; the pruners may stop tpe's and plain's trials early, so the
slot-epochs each trained are reported. One torch thread per process
(`--threads`): pbt, tpe and plain run in this process, ray_pbt in one Ray
worker per member (by default as many as the population, on the cores this
machine has).

Clocks: each method's wall time is what its call took (`run_search`,
`study.optimize`, Ray's `tuner.fit()`), the data load and the study's set-up
included; Ray's start-up (`ray.init` and its workers) is measured apart and
not included. Before anything is timed, pbt, tpe and plain each run once on
a population of 2 for 2 epochs (untimed), so the data's first build and this
process's first-use costs fall on no timed run. Search seed s sets the
space's `seed` for every method (sampler, trial seeds, PBT's draws; Ray's
explore draws from Python's and NumPy's generators, seeded with s); the
methods run in an order rotated per seed.

Printed per method, median [min, max] over seeds: wall time, final best value
(tpe, plain: the best completed trial; pbt, ray_pbt: the best member at the
last epoch), the time to reach the target (tpe's median final best; "-"
where the median run never did; for the PBT methods the population's best at
an epoch end counts), slot-epochs trained. Then the ratios the issue's targets
need, seed by seed (both sides of a ratio measured in the same run): (a)
pbt's time to reach that seed's tpe final best / tpe's wall time (target <=
0.5; a seed where pbt never reached it counts as never), (b) ray_pbt's wall
time / pbt's (target >= 3); and Ray's checkpoint round trips (saves, loads
and Ray's copy into its storage, measured inside the trainable, summed over
members) as a share of its wall time and of its workers' time (wall x
workers).
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
from benchmarks._pbt_methods import METHODS, RUNNERS_PBT, resized
from benchmarks._ray_search import MISSING_RAY, ray_available
from benchmarks.search import check_space
from hfta_nas.errors import HftaNasError
from hfta_nas.runtime import DTYPES
from hfta_nas.search_spaces import SearchSpace, load_space, pbt_options

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SPACE = ROOT / "search_spaces" / "mnist1d_cnn_pbt.yaml"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "pbt.json"
QUICK = {"population": 4, "epochs": 4, "interval": 2, "num_samples": 1000, "seeds": 1}
TARGETS = {"pbt_to_tpe_best_over_tpe_wall": ("<=", 0.5), "ray_pbt_over_pbt_wall": (">=", 3.0)}


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
            if method != "ray_pbt":
                RUNNERS_PBT[method](tiny, Path(folder) / method, device, dtype, None)


def run(
    space: SearchSpace, seeds: list[int], methods: list[str], device: str, dtype: str, cpus: int | None
) -> dict[str, Any]:
    metric, direction, options = check_space(space), space.directions[0], pbt_options(space)
    warm_up(space, methods, device, dtype)
    load_before = os.getloadavg()
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
        "ray_cpus": cpus or options["population"],
        "runs": runs,
        "summary": summarize(runs, direction),
        "versions": package_versions(),
        "machine": {
            "cpu_count": os.cpu_count(),
            "cores_available": len(os.sched_getaffinity(0)),
            "platform": platform.platform(),
            "load_average_before": list(load_before),
            "load_average_after": list(os.getloadavg()),
        },
    }


# ---------------------------------------------------------------- summary
def summarize(runs: dict[str, list[dict[str, Any]]], direction: str) -> dict[str, Any]:
    """Per method, over seeds: median [min, max] of the table's figures; then the ratios, seed by seed."""
    target = spread([r["best_value"] for r in runs["tpe"]], direction)["median"] if "tpe" in runs else None
    methods = {}
    for method, rows in runs.items():
        methods[method] = {
            "seconds": spread([r["seconds"] for r in rows]),
            "best_value": spread([r["best_value"] for r in rows], direction),
            "time_to_target": spread([_time_to(r, target, direction) for r in rows]),
            "epochs_trained": spread([r["epochs_trained"] for r in rows]),
        }
    return {
        "target": target,
        "methods": methods,
        "ratios": ratios(runs, direction),
        "ray": ray_shares(runs),
        "same_start": same_start(runs),
    }


def _time_to(row: dict[str, Any], target: float | None, direction: str) -> float | None:
    return None if target is None or row["best_value"] is None else time_to(row["curve"], target, direction)


def ratios(runs: dict[str, list[dict[str, Any]]], direction: str) -> dict[str, Any]:
    """(a) pbt's time to reach tpe's final best / tpe's wall time and (b) ray_pbt's wall / pbt's, per seed."""
    found: dict[str, Any] = {}
    if "pbt" in runs and "tpe" in runs:
        per_seed = [
            None if (t := _time_to(p, tpe["best_value"], direction)) is None else t / tpe["seconds"]
            for p, tpe in zip(runs["pbt"], runs["tpe"])
        ]
        found["pbt_to_tpe_best_over_tpe_wall"] = {"per_seed": per_seed, **spread(per_seed)}
    if "pbt" in runs and "ray_pbt" in runs:
        per_seed = [ray["seconds"] / p["seconds"] for p, ray in zip(runs["pbt"], runs["ray_pbt"])]
        found["ray_pbt_over_pbt_wall"] = {"per_seed": per_seed, **spread(per_seed)}
    for name, cell in found.items():
        sign, bound = TARGETS[name]
        median = cell["median"]
        cell["target"] = f"{sign} {bound:g}"
        cell["met"] = median is not None and (median <= bound if sign == "<=" else median >= bound)
    return found


def ray_shares(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Ray's start-up, restores and checkpoint seconds, and those as shares of its wall time and workers' time."""
    rows = runs.get("ray_pbt", [])
    if not rows:
        return {}
    return {
        "startup_s": spread([r["startup_s"] for r in rows]),
        "first_result_s": spread([r["first_result_s"] for r in rows]),
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
    print(f"{'method':>7}  {'wall s':>20}  {'best ' + metric:>28}  {'s to target':>18}  {'slot-epochs':>16}")
    for method, cell in summary["methods"].items():
        print(
            f"{method:>7}  {spread_text(cell['seconds'], seconds):>20}  {spread_text(cell['best_value'], value):>28}  "
            f"{spread_text(cell['time_to_target'], seconds):>18}  "
            f"{spread_text(cell['epochs_trained'], lambda v: f'{v:g}'):>16}"
        )
    ratio = lambda v: "never" if v is None else f"{v:.2f}"
    for name, cell in summary["ratios"].items():
        per_seed = ", ".join(ratio(v) for v in cell["per_seed"])
        print(
            f"{name}: {spread_text(cell, ratio)} (target {cell['target']}: {'met' if cell['met'] else 'not met'}); "
            f"per seed {per_seed}"
        )
    ray = summary["ray"]
    if ray:
        share, count = (lambda v: f"{v:.1%}"), (lambda v: f"{v:g}")
        print(
            f"ray_pbt: start-up {spread_text(ray['startup_s'], seconds)} s, not in wall s; first epoch reported "
            f"{spread_text(ray['first_result_s'], seconds)} s into wall s; "
            f"{spread_text(ray['exploits'], count)} exploits, "
            f"{spread_text(ray['restores'], count)} restores that trained on"
        )
        print(
            f"ray_pbt: checkpoint saves + loads + copies {spread_text(ray['checkpoint_s'], lambda v: f'{v:.2f}')} s "
            f"summed over members = {spread_text(ray['checkpoint_share_of_wall'], share)} of wall s, "
            f"{spread_text(ray['checkpoint_share_of_workers'], share)} of the workers' time (wall s x workers; "
            f"training and evaluation: {spread_text(ray['train_share_of_workers'], share)})"
        )
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


# --------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--space", type=Path, default=DEFAULT_SPACE, help="a search space file with a pbt: block")
    parser.add_argument("--seeds", type=int, default=3, help="search seeds 0..N-1 (each method runs once per seed)")
    parser.add_argument(
        "--methods",
        type=comma_list(str, METHODS),
        default=list(METHODS),
        help=f"which methods, comma-separated, of {','.join(METHODS)}",
    )
    parser.add_argument("--population", type=int, default=None, help="members (= tpe's and plain's trials)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per member / trial; None: the space's")
    parser.add_argument("--interval", type=int, default=None, help="epochs between exploits; None: the space's")
    parser.add_argument("--ray-cpus", type=int, default=None, help="Ray's num_cpus; None: the population")
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
    if "ray_pbt" in args.methods and not ray_available():
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
