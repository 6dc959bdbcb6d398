"""Anytime quality of six ways to run one search: best value against wall time, over several search seeds.

    python -m benchmarks.search   # search_spaces/mnist1d_cnn.yaml, its budget, 5 seeds, default methods
    python -m benchmarks.search --quick             # 4 trials, 2 epochs, 1000 samples, 2 seeds: checks the script
    python -m benchmarks.search --long --out benchmarks/results/search-long.json   # training dominates (LONG)
    python -m benchmarks.search --seeds 3 --methods plain,pack --out search.json --plot search.png

Methods (benchmarks/_search_methods.py): `plain` (Optuna `study.optimize`, one
trial at a time, a plain PyTorch loop), `processes` (P Optuna processes on one
journal file, P = the cores available by default: the co-location baseline as
a user runs it), `ray` (Ray Tune: OptunaSearch + ASHA, P concurrent trials of
the plain loop; needs `pip install 'hfta-nas[bench]'`), `hfta` (random
sampler, arrays of equal shapes only), `replicate` (`array.fill: replicate`)
and `pack` (the shipped policy); by default plain, processes, ray and pack.
Same space, budget, per-trial seeds and torch threads per trial for all, the
space's pruner for all but ray (ASHA); search seed s runs every method with
the space's `seed` set to s (sampler and trial seeds), in an order rotated per
seed so that no method always runs first on a warm or cold machine.

Printed per method, median and [min-max] over seeds: wall time, the final best
value, the best value at fractions of the reference method's median wall time,
the time to reach the reference's median final best (the target; "-" where the
median run never did), distinct architectures trained, and the wall-time
ratio reference / method taken seed by seed (each pair measured in one run).
The reference is `plain` when it runs. Below the table, per method where it
applies: start-up not in the wall time (processes: spawn, imports, warm-up;
ray: `ray.init` and its workers; its clock starts when the tuner starts), the
arrays' mean occupancy, and the search's time account as shares of wall
time. Trials with the same number and parameters in `plain` and `pack` (or
`ray`) on the first seed (usually trial 0: same sampler seed, no results yet,
same trial seeds) are one training run done two ways; their per-epoch values
are compared, a check of the plain loop (and of Ray's trials running it with
the same seeds).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import optuna
import torch

from benchmarks._anytime import best_so_far, metric_text, plot, spread, spread_text, time_to, value_at
from benchmarks._cli import comma_list, package_versions, write_result
from benchmarks._plain_parts import check_metric
from benchmarks._ray_search import MISSING_RAY, ray_available
from benchmarks._search_methods import (
    DEFAULT_METHODS,
    METHODS,
    RUNNERS,
    SearchRun,
    available_cores,
    one_epoch,
)
from hfta_nas import REGRESSION_LOSSES
from hfta_nas.errors import HftaNasError
from hfta_nas.runtime import DTYPES
from hfta_nas.search_spaces import SearchSpace, load_space

DEFAULT_SPACE = Path(__file__).resolve().parents[1] / "search_spaces" / "mnist1d_cnn.yaml"
QUICK = {"n_trials": 4, "epochs": 2, "num_samples": 1000, "seeds": 2, "processes": 2}
# Where training dominates (issue 43): the CNN space with 5x the data, 4x the epochs and 3x the trials, so
# that per-trial overheads and timer noise do not decide the comparison (the space's own budget trains
# 12-33 s). Measured 2026-11-28 on the 2-core CPU: plain took 7.0-13.5 minutes a seed (the median pruner
# stops most trials), 81 minutes for the 5 seeds of plain and pack; not run by the tests (--quick is
# their check).
LONG = {
    "space": DEFAULT_SPACE,
    "n_trials": 48,
    "seeds": 5,
    "methods": ("plain", "pack"),
    "overrides": ("training.epochs=20", "data.num_samples=20000"),
}
# Datasets that take a sample count (generated data); a file's data is used whole.
SIZED_DATASETS = ("mnist1d",)
STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")
CHECKPOINTS = (0.25, 0.5, 1.0)  # fractions of the reference's median wall time


# ---------------------------------------------------------------- the space
def quick_space(space: SearchSpace) -> SearchSpace:
    """The space with QUICK's epochs and, for generated data, its data size (a cosine t_max set in the
    file is kept)."""
    epochs = min(space.training.epochs, QUICK["epochs"])
    data = space.data
    if data.dataset in SIZED_DATASETS:
        num_samples = min(data.num_samples or QUICK["num_samples"], QUICK["num_samples"])
        data = data.model_copy(update={"num_samples": num_samples})
    return space.model_copy(update={"training": space.training.model_copy(update={"epochs": epochs}), "data": data})


def check_space(space: SearchSpace) -> str:
    """The study's one metric, or SystemExit when the plain methods cannot reproduce the space."""
    if len(space.study.metrics) != 1:
        raise SystemExit(
            f"{space.source}: the benchmark compares single-objective searches; this one has "
            f"metrics {list(space.study.metrics)}"
        )
    metric = space.study.metrics[0]
    loss = space.training.loss
    try:
        check_metric(metric, regression=loss is not None and loss.name in REGRESSION_LOSSES)
    except SystemExit as refusal:
        raise SystemExit(f"{space.source}: {refusal}") from None
    return metric


