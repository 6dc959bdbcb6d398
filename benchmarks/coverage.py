"""Do the stability report's 95% intervals hold their level? Coverage by simulation.

    python -m benchmarks.coverage                      # 2000 replicates per cell (a few minutes)
    python -m benchmarks.coverage --quick              # 100 replicates, n in {3, 8}: checks the script
    python -m benchmarks.coverage --reps 4000 --out coverage.json
    python -m benchmarks.coverage --shapes-only --reps 1000 --out coverage_shapes.json   # any shape of seeds

For each data shape and seed count n in {3, 5, 8, 16, 32, 64}, draw `--reps`
samples of n seeds whose true value is known, build each interval, and count how
often it contains the truth. A 95% interval should do so 95% of the time; with
2000 replicates the Monte-Carlo standard error of a coverage is about 0.5%.

Data shapes (what seed-to-seed results look like):
- normal;
- skewed: a mirrored gamma with shape 4 (skewness -1: a long tail of bad seeds);
- heavy-tailed: Student's t with 3 degrees of freedom;
- very skewed (reported, not a target): a log-normal with sigma 1 (skewness 6).

Intervals of a mean: `t` (the report's interval of the mean) and `BCa` (scipy's bias-corrected
accelerated bootstrap, 2000 resamples). Intervals of P(A better than B), two groups
of n seeds whose true P is 0.71: `newcombe` (the report's) and `BCa` of the
Mann-Whitney estimate (what the report used before). The last line names the worst
coverage of the t interval at n >= 5 over the target shapes.

Modes (no bootstrap, so fast; `--modes-only` runs just these):
- unimodal shapes (the four above and a mirrored gamma with shape 2), n in {5, 8, 16, 32, 64}:
  how often the mode rule splits a study that has one mode (its false-positive rate), the t
  interval's coverage, and the normal-theory chi-square interval's coverage of the variance;
- mixtures, most seeds N(75, 1) (accuracy in points), a share of 5%, 10% or 20% in a worse mode
  N(40, 1), n in {5, 8, 16, 32}: the t interval of the mean (of the mixture's true mean); the
  report's headline when modes are found, the good mode's t interval (of the good mode's true
  mean; with one mode, the t interval of all seeds); the exact interval of the share of seeds in
  the worse mode (of the true share); and how often the rule finds exactly the worse-mode seeds
  when the sample has some.

Any shape (`--shapes-only` runs just these; see benchmarks/_coverage_shapes.py): every interval the
report prints (median, IQM, mean, gone wrong, the performance profile's band, P(A better)) on normal,
t3, t2 and log-normal seeds, two modes, three modes and seeds between two clusters, n in
{5, 8, 16, 32, 64}; and grids whose failures follow the init seed.

Differences and grids (`--differences-only` runs just these, without bootstrap): on the same shapes and
n, the paired-t and Welch intervals of a difference between configurations and the chi-square interval
of a variance (`--decompose`); on crossed 3x3 to 8x8 grids with normal or heavy-tailed effects, and
failures that follow the init seed, the crossed interval of the mean and the variance components' intervals.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import scipy

from benchmarks._coverage_shapes import (
    GRID_SIDES,
    INTERVAL_GRID_SIDES,
    differences_markdown,
    run_differences,
    run_shapes,
    shapes_markdown,
)
from benchmarks._coverage_shapes import SEED_COUNTS as SHAPE_SEED_COUNTS
from hfta_nas.stability import (
    bootstrap_interval,
    clopper_pearson,
    find_modes,
    mode_threshold,
    prob_greater,
    prob_greater_interval,
    studentized_gaps,
    t_interval,
    variance_interval,
)

CONFIDENCE = 0.95
SEED_COUNTS = (3, 5, 8, 16, 32, 64)
TARGET_SHAPES = ("normal", "skewed", "heavy-tailed")
Draw = Callable[[np.random.Generator, int], np.ndarray]

# shape -> (draw n values, the true mean)
SHAPES: dict[str, tuple[Draw, float]] = {
    "normal": (lambda rng, n: rng.normal(0.0, 1.0, n), 0.0),
    "skewed": (lambda rng, n: -rng.gamma(4.0, 1.0, n), -4.0),
    "heavy-tailed": (lambda rng, n: rng.standard_t(3, n), 0.0),
    "very skewed": (lambda rng, n: rng.lognormal(0.0, 1.0, n), math.exp(0.5)),
}


# unimodal shapes for the mode rule: (draw, true variance)
MODE_SHAPES: dict[str, tuple[Draw, float]] = {
    "normal": (SHAPES["normal"][0], 1.0),
    "skewed": (SHAPES["skewed"][0], 4.0),
    "skewed (gamma 2)": (lambda rng, n: -rng.gamma(2.0, 1.0, n), 2.0),
    "heavy-tailed": (SHAPES["heavy-tailed"][0], 3.0),
    "very skewed": (SHAPES["very skewed"][0], (math.e - 1) * math.e),
}
MODE_SEED_COUNTS = (5, 8, 16, 32, 64)
MIXTURE_SEED_COUNTS = (5, 8, 16, 32)
BAD_SHARES = (0.05, 0.10, 0.20)
GOOD, BAD, SPREAD = 75.0, 40.0, 1.0  # the mixtures' modes, in accuracy points


def unimodal_cell(shape: str, n: int, reps: int, rng: np.random.Generator) -> dict[str, Any]:
    """False-positive rate of the mode rule, t coverage of the mean and chi-square coverage of the variance."""
    draw, variance = MODE_SHAPES[shape]
    truth = SHAPES.get(shape, (None, -2.0))[1]  # gamma 2 mirrored: mean -2
    samples = np.stack([draw(rng, n) for _ in range(reps)])
    widest = np.nanmax(studentized_gaps(np.sort(samples, axis=-1)), axis=-1)
    t_hits = [low <= truth <= high for low, high in (t_interval(x, CONFIDENCE) for x in samples)]
    var_hits = [(v := variance_interval(x, CONFIDENCE))["ci_low"] <= variance <= v["ci_high"] for x in samples]
    return {
        "shape": shape,
        "n": n,
        "modes_found": float(np.mean(widest >= mode_threshold(n))),
        "mean_t": float(np.mean(t_hits)),
        "variance_chi2": float(np.mean(var_hits)),
    }


def mixture_cell(bad_share: float, n: int, reps: int, rng: np.random.Generator) -> dict[str, Any]:
    hits = {"mean_t": 0, "good_mode": 0, "worse_share_exact": 0}
    with_bad = found = 0
    for _ in range(reps):
        bad = rng.random(n) < bad_share
        x = np.where(bad, rng.normal(BAD, SPREAD, n), rng.normal(GOOD, SPREAD, n))
        low, high = t_interval(x, CONFIDENCE)
        hits["mean_t"] += low <= GOOD - bad_share * (GOOD - BAD) <= high
        modes = find_modes(x)
        low, high = t_interval(x[modes["good"]], CONFIDENCE)
        hits["good_mode"] += low <= GOOD <= high
        low, high = clopper_pearson(len(modes["worse"]), n, CONFIDENCE)
        hits["worse_share_exact"] += low <= bad_share <= high
        if bad.any() and not bad.all():
            with_bad += 1
            found += modes["worse"] == list(np.flatnonzero(bad))
    return {
        "bad_share": bad_share,
        "n": n,
        **{name: count / reps for name, count in hits.items()},
        "modes_found_when_present": found / with_bad if with_bad else math.nan,
    }


def run_modes(reps: int, seed: int, mode_counts: tuple[int, ...], mixture_counts: tuple[int, ...]) -> dict[str, Any]:
    rng = np.random.default_rng(seed + 1)
    unimodal = [unimodal_cell(shape, n, reps, rng) for shape in MODE_SHAPES for n in mode_counts]
    mixtures = [mixture_cell(share, n, reps, rng) for share in BAD_SHARES for n in mixture_counts]
    return {"unimodal": unimodal, "mixtures": mixtures}


def modes_markdown(result: dict[str, Any]) -> str:
    lines = [
        "| unimodal data | n | mode rule splits it | mean: t | variance: chi-square |",
        "|---|--:|--:|--:|--:|",
        *(
            f"| {r['shape']} | {r['n']} | {r['modes_found']:.1%} | {r['mean_t']:.1%} | {r['variance_chi2']:.1%} |"
            for r in result["unimodal"]
        ),
        "",
        "| worse-mode share | n | mean: t | headline: good mode's t | worse share: exact | modes found when present |",
        "|--:|--:|--:|--:|--:|--:|",
        *(
            f"| {r['bad_share']:.0%} | {r['n']} | {r['mean_t']:.1%} | {r['good_mode']:.1%} | "
            f"{r['worse_share_exact']:.1%} | "
            f"{r['modes_found_when_present']:.1%} |"
            for r in result["mixtures"]
        ),
    ]
    return "\n".join(lines)


def true_p_better(draw: Draw, shift: float, pairs: int = 4_000_000) -> float:
    """P(A > B) + 0.5 P(A = B) for A = B' + shift, by one large Monte-Carlo draw (fixed seed)."""
    rng = np.random.default_rng(12345)
    return float(np.mean(draw(rng, pairs) + shift > draw(rng, pairs)))


