"""Stopping a seed study when it is decided: is it still right? A simulation, no training.

    python -m benchmarks.stopping                 # 1000 replicates per cell (a few minutes)
    python -m benchmarks.stopping --quick         # 10 replicates: checks the script
    python -m benchmarks.stopping --out benchmarks/results/stopping.json

A study looks after every round of 8 seeds, up to 256, and stops as soon as its rule says so.
Seeds are simulated accuracies (fractions) of three shapes: normal, heavy-tailed (Student's t
with 3 degrees of freedom) and bimodal (15% of seeds in a mode 30 points worse); paired
differences are normal, heavy-tailed (t3) or bimodal (two modes at -1 and +1 point). The rules:
- `CS mean`, `CS median`: `hfta-nas stability --until mean±h / median±h` and `stability compare
  --until-decided mean / median`: the anytime-valid confidence sequences of
  hfta_nas.stability (95%);
- `t`: naive peeking: a 95% t interval (or paired t-test) recomputed at every look.

Three tables:
- ±h: stop once the interval's half-width is <= h; missed = the interval at the stop excludes
  the true mean (median) (target: at most 5%);
- no difference: type-I error = the study ever declares a winner ("run until p < 0.05" for
  `t`; target: at most 5%); and a failure rate of exactly 10%: how often "below 10%" is ever
  declared (the Bernoulli sequence; Clopper-Pearson recomputed at each look);
- seeds saved: A better by delta; each rule's power (decided for A by 256 seeds) and mean
  seeds at its stop, against the fixed-n paired t-test of equal power (smallest n, found by
  simulating the same shape): ratio = mean seeds / fixed n (below 1: seeds saved); none is sought
  where the power is below 50%.
"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")  # one thread: the figures do not depend on the machine's cores

import argparse  # noqa: E402 (after the thread settings, which numpy reads on import)
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import scipy  # noqa: E402
from scipy import stats  # noqa: E402

from hfta_nas.stability import bernoulli_cs, hedged_cs, median_cs  # noqa: E402

ROUND, MAX_SEEDS = 8, 256
LOOKS = np.arange(ROUND, MAX_SEEDS + 1, ROUND)
Draw = Callable[[np.random.Generator, int], np.ndarray]

# accuracies of seeds: shape -> (draw n, precision h asked of the mean and the median)
SHAPES: dict[str, tuple[Draw, float]] = {
    "normal": (lambda rng, n: rng.normal(0.75, 0.02, n), 0.01),
    "heavy-tailed": (lambda rng, n: 0.75 + 0.012 * rng.standard_t(3, n), 0.01),
    "bimodal": (
        lambda rng, n: np.where(rng.random(n) < 0.15, rng.normal(0.45, 0.03, n), rng.normal(0.75, 0.01, n)),
        0.05,
    ),
}
# paired differences A - B under no difference: symmetric about 0, so mean and median are 0
NULL_DIFFERENCES: dict[str, Draw] = {
    "normal": lambda rng, n: rng.normal(0.0, 0.01, n),
    "heavy-tailed": lambda rng, n: 0.01 * rng.standard_t(3, n) / np.sqrt(3),
    "bimodal": lambda rng, n: np.where(rng.random(n) < 0.5, -0.01, 0.01) + rng.normal(0.0, 0.003, n),
}
EFFECTS = (0.5, 1.0, 2.0)  # delta in standard deviations of the difference
STATISTICS = ("mean", "median")
MIN_POWER = 0.5  # below it a "design of equal power" answers nothing worth sizing: no fixed n is sought


def true_values(draw: Draw, seed: int) -> dict[str, float]:
    """The clipped shape's mean and median, from 4 million draws (standard error about 1e-5)."""
    x = np.clip(draw(np.random.default_rng(seed), 4_000_000), 0, 1)
    return {"mean": float(x.mean()), "median": float(np.median(x))}


def first_look(stops: np.ndarray) -> int:
    """Index of the first look where `stops` (one flag per look) holds; the last look if none."""
    hits = np.flatnonzero(stops)
    return int(hits[0]) if hits.size else len(stops) - 1


def cs_at_looks(x: np.ndarray, statistic: str, lowest: float) -> tuple[np.ndarray, np.ndarray]:
    """What `--until` sees at each look: the sequence for the mean or median of x in [lowest, 1]."""
    if statistic == "median":  # running_median_cs at each look, from one pass over the prefixes
        bounds = np.array([median_cs(x[:t], lowest=lowest) for t in range(1, LOOKS[-1] + 1)])
        lower, upper = np.maximum.accumulate(bounds[:, 0]), np.minimum.accumulate(bounds[:, 1])
        return lower[LOOKS - 1], upper[LOOKS - 1]
    width = 1 - lowest
    lower, upper = hedged_cs((x - lowest) / width)
    return lowest + width * lower[LOOKS - 1], lowest + width * upper[LOOKS - 1]