# ----------------------------------------------------------------- one run
def run_figures(run: SearchRun, direction: str) -> dict[str, Any]:
    """What one method's search on one seed gave: clock, trial states, curve, architectures."""
    trained = [t for t in run.trials if t.state.name in ("COMPLETE", "PRUNED")]
    architectures = {
        tuple(sorted((k, repr(v)) for k, v in t.params.items() if k.startswith("model."))) for t in trained
    }
    curve = best_so_far(run.finished(), direction)
    return {
        "seconds": run.seconds,
        "cpu_seconds": run.cpu_seconds,
        "trials": {state: sum(t.state.name == state for t in run.trials) for state in STATES},
        "epochs_trained": sum(len(t.intermediate_values) for t in run.trials),
        "best_value": curve[-1][1] if curve else None,
        "curve": [list(point) for point in curve],
        "architectures_trained": len(architectures),
        **run.extra,
    }


def same_trials(plain: list[Any], other: list[Any], name: str = "pack") -> list[dict[str, Any]]:
    """Trials of equal number and parameters in both (so equal seeds too): the same training
    run done two ways, a check of the plain loop; `name` is the other method's."""
    by_number = {t.number: t for t in other}
    return [
        {
            "number": t.number,
            "plain": t.state.name,
            name: by_number[t.number].state.name,
            "plain_values": dict(t.intermediate_values),
            f"{name}_values": dict(by_number[t.number].intermediate_values),
        }
        for t in plain
        if t.number in by_number and by_number[t.number].params == t.params
    ]


