"""Coverage of every interval the report prints, on seeds of any shape (issue 42).

Each shape draws seed results in accuracy points. Its true median, mean, IQM, failure rate and
distribution come from one large seeded draw (4 million values; their Monte-Carlo error is below
0.1 point, far under the intervals' widths). For each shape and n, `reps` studies are drawn and
each interval is checked against its truth:

- median: the exact order-statistic interval (`_robust.median_interval`), of the true median;
- IQM: rliable's stratified percentile bootstrap, 2000 resamples, of the population IQM;
- mean: the t interval (the report's interval of the mean), of the true mean;
- gone wrong: Clopper-Pearson of the share of seeds more than 10% below the median (the cut
  taken from each study's own median, as the report does), of the true share below 0.9 x the
  true median;
- profile: the DKW band holds the true share above every threshold at once;
- P(A better): Newcombe's interval, A the same shape 1 point higher.

Grids (init x data, one run per cell; an init seed is bad with probability 0.2 and then every
run it starts is, the audit's case): the exact interval of the failure rate counted per run
(what the report did) and per init seed (what it does now).

Differences and variances (`difference_cell`, no bootstrap): A and B each n seeds of the shape, A 1
point higher, each run going wrong on its own; the paired-t interval of A - B over the slots
(`compare`'s) and Welch's interval (different seeds), both of the true difference 1; the same two
with only A of the shape and B normal seeds N(75, 2) (only one configuration goes wrong); and the
chi-square interval of the variance (`--decompose`'s per source), of the shape's true variance (t2
has none: no interval covers it). Crossed grids (`grid_interval_cell`): init x data seeds, one run
per cell, 75 + init effect + data effect + residual, normal or t3 effects (sd 2, 1, 1), and t3
effects whose init seed fails (35 points down) with probability 0.2: the crossed interval of the
grand mean and the three variance components' intervals, each of its analytic truth.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from hfta_nas.stability import (
    FAIL_MARGIN,
    clopper_pearson,
    crossed_mean_interval,
    dkw_half_width,
    grid_decomposition,
    median_interval,
    prob_greater_interval,
    stratified_bootstrap,
    t_interval,
    variance_interval,
    welch_interval,
    wrong_units,
)

CONFIDENCE = 0.95
SEED_COUNTS = (5, 8, 16, 32, 64)
GRID_SIDES = (4, 5, 8)  # 16, 25 and 64 runs
INTERVAL_GRID_SIDES = (3, 4, 5, 8)  # 9 to 64 runs
NO_VARIANCE = {"t2"}  # Student's t with 2 degrees of freedom has an infinite variance
REFERENCE_DRAWS = 4_000_000
BOOTSTRAP_REPS = 2000
Draw = Callable[[np.random.Generator, int], np.ndarray]


def _mixture(parts: list[tuple[float, Draw]]) -> Draw:
    """Each value from part i with probability p_i."""
    shares = np.array([p for p, _ in parts])

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        which = rng.choice(len(parts), n, p=shares)
        return np.select([which == i for i in range(len(parts))], [d(rng, n) for _, d in parts])

    return draw


def _normal(mean: float, sd: float = 1.0) -> Draw:
    return lambda rng, n: rng.normal(mean, sd, n)


SHAPES: dict[str, Draw] = {
    "normal": _normal(75, 2),
    "t3": lambda rng, n: 75 + 2 * rng.standard_t(3, n),
    "t2": lambda rng, n: 75 + 2 * rng.standard_t(2, n),
    "log-normal (tail of bad seeds)": lambda rng, n: 75 - 2 * rng.lognormal(0.0, 1.0, n),
    "two modes (10% at 40)": _mixture([(0.9, _normal(75)), (0.1, _normal(40))]),
    "three modes (70% at 75, 15% at 45, 15% at 10)": _mixture(
        [(0.7, _normal(75)), (0.15, _normal(45)), (0.15, _normal(10))]
    ),
    "between clusters (80% at 75, 10% at 40, 10% between)": _mixture(
        [(0.8, _normal(75)), (0.1, _normal(40)), (0.1, lambda rng, n: rng.uniform(40, 75, n))]
    ),
}


def truths(draw: Draw) -> dict[str, Any]:
    """The population's median, mean, IQM, share gone wrong and sorted reference draw."""
    x = np.sort(draw(np.random.default_rng(2026), REFERENCE_DRAWS))
    median = float(np.median(x))
    cut = median - FAIL_MARGIN * abs(median)
    return {
        "median": median,
        "mean": float(np.mean(x)),
        "iqm": float(stats.trim_mean(x, 0.25)),
        "bad_rate": float(np.mean(x < cut)),
        "sorted": x,
    }


