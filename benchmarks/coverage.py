"""Do the stability report's 95% intervals hold their level? Coverage by simulation.

    python -m benchmarks.coverage                      # 2000 replicates per cell (a few minutes)
    python -m benchmarks.coverage --quick              # 100 replicates, n in {3, 8}: checks the script
    python -m benchmarks.coverage --reps 4000 --out coverage.json

For each data shape and seed count n in {3, 5, 8, 16, 32, 64}, draw `--reps`
samples of n seeds whose true value is known, build each interval, and count how
often it contains the truth. A 95% interval should do so 95% of the time; with
2000 replicates the Monte-Carlo standard error of a coverage is about 0.5%.

Data shapes (what seed-to-seed results look like):
- normal;
- skewed: a mirrored gamma with shape 4 (skewness -1: a long tail of bad seeds);
- heavy-tailed: Student's t with 3 degrees of freedom;
- very skewed (reported, not a target): a log-normal with sigma 1 (skewness 6).

Intervals of a mean: `t` (the report's headline) and `BCa` (scipy's bias-corrected
accelerated bootstrap, 2000 resamples). Intervals of P(A better than B), two groups
of n seeds whose true P is 0.71: `newcombe` (the report's) and `BCa` of the
Mann-Whitney estimate (what the report used before). The last line names the worst
headline coverage at n >= 5 over the target shapes.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from stability import bootstrap_interval, prob_greater, prob_greater_interval, t_interval

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
        "| data | n | mean: t (headline) | mean: BCa | P(A better): Newcombe (headline) | P(A better): BCa |",
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
        f"coverage: headline intervals at n >= 5 on normal, skewed and heavy-tailed data: mean (t) "
        f"{min(r['mean_t'] for r in cells):.1%}-{max(r['mean_t'] for r in cells):.1%} (furthest from 95%: "
        f"{mean['shape']} n={mean['n']}), P(A better) (Newcombe) {min(r['p_better_newcombe'] for r in cells):.1%}-"
        f"{max(r['p_better_newcombe'] for r in cells):.1%} (furthest: {p['shape']} n={p['n']}); "
        f"{result['reps']} replicates per cell"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2000, help="replicates per cell")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="100 replicates, n in {3, 8}")
    parser.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be positive")
    reps, counts = (100, (3, 8)) if args.quick else (args.reps, SEED_COUNTS)
    result = run(reps, counts, args.seed)
    print(markdown(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(worst_headline(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