# ---------------------------------------------------------------- all runs
def run(
    space: SearchSpace, n_trials: int, seeds: list[int], methods: list[str], processes: int, device: str, dtype: str
) -> dict[str, Any]:
    metric, direction = check_space(space), space.directions[0]
    # Untimed: each in-process method once on 2 trials of 1 epoch, so the dataset's first build and
    # this process's first-use costs (ray: the driver's) fall on no timed run (the worker processes
    # warm up on their own).
    with tempfile.TemporaryDirectory(prefix="bench-search-warm-") as folder:
        for method in methods:
            if method != "processes":
                RUNNERS[method](one_epoch(space), min(n_trials, 2), device, dtype, Path(folder) / method, processes)
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {method: [] for method in methods}
    same: list[dict[str, Any]] = []
    same_ray: list[dict[str, Any]] = []
    for turn, seed in enumerate(seeds):
        seeded = space.with_overrides(seed=seed)
        order = methods[turn % len(methods) :] + methods[: turn % len(methods)]
        with tempfile.TemporaryDirectory(prefix="bench-search-") as folder:
            trials = {}
            for method in order:
                done = RUNNERS[method](seeded, n_trials, device, dtype, Path(folder), processes)
                runs[method].append({"seed": seed, **run_figures(done, direction)})
                trials[method] = done.trials
                print(
                    f"  seed {seed} {method:>9}: {done.seconds:6.1f} s, best "
                    f"{metric_text(runs[method][-1]['best_value'], metric)}",
                    file=sys.stderr,
                    flush=True,
                )
            if turn == 0 and "plain" in trials and "pack" in trials:
                same = same_trials(trials["plain"], trials["pack"])
            if turn == 0 and "plain" in trials and "ray" in trials:
                same_ray = same_trials(trials["plain"], trials["ray"], "ray")
    reference = "plain" if "plain" in methods else methods[0]
    return {
        "space": str(space.source),
        "metric": metric,
        "direction": direction,
        "n_trials": n_trials,
        "epochs": space.training.epochs,
        "array_size": space.array.size,
        "sampler": space.sampler.name,
        "pruner": space.pruner.name,
        "seeds": seeds,
        "processes": processes,
        "device": device,
        "dtype": dtype,
        "threads": torch.get_num_threads(),
        "reference": reference,
        "runs": runs,
        "summary": summarize(runs, reference, direction),
        "same_trials": same,
        "same_trials_ray": same_ray,
        "versions": package_versions(),
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor(),
            "load_average_before": list(load_before),
            "load_average_after": list(os.getloadavg()),
        },
    }