def _profile_holds(sample: np.ndarray, reference: np.ndarray, half: float) -> bool:
    """Whether the DKW band around the sample's distribution holds the true one everywhere: the
    largest distance is at a sample value, just before or at its step."""
    x = np.sort(sample)
    n = x.size
    true_at = np.searchsorted(reference, x, side="right") / reference.size
    true_before = np.searchsorted(reference, x, side="left") / reference.size
    after, before = np.arange(1, n + 1) / n, np.arange(n) / n
    return bool(max(np.max(np.abs(after - true_at)), np.max(np.abs(before - true_before))) <= half)


def shape_cell(shape: str, truth: dict[str, Any], n: int, reps: int, rng: np.random.Generator) -> dict[str, Any]:
    draw = SHAPES[shape]
    hits = dict.fromkeys(("median_exact", "iqm_bootstrap", "mean_t", "bad_exact", "profile_dkw", "p_better"), 0)
    p_truth = truth["p_better"]
    for rep in range(reps):
        x = draw(rng, n)
        m = median_interval(x, CONFIDENCE)
        hits["median_exact"] += m["low"] <= truth["median"] <= m["high"]
        low, high = stratified_bootstrap(x, confidence=CONFIDENCE, reps=BOOTSTRAP_REPS, rng=rep)
        hits["iqm_bootstrap"] += low <= truth["iqm"] <= high
        low, high = t_interval(x, CONFIDENCE)
        hits["mean_t"] += low <= truth["mean"] <= high
        median = float(np.median(x))
        low, high = clopper_pearson(int(np.sum(x < median - FAIL_MARGIN * abs(median))), n, CONFIDENCE)
        hits["bad_exact"] += low <= truth["bad_rate"] <= high
        hits["profile_dkw"] += _profile_holds(x, truth["sorted"], dkw_half_width(n, CONFIDENCE))
        low, high = prob_greater_interval(draw(rng, n) + 1.0, draw(rng, n), CONFIDENCE)
        hits["p_better"] += low <= p_truth <= high
    return {"shape": shape, "n": n, **{k: v / reps for k, v in hits.items()}, "exact_median_level": m["level"]}


def grid_cell(side: int, reps: int, rng: np.random.Generator, bad_init: float = 0.2) -> dict[str, Any]:
    """A side x side grid whose failures follow the init seed: per-run against per-init-seed counting."""
    per_run = per_unit = 0
    init = np.repeat(np.arange(side), side)
    for _ in range(reps):
        bad_seed = rng.random(side) < bad_init
        values = np.where(bad_seed[init], rng.normal(40, 1, side * side), rng.normal(75, 1, side * side))
        median = float(np.median(values))
        wrong = values < median - FAIL_MARGIN * abs(median)
        low, high = clopper_pearson(int(wrong.sum()), wrong.size, CONFIDENCE)
        per_run += low <= bad_init <= high
        low, high = clopper_pearson(*wrong_units(wrong, init), CONFIDENCE)
        per_unit += low <= bad_init <= high
    return {
        "grid": f"{side} x {side}",
        "runs": side * side,
        "per_run": per_run / reps,
        "per_init_seed": per_unit / reps,
    }