def t_half_widths(x: np.ndarray) -> np.ndarray:
    return np.array([stats.t.ppf(0.975, n - 1) * x[:n].std(ddof=1) / np.sqrt(n) for n in LOOKS])


def precision_cell(shape: str, reps: int, rng: np.random.Generator, seed: int) -> dict[str, Any]:
    """Stop once the half-width is <= h; missed: the interval at the stop excludes the truth."""
    draw, h = SHAPES[shape]
    truth = true_values(draw, seed)
    missed = {"mean": 0, "median": 0, "t": 0}
    seeds: dict[str, list[int]] = {rule: [] for rule in missed}
    for _ in range(reps):
        x = np.clip(draw(rng, MAX_SEEDS), 0, 1)
        for statistic in STATISTICS:
            low, high = cs_at_looks(x, statistic, 0.0)
            at = first_look((high - low) / 2 <= h)
            missed[statistic] += not low[at] <= truth[statistic] <= high[at]
            seeds[statistic].append(LOOKS[at])
        halves = t_half_widths(x)
        at = first_look(halves <= h)
        missed["t"] += abs(x[: LOOKS[at]].mean() - truth["mean"]) > halves[at]
        seeds["t"].append(LOOKS[at])
    return {
        "shape": shape,
        "h": h,
        "truth": truth,
        **{f"{rule}_miscoverage": missed[rule] / reps for rule in missed},
        **{f"{rule}_mean_seeds": float(np.mean(seeds[rule])) for rule in seeds},
    }


def decision(d: np.ndarray, statistic: str) -> tuple[int, int]:
    """`--until-decided statistic` on paired differences d: (sign decided or 0, seeds at the stop)."""
    low, high = cs_at_looks(d, statistic, -1.0)
    at = first_look((low > 0) | (high < 0))
    return (1 if low[at] > 0 else -1 if high[at] < 0 else 0), int(LOOKS[at])


def peeking_t_rejects(d: np.ndarray) -> bool:
    """ "Run until p < 0.05": a paired t-test at every look."""
    return any(stats.ttest_1samp(d[:n], 0.0).pvalue < 0.05 for n in LOOKS)


def null_cell(shape: str, reps: int, rng: np.random.Generator) -> dict[str, Any]:
    """No difference: how often each rule ever declares a winner (its type-I error)."""
    draw = NULL_DIFFERENCES[shape]
    errors = {"mean": 0, "median": 0, "t_peeking": 0, "t_fixed_256": 0}
    for _ in range(reps):
        d = np.clip(draw(rng, MAX_SEEDS), -1, 1)
        for statistic in STATISTICS:
            errors[statistic] += decision(d, statistic)[0] != 0
        errors["t_peeking"] += peeking_t_rejects(d)
        errors["t_fixed_256"] += stats.ttest_1samp(d, 0.0).pvalue < 0.05  # one look: the t-test's own level
    return {"shape": shape, **{f"{rule}_type1": count / reps for rule, count in errors.items()}}


def failure_cell(reps: int, rng: np.random.Generator, rate: float = 0.1) -> dict[str, Any]:
    """True failure rate exactly `rate`: how often 'below rate' is ever declared."""
    cs_upper = {(k, n): bernoulli_cs(k, n)[1] for n in LOOKS for k in range(n + 1)}
    cp_upper = {(k, n): stats.beta.ppf(0.975, k + 1, n - k) if k < n else 1.0 for n in LOOKS for k in range(n + 1)}
    cs_errors = cp_errors = 0
    for _ in range(reps):
        counts = np.cumsum(rng.random(MAX_SEEDS) < rate)[LOOKS - 1]
        cs_errors += any(cs_upper[(int(k), int(n))] < rate for k, n in zip(counts, LOOKS))
        cp_errors += any(cp_upper[(int(k), int(n))] < rate for k, n in zip(counts, LOOKS))
    return {"rate": rate, "cs_type1": cs_errors / reps, "clopper_pearson_peeking_type1": cp_errors / reps}


def fixed_n_of_power(draw: Draw, power: float, reps: int, rng: np.random.Generator) -> int | None:
    """The smallest n whose one-look paired t-test (two-sided 5%) decides for A at least as often."""
    for n in range(4, MAX_SEEDS + 1, 4):
        d = np.clip(draw(rng, reps * n).reshape(reps, n), -1, 1)
        result = stats.ttest_1samp(d, 0.0, axis=1)
        if np.mean((result.pvalue < 0.05) & (result.statistic > 0)) >= power:
            return n
    return None