def time_shares(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Median over runs of each time-account phase's share of the run's wall time ("overhead":
    all but training and evaluation, as the search summary counts it when it does not say)."""
    shares: dict[str, list[float]] = {}
    for row in rows:
        account = row.get("time_account") or {}
        if not account:
            continue
        if "overhead" not in account:
            account = {**account, "overhead": sum(v for k, v in account.items() if k not in ("training", "evaluation"))}
        for phase, seconds in account.items():
            shares.setdefault(phase, []).append(seconds / row["seconds"])
    return {phase: statistics.median(values) for phase, values in shares.items()}


def summarize(runs: dict[str, list[dict[str, Any]]], reference: str, direction: str) -> dict[str, Any]:
    """Per method, over seeds: median [min, max] of the figures the table prints."""
    horizon = statistics.median(r["seconds"] for r in runs[reference])
    target = spread([r["best_value"] for r in runs[reference]], direction)["median"]
    summary: dict[str, Any] = {
        "horizon_s": horizon,
        "target": target,
        "checkpoints_s": [f * horizon for f in CHECKPOINTS],
        "methods": {},
    }
    for method, rows in runs.items():
        curves = [r["curve"] for r in rows]
        summary["methods"][method] = {
            "seconds": spread([r["seconds"] for r in rows]),
            "best_value": spread([r["best_value"] for r in rows], direction),
            "best_at": [
                spread([value_at(c, t) for c in curves], direction)["median"] for t in summary["checkpoints_s"]
            ],
            "time_to_target": spread([time_to(c, target, direction) if target is not None else None for c in curves]),
            "architectures_trained": statistics.median(r["architectures_trained"] for r in rows),
            "epochs_trained": statistics.median(r["epochs_trained"] for r in rows),
            # reference / method wall time, seed by seed: both measured in the same run
            "speedup": spread([ref["seconds"] / r["seconds"] for ref, r in zip(runs[reference], rows)]),
        }
        for key in ("startup_s", "first_trial_s", "first_result_s", "mean_occupancy"):  # the methods that have them
            if any(r.get(key) is not None for r in rows):
                summary["methods"][method][key] = spread([r.get(key) for r in rows])
        if any(r.get("time_account") for r in rows):
            summary["methods"][method]["time_account"] = time_shares(rows)
    return summary


# ------------------------------------------------------------------ output
def print_table(figures: dict[str, Any], quick: bool) -> None:
    metric, summary = figures["metric"], figures["summary"]
    seconds = lambda v: "never" if v is None else f"{v:.1f}"
    value = lambda v: metric_text(v, metric)
    print(
        f"{Path(figures['space']).name}: {figures['n_trials']} trials x {figures['epochs']} epochs, "
        f"{figures['sampler']} + {figures['pruner']} pruner, seeds {figures['seeds']}, arrays of "
        f"{figures['array_size']}, {figures['processes']} processes / Ray trials at once, on {figures['device']} "
        f"({figures['threads']} torch threads, {figures['dtype']})"
        + (" [quick: checks the script, not timings]" if quick else "")
    )
    at = " / ".join(f"{f:g}T" for f in CHECKPOINTS)
    print(
        f"median [min-max] over seeds; T = {figures['reference']}'s median wall time, {summary['horizon_s']:.1f} s; "
        f"target = its median final best, {value(summary['target'])}"
    )
    print(
        f"{'method':>9}  {'wall s':>18}  {'best ' + metric:>26}  {'best at ' + at:>28}  {'s to target':>18}  "
        f"{'archs':>5}  {figures['reference'] + ' / method':>18}"
    )
    for method, cell in summary["methods"].items():
        best_at = " / ".join(value(v) for v in cell["best_at"])
        speedup = spread_text(cell["speedup"], lambda v: "-" if v is None else f"{v:.2f}x")
        print(
            f"{method:>9}  {spread_text(cell['seconds'], seconds):>18}  {spread_text(cell['best_value'], value):>26}  "
            f"{best_at:>28}  {spread_text(cell['time_to_target'], seconds):>18}  "
            f"{cell['architectures_trained']:>5g}  {speedup:>18}"
        )
    for method, cell in summary["methods"].items():
        notes = []
        if "startup_s" in cell:
            notes.append(f"start-up {spread_text(cell['startup_s'], seconds)} s, not in wall s")
        if "first_result_s" in cell:
            notes.append(
                f"first trial began {spread_text(cell['first_trial_s'], seconds)} s and reported its first epoch "
                f"{spread_text(cell['first_result_s'], seconds)} s after the start"
            )
        if "mean_occupancy" in cell:
            notes.append(
                f"mean occupancy {spread_text(cell['mean_occupancy'], lambda v: '-' if v is None else f'{v:.0%}')}"
            )
        if cell.get("time_account"):
            phases = sorted(
                ((k, v) for k, v in cell["time_account"].items() if k != "overhead" and v >= 0.01),
                key=lambda item: -item[1],
            )
            notes.append(
                "time "
                + ", ".join(f"{k} {v:.0%}" for k, v in phases)
                + f"; overhead {cell['time_account']['overhead']:.0%} (median shares of wall s)"
            )
        if notes:
            print(f"{method:>9}: " + "; ".join(notes))
    methods = summary["methods"]
    if "pack" in methods and "replicate" in methods:
        ratios = [p["seconds"] / r["seconds"] for p, r in zip(figures["runs"]["pack"], figures["runs"]["replicate"])]
        print(
            f"pack / replicate wall time, seed by seed: median {statistics.median(ratios):.2f} "
            f"[{min(ratios):.2f}-{max(ratios):.2f}]"
        )
    for other, pairs in (("pack", figures["same_trials"]), ("ray", figures.get("same_trials_ray", []))):
        if pairs:
            gaps = [
                abs(pair["plain_values"][step] - pair[f"{other}_values"][step])
                for pair in pairs
                for step in pair["plain_values"]
                if step in pair[f"{other}_values"]
            ]
            print(
                f"same number and parameters in plain and {other} (same seeds): trials "
                f"{[p['number'] for p in pairs]}; per-epoch {metric} differ by at most "
                f"{metric_text(max(gaps, default=0.0), metric)}"
            )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--space", type=Path, default=DEFAULT_SPACE, help="search space file")
    parser.add_argument("--n-trials", type=int, default=None, help="trials per search; None: the space's budget")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a setting of the space (repeatable), as `hfta-nas search --set`: e.g. --set training.epochs=15",
    )
    parser.add_argument("--seeds", type=int, default=5, help="search seeds 0..N-1 (each method runs once per seed)")
    parser.add_argument(
        "--methods",
        type=comma_list(str, METHODS),
        default=list(DEFAULT_METHODS),
        help=f"which methods, comma-separated, of {','.join(METHODS)}",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=None,
        help="worker processes of `processes` and concurrent trials of `ray`; None: the cores available",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (fixed for a fair comparison)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK['n_trials']} trials, {QUICK['epochs']} epochs, {QUICK['num_samples']} samples, "
        f"{QUICK['seeds']} seeds, at most {QUICK['processes']} processes: checks the script "
        "(an explicit --n-trials is kept)",
    )
    parser.add_argument(
        "--long",
        action="store_true",
        help=f"where training dominates: {LONG['space'].name}, {LONG['n_trials']} trials, "
        f"{' '.join(LONG['overrides'])}, {LONG['seeds']} seeds, methods {','.join(LONG['methods'])} "
        "(other options given win)",
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    parser.add_argument("--plot", type=Path, default=None, help="draw the anytime curves to this image (.png, .svg)")
    return parser


def _apply_long(args: argparse.Namespace, argv: list[str]) -> None:
    """LONG's settings, where the command line left the default (an option given wins)."""
    given = {word.split("=")[0] for word in argv if word.startswith("--")}
    if "--space" not in given:
        args.space = LONG["space"]
    if "--n-trials" not in given:
        args.n_trials = LONG["n_trials"]
    if "--seeds" not in given:
        args.seeds = LONG["seeds"]
    if "--methods" not in given:
        args.methods = list(LONG["methods"])
    args.overrides = [*LONG["overrides"], *args.overrides]  # --set after LONG's: a later value wins


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick and args.long:
        print("error: --quick and --long are two budgets; give one", file=sys.stderr)
        return 2
    if args.long:
        _apply_long(args, argv or [])
    if min(args.threads, args.seeds, args.n_trials or 1, args.processes or 1) < 1:
        print("error: --threads, --seeds, --n-trials and --processes must be positive", file=sys.stderr)
        return 2
    if not (args.device == "cpu" or args.device.startswith("cuda")):
        print(f"error: --device must be cpu or cuda, got {args.device!r}", file=sys.stderr)
        return 2
    if "ray" in args.methods and not ray_available():
        print(f"error: {MISSING_RAY}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        space = load_space(args.space, args.overrides)
    except HftaNasError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    n_trials = args.n_trials or space.budget.n_trials
    seeds, processes = args.seeds, args.processes or len(available_cores())
    if args.quick:
        space = quick_space(space)
        n_trials = args.n_trials or min(n_trials or QUICK["n_trials"], QUICK["n_trials"])
        seeds, processes = min(seeds, QUICK["seeds"]), min(processes, QUICK["processes"])
    if n_trials is None:
        print(f"error: {args.space} has no n_trials budget; give --n-trials", file=sys.stderr)
        return 2
    figures = run(
        space, n_trials, list(range(seeds)), list(dict.fromkeys(args.methods)), processes, args.device, args.dtype
    )
    figures["quick"], figures["long"] = args.quick, args.long
    print_table(figures, args.quick)
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plot(
            {m: [r["curve"] for r in rows] for m, rows in figures["runs"].items()},
            {m: [r["seconds"] for r in rows] for m, rows in figures["runs"].items()},
            figures["direction"],
            figures["metric"],
            f"{Path(figures['space']).name}: {n_trials} trials x {space.training.epochs} epochs, "
            f"{len(figures['seeds'])} seeds, {figures['device']}, {figures['threads']} torch thread(s)",
            args.plot,
        )
        figures["plot"] = str(args.plot)
    if args.out:
        write_result(figures, args.out, "benchmarks.search", argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