def run_shapes(reps: int, seed: int, counts: tuple[int, ...], sides: tuple[int, ...]) -> dict[str, Any]:
    rng = np.random.default_rng(seed + 2)
    rows = []
    for shape, draw in SHAPES.items():
        truth = truths(draw)
        big = np.random.default_rng(7)
        truth["p_better"] = float(np.mean(draw(big, 2_000_000) + 1.0 > draw(big, 2_000_000)))
        for n in counts:
            rows.append(shape_cell(shape, truth, n, reps, rng))
            r = rows[-1]
            print(
                f"{shape[:30]:>30} n={n:<3} median {r['median_exact']:.1%} IQM {r['iqm_bootstrap']:.1%} "
                f"mean t {r['mean_t']:.1%} gone wrong {r['bad_exact']:.1%} profile {r['profile_dkw']:.1%} "
                f"P(A better) {r['p_better']:.1%}",
                flush=True,
            )
    grids = [grid_cell(side, reps, rng) for side in sides]
    return {"shapes": rows, "grids": grids}


def shapes_markdown(result: dict[str, Any]) -> str:
    lines = [
        "| seeds | n | median: exact (its level) | IQM: bootstrap | mean: t | gone wrong: exact | "
        "profile: DKW band | P(A better): Newcombe |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
        *(
            f"| {r['shape']} | {r['n']} | {r['median_exact']:.1%} ({r['exact_median_level']:.1%}) | "
            f"{r['iqm_bootstrap']:.1%} | {r['mean_t']:.1%} | {r['bad_exact']:.1%} | {r['profile_dkw']:.1%} | "
            f"{r['p_better']:.1%} |"
            for r in result["shapes"]
        ),
        "",
        "| grid, failures follow the init seed | runs | gone wrong counted per run | per init seed |",
        "|---|--:|--:|--:|",
        *(f"| {g['grid']} | {g['runs']} | {g['per_run']:.1%} | {g['per_init_seed']:.1%} |" for g in result["grids"]),
    ]
    return "\n".join(lines)


def difference_cell(shape: str, truth: dict[str, Any], n: int, reps: int, rng: np.random.Generator) -> dict[str, Any]:
    """The paired-t and Welch intervals of A - B, both of the shape (true difference 1) and A of the shape
    against B of normal seeds ('a_only'), and the chi-square interval of the variance."""
    draw = SHAPES[shape]
    hits = dict.fromkeys(("paired_t", "welch", "paired_t_a_only", "welch_a_only", "variance_chi2"), 0)
    a_only = truth["mean"] + 1.0 - 75.0  # A of the shape against B of normal seeds N(75, 2)
    for _ in range(reps):
        a, b, normal_b = draw(rng, n) + 1.0, draw(rng, n), rng.normal(75.0, 2.0, n)
        for suffix, other, difference in (("", b, 1.0), ("_a_only", normal_b, a_only)):
            low, high = t_interval(a - other, CONFIDENCE)  # compare's paired interval: t over the slots' differences
            hits["paired_t" + suffix] += low <= difference <= high
            low, high = welch_interval(a, other, CONFIDENCE)
            hits["welch" + suffix] += low <= difference <= high
        v = variance_interval(b, CONFIDENCE)
        hits["variance_chi2"] += v["ci_low"] <= truth["variance"] <= v["ci_high"]
    return {"shape": shape, "n": n, **{k: v / reps for k, v in hits.items()}}


def _t3(sd: float) -> Draw:
    return lambda rng, n: sd * rng.standard_t(3, n) / math.sqrt(3.0)  # t3 has variance 3


def _failing(effect: Draw, share: float, drop: float) -> Draw:
    return lambda rng, n: effect(rng, n) - drop * (rng.random(n) < share)