def saving_cell(shape: str, effect: float, statistic: str, reps: int, rng: np.random.Generator) -> dict[str, Any]:
    """A better by `effect` sds: the rule's power and mean seeds against the fixed-n t-test of equal power."""
    null = NULL_DIFFERENCES[shape]
    sd = float(np.clip(null(np.random.default_rng(1), 1_000_000), -1, 1).std())
    draw: Draw = lambda g, n: null(g, n) + effect * sd  # noqa: E731 (the shape shifted by delta)
    outcomes = [decision(np.clip(draw(rng, MAX_SEEDS), -1, 1), statistic) for _ in range(reps)]
    power = float(np.mean([sign > 0 for sign, _ in outcomes]))
    mean_seeds = float(np.mean([n for _, n in outcomes]))
    fixed = fixed_n_of_power(draw, power, reps, rng) if power >= MIN_POWER else None
    return {
        "shape": shape,
        "statistic": statistic,
        "effect_sd": effect,
        "delta": effect * sd,
        "power": power,
        "mean_seeds": mean_seeds,
        "fixed_n_equal_power": fixed,
        "seeds_ratio": None if fixed is None else mean_seeds / fixed,
    }


def machine() -> dict[str, Any]:
    return {
        "load_1_5_15": os.getloadavg(),
        "cpus": os.cpu_count(),
        "threads": {
            name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
        },
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
    }


def markdown(result: dict[str, Any]) -> str:
    pct = lambda v: "–" if v is None else f"{100 * v:.1f}%"  # noqa: E731 (local helper)
    lines = [
        f"Optional stopping, {result['reps']} simulated studies per row, a look every {ROUND} seeds up to "
        f"{MAX_SEEDS} (a study that never stops counts {MAX_SEEDS} seeds).",
        "",
        "| shape | ±h | CS mean: missed | seeds | CS median: missed | seeds | t (peeking): missed | seeds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["precision"]:
        lines.append(
            f"| {r['shape']} | ±{100 * r['h']:.0f} pts | {pct(r['mean_miscoverage'])} | {r['mean_mean_seeds']:.0f} "
            f"| {pct(r['median_miscoverage'])} | {r['median_mean_seeds']:.0f} "
            f"| {pct(r['t_miscoverage'])} | {r['t_mean_seeds']:.0f} |"
        )
    lines += [
        "",
        "| no difference | CS mean: type-I | CS median: type-I | t-test at every look | t-test once at 256 |",
        "|---|---|---|---|---|",
    ]
    for r in result["null"]:
        lines.append(
            f"| {r['shape']} | {pct(r['mean_type1'])} | {pct(r['median_type1'])} | {pct(r['t_peeking_type1'])} "
            f"| {pct(r['t_fixed_256_type1'])} |"
        )
    f = result["failure"]
    lines += [
        "",
        f"Failure rate exactly {pct(f['rate'])}: 'below' declared at some look: Bernoulli CS {pct(f['cs_type1'])}, "
        f"Clopper-Pearson at every look {pct(f['clopper_pearson_peeking_type1'])}.",
        "",
        "| A better by | shape | rule | power | mean seeds | fixed-n t-test of equal power | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["savings"]:
        fixed = "–" if r["fixed_n_equal_power"] is None else str(r["fixed_n_equal_power"])
        ratio = "–" if r["seeds_ratio"] is None else f"{r['seeds_ratio']:.2f}"
        lines.append(
            f"| {r['effect_sd']:g} sd ({100 * r['delta']:.2f} pts) | {r['shape']} | CS {r['statistic']} "
            f"| {pct(r['power'])} | {r['mean_seeds']:.0f} | {fixed} | {ratio} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=1000, help="simulated studies per row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="10 replicates: checks the script")
    parser.add_argument("--out", type=Path, default=None, help="write the tables as JSON here")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be positive")
    reps = 10 if args.quick else args.reps
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    result: dict[str, Any] = {"reps": reps, "seed": args.seed, "round": ROUND, "max_seeds": MAX_SEEDS}
    result["machine_at_start"] = machine()
    result["precision"] = [precision_cell(shape, reps, rng, args.seed + 1) for shape in SHAPES]
    result["null"] = [null_cell(shape, reps, rng) for shape in NULL_DIFFERENCES]
    result["failure"] = failure_cell(reps, rng)
    result["savings"] = [
        saving_cell(shape, effect, statistic, reps, rng)
        for effect in EFFECTS
        for shape in NULL_DIFFERENCES
        for statistic in STATISTICS
    ]
    result["machine_at_end"] = machine()
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(markdown(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