def mean_coverage(draw: Draw, truth: float, n: int, reps: int, rng: np.random.Generator) -> dict[str, float]:
    hits = {"t": 0, "BCa": 0}
    for rep in range(reps):
        x = draw(rng, n)
        for name, (low, high) in (
            ("t", t_interval(x, CONFIDENCE)),
            ("BCa", bootstrap_interval([x], np.mean, seed=rep, n_resamples=2000)),
        ):
            hits[name] += bool(low <= truth <= high)
    return {name: count / reps for name, count in hits.items()}


def p_better_coverage(
    draw: Draw, shift: float, truth: float, n: int, reps: int, rng: np.random.Generator
) -> dict[str, float]:
    hits = {"newcombe": 0, "BCa": 0}
    for rep in range(reps):
        a, b = draw(rng, n) + shift, draw(rng, n)
        for name, (low, high) in (
            ("newcombe", prob_greater_interval(a, b, CONFIDENCE)),
            ("BCa", bootstrap_interval([a, b], prob_greater, seed=rep, n_resamples=2000)),
        ):
            hits[name] += bool(low <= truth <= high)
    return {name: count / reps for name, count in hits.items()}


def run(reps: int, seed_counts: tuple[int, ...], seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for shape, (draw, truth) in SHAPES.items():
        # a shift of 0.78 sd of the shape: P(A better) of about 0.71 on normal data
        shift = 0.78 * float(np.std(draw(np.random.default_rng(1), 1_000_000)))
        p_truth = true_p_better(draw, shift)
        for n in seed_counts:
            started = time.perf_counter()
            mean = mean_coverage(draw, truth, n, reps, rng)
            p = p_better_coverage(draw, shift, p_truth, n, reps, rng)
            rows.append(
                {
                    "shape": shape,
                    "n": n,
                    "mean_t": mean["t"],
                    "mean_bca": mean["BCa"],
                    "p_better_newcombe": p["newcombe"],
                    "p_better_bca": p["BCa"],
                    "true_p_better": p_truth,
                    "seconds": round(time.perf_counter() - started, 1),
                }
            )
            print(
                f"{shape:>13} n={n:<3} mean: t {mean['t']:.1%}  BCa {mean['BCa']:.1%}   "
                f"P(A better)={p_truth:.2f}: Newcombe {p['newcombe']:.1%}  BCa {p['BCa']:.1%}",
                flush=True,
            )
    return {"confidence": CONFIDENCE, "reps": reps, "seed": seed, "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| data | n | mean: t | mean: BCa | P(A better): Newcombe (the report's) | P(A better): BCa |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['shape']} | {r['n']} | {r['mean_t']:.1%} | {r['mean_bca']:.1%} | "
            f"{r['p_better_newcombe']:.1%} | {r['p_better_bca']:.1%} |"
        )
    return "\n".join(lines)


def worst_headline(result: dict[str, Any]) -> str:
    cells = [r for r in result["rows"] if r["shape"] in TARGET_SHAPES and r["n"] >= 5]
    if not cells:
        return "coverage: no cell with n >= 5"
    mean = max(cells, key=lambda r: abs(r["mean_t"] - CONFIDENCE))
    p = max(cells, key=lambda r: abs(r["p_better_newcombe"] - CONFIDENCE))
    return (
        f"coverage: intervals at n >= 5 on normal, skewed and heavy-tailed data: mean (t) "
        f"{min(r['mean_t'] for r in cells):.1%}-{max(r['mean_t'] for r in cells):.1%} (furthest from 95%: "
        f"{mean['shape']} n={mean['n']}), P(A better) (Newcombe) {min(r['p_better_newcombe'] for r in cells):.1%}-"
        f"{max(r['p_better_newcombe'] for r in cells):.1%} (furthest: {p['shape']} n={p['n']}); "
        f"{result['reps']} replicates per cell"
    )


def machine() -> dict[str, Any]:
    """What the timings ran on: the load while it ran, the threads and the packages."""
    return {
        "load_1_5_15": os.getloadavg(),
        "cpus": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2000, help="replicates per cell")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="100 replicates, n in {3, 8}")
    parser.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--modes-only", action="store_true", help="only the mode rule and mixture tables (fast)")
    only.add_argument("--shapes-only", action="store_true", help="only the any-shape table (every printed interval)")
    only.add_argument(
        "--differences-only", action="store_true", help="only the differences' and grids' intervals on any shape"
    )
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be positive")
    started = time.perf_counter()
    reps, counts = (100, (3, 8)) if args.quick else (args.reps, SEED_COUNTS)
    mode_counts, mixture_counts = ((8,), (8,)) if args.quick else (MODE_SEED_COUNTS, MIXTURE_SEED_COUNTS)
    shape_counts, sides = ((8,), (4,)) if args.quick else (SHAPE_SEED_COUNTS, GRID_SIDES)
    interval_sides = (4,) if args.quick else INTERVAL_GRID_SIDES
    alone = args.modes_only or args.shapes_only or args.differences_only
    result = {"confidence": CONFIDENCE, "reps": reps, "seed": args.seed, "rows": [], "machine_at_start": machine()}
    if not alone:
        result.update(run(reps, counts, args.seed))
        print(markdown(result))
    if not alone or args.modes_only:
        result.update(run_modes(reps, args.seed, mode_counts, mixture_counts))
        print(modes_markdown(result))
    if not alone or args.shapes_only:
        result.update(run_shapes(reps, args.seed, shape_counts, sides))
        print(shapes_markdown(result))
    if not alone or args.differences_only:
        result.update(run_differences(reps, args.seed, shape_counts, interval_sides))
        print(differences_markdown(result))
    result["machine_at_end"] = machine()
    result["seconds"] = round(time.perf_counter() - started, 1)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if not alone:
        print(worst_headline(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
