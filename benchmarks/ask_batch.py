"""What asking trials in batches costs TPE: the default search with other ask policies, same seeds.

    python -m benchmarks.ask_batch --out benchmarks/results/ask-batch.json   # the CNN space, its budget, 5 seeds
    python -m benchmarks.ask_batch --quick                                   # 2 epochs, 1000 samples, 1 seed
    python -m benchmarks.ask_batch --n-trials 48 --set training.epochs=15 --seeds 5
    python -m benchmarks.ask_batch --space search_spaces/mnist1d_mlp.yaml --pools none --first-seed 10 --seeds 30

A search asks a pool of trials before any of them has a result: when the array size is "auto", AUTO_POOL
(16) but no more than the third of the budget an array may take (`hfta_nas.search._optimize.auto_pool`;
`$HFTA_NAS_ASK_POOL` sets another), and TPE proposes each with the others' results unknown (the constant
liar spreads them). Variants, each the default search (`run_search`) on the same space, budget and seeds,
in an order rotated per seed:

- `shipped`: as shipped (the search's own pool, TPE's constant liar on);
- `pool-N`: a pool of N trials per round instead (`--pools`, default 6);
- `no-liar`: as shipped with `sampler.kwargs.constant_liar=false`.

Per variant, median [min, max] over seeds: final best, wall time, trials asked before the first result;
seed by seed against `shipped`: the difference of final bests (equal trials) and the best each reached
by shipped's median wall time (equal wall time). The JSON records the load and package versions.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import optuna
import torch

from benchmarks._anytime import spread, value_at
from benchmarks._cli import comma_list, package_versions, write_result
from benchmarks._search_methods import RUNNERS
from benchmarks.search import DEFAULT_SPACE, quick_space, run_figures
from hfta_nas.errors import HftaNasError
from hfta_nas.search_spaces import SearchSpace, load_space

POOL_SETTING = "HFTA_NAS_ASK_POOL"
SHIPPED = "auto"  # the pool a variant records when the search chooses it (the setting unset)


def variant_space(space: SearchSpace, variant: str) -> tuple[SearchSpace, int | str]:
    """The space and the pool size a variant searches with (SHIPPED: the search's own)."""
    if variant == "no-liar":
        sampler = space.sampler.model_copy(update={"kwargs": {**(space.sampler.kwargs or {}), "constant_liar": False}})
        return space.model_copy(update={"sampler": sampler}), SHIPPED
    if variant.startswith("pool-"):
        return space, int(variant.removeprefix("pool-"))
    return space, SHIPPED


def one_search(space: SearchSpace, variant: str, n_trials: int) -> dict[str, Any]:
    searched, pool = variant_space(space, variant)
    before = os.environ.pop(POOL_SETTING, None)
    if pool != SHIPPED:
        os.environ[POOL_SETTING] = str(pool)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-ask-") as folder:
            done = RUNNERS["pack"](searched, n_trials, "cpu", "float32", Path(folder), 1)
    finally:
        os.environ.pop(POOL_SETTING, None)
        if before is not None:
            os.environ[POOL_SETTING] = before
    figures = run_figures(done, space.directions[0])
    first_result = min((seconds for seconds, _, _ in done.finished()), default=0.0)
    asked = sum((t.datetime_start - done.start).total_seconds() <= first_result for t in done.trials)
    return {**figures, "pool": pool, "asked_before_first_result": asked}


def summarize(runs: dict[str, list[dict[str, Any]]], direction: str) -> dict[str, Any]:
    horizon = spread([r["seconds"] for r in runs["shipped"]])["median"]
    methods = {}
    for variant, rows in runs.items():
        pairs = list(zip(rows, runs["shipped"]))
        methods[variant] = {
            "best_value": spread([r["best_value"] for r in rows], direction),
            "seconds": spread([r["seconds"] for r in rows]),
            "asked_before_first_result": spread([r["asked_before_first_result"] for r in rows]),
            "best_minus_shipped": spread([_minus(r["best_value"], s["best_value"]) for r, s in pairs]),
            "best_at_shipped_median_wall": spread([value_at(r["curve"], horizon) for r in rows], direction),
        }
    return {"horizon_s": horizon, "variants": methods}


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--space", type=Path, default=DEFAULT_SPACE, help="search space file (TPE)")
    parser.add_argument("--n-trials", type=int, default=None, help="trials per search; None: the space's budget")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--seeds", type=int, default=5, help="search seeds 0..N-1")
    pools = comma_list(int, empty_ok=True)
    parser.add_argument("--pools", type=pools, default=[6], help="pool sizes to compare ('none': none)")
    parser.add_argument("--first-seed", type=int, default=0, help="search seeds FIRST..FIRST+SEEDS-1")
    parser.add_argument("--quick", action="store_true", help="2 epochs, 1000 samples, 1 seed: checks the script")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if min(args.seeds, args.n_trials or 1, *args.pools) < 1 or args.first_seed < 0:
        print("error: --seeds, --n-trials and --pools must be positive, --first-seed not negative", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        space = load_space(args.space, args.overrides)
    except HftaNasError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    seeds = 1 if args.quick else args.seeds
    space = quick_space(space) if args.quick else space
    n_trials = args.n_trials or space.budget.n_trials
    variants = ["shipped", *(f"pool-{p}" for p in args.pools), "no-liar"]
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for seed in range(args.first_seed, args.first_seed + seeds):
        for variant in variants[seed % len(variants) :] + variants[: seed % len(variants)]:
            row = one_search(space.with_overrides(seed=seed), variant, n_trials)
            runs[variant].append({"seed": seed, **row})
            print(f"  seed {seed} {variant:>8}: {row['seconds']:6.1f} s, best {row['best_value']}", file=sys.stderr)
    result = {
        "space": str(space.source),
        "n_trials": n_trials,
        "epochs": space.training.epochs,
        "seeds": list(range(args.first_seed, args.first_seed + seeds)),
        "quick": args.quick,
        "runs": runs,
        "summary": summarize(runs, space.directions[0]),
        "versions": package_versions(),
        "machine": {
            "cpu_count": os.cpu_count(),
            "load_average_before": list(load_before),
            "load_average_after": list(os.getloadavg()),
            "busy": max(*load_before, *os.getloadavg()) > len(os.sched_getaffinity(0)),
        },
    }
    for variant, cell in result["summary"]["variants"].items():
        print(
            f"{variant:>8}: best {cell['best_value']['median']} (minus shipped's, seed by seed: median "
            f"{cell['best_minus_shipped']['median']}), wall {cell['seconds']['median']:.1f} s, best by shipped's "
            f"median wall {cell['best_at_shipped_median_wall']['median']}, asked before the first result "
            f"{cell['asked_before_first_result']['median']}"
        )
    if args.out:
        write_result(result, args.out, "benchmarks.ask_batch", argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