# grid model -> (init effect, data effect, residual, true mean, true variances of init, data, residual)
GRID_MODELS: dict[str, tuple[Draw, Draw, Draw, float, tuple[float, float, float]]] = {
    "normal effects": (_normal(0, 2), _normal(0), _normal(0), 75.0, (4.0, 1.0, 1.0)),
    "t3 effects": (_t3(2), _t3(1), _t3(1), 75.0, (4.0, 1.0, 1.0)),
    "t3 effects, 20% of init seeds fail": (
        _failing(_t3(2), 0.2, 35.0),
        _t3(1),
        _t3(1),
        75.0 - 0.2 * 35.0,
        (4.0 + 0.2 * 0.8 * 35.0**2, 1.0, 1.0),
    ),
}


def grid_interval_cell(model: str, side: int, reps: int, rng: np.random.Generator) -> dict[str, Any]:
    """A side x side crossed grid: the crossed interval of the grand mean and each variance component's interval."""
    init_effect, data_effect, residual, mean, variances = GRID_MODELS[model]
    init, data = np.repeat(np.arange(side), side), np.tile(np.arange(side), side)
    hits = dict.fromkeys(("crossed_mean", "init_mls", "data_mls", "residual_chi2"), 0)
    for _ in range(reps):
        values = 75.0 + init_effect(rng, side)[init] + data_effect(rng, side)[data] + residual(rng, side * side)
        frame = pd.DataFrame({"init": init, "data": data, "value": values})
        low, high = crossed_mean_interval(frame, ["init", "data"], "value", CONFIDENCE)
        hits["crossed_mean"] += low <= mean <= high
        rows = grid_decomposition(frame, ["init", "data"], "value", CONFIDENCE)
        for key, row, truth in zip(("init_mls", "data_mls", "residual_chi2"), rows, variances):
            hits[key] += row["ci_low"] <= truth <= row["ci_high"]
    return {"grid": model, "side": side, "runs": side * side, **{k: v / reps for k, v in hits.items()}}


def run_differences(reps: int, seed: int, counts: tuple[int, ...], sides: tuple[int, ...]) -> dict[str, Any]:
    rng = np.random.default_rng(seed + 3)
    rows = []
    for shape, draw in SHAPES.items():
        truth = truths(draw)
        truth["variance"] = math.inf if shape in NO_VARIANCE else float(np.var(truth["sorted"]))
        for n in counts:
            rows.append(r := difference_cell(shape, truth, n, reps, rng))
            print(
                f"{shape[:30]:>30} n={n:<3} paired t {r['paired_t']:.1%} Welch {r['welch']:.1%} A alone: "
                f"paired t {r['paired_t_a_only']:.1%} Welch {r['welch_a_only']:.1%} variance {r['variance_chi2']:.1%}",
                flush=True,
            )
    grids = []
    for model in GRID_MODELS:
        for side in sides:
            grids.append(g := grid_interval_cell(model, side, reps, rng))
            print(
                f"{model:>36} {side}x{side} mean {g['crossed_mean']:.1%} init {g['init_mls']:.1%} "
                f"data {g['data_mls']:.1%} residual {g['residual_chi2']:.1%}",
                flush=True,
            )
    return {"differences": rows, "grid_intervals": grids}


def differences_markdown(result: dict[str, Any]) -> str:
    lines = [
        "| seeds | n | A - B: paired t | A - B: Welch | A alone of the shape: paired t | A alone: Welch | "
        "variance: chi-square |",
        "|---|--:|--:|--:|--:|--:|--:|",
        *(
            f"| {r['shape']} | {r['n']} | {r['paired_t']:.1%} | {r['welch']:.1%} | {r['paired_t_a_only']:.1%} | "
            f"{r['welch_a_only']:.1%} | {r['variance_chi2']:.1%} |"
            for r in result["differences"]
        ),
        "",
        "| crossed grid | runs | mean: crossed t | init variance: MLS | data variance: MLS | "
        "init:data+residual: chi-square |",
        "|---|--:|--:|--:|--:|--:|",
        *(
            f"| {g['grid']} | {g['runs']} | {g['crossed_mean']:.1%} | {g['init_mls']:.1%} | {g['data_mls']:.1%} | "
            f"{g['residual_chi2']:.1%} |"
            for g in result["grid_intervals"]
        ),
    ]
    return "\n".join(lines)
