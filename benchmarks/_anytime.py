"""Anytime quality: the best value found so far against wall time, over several search seeds.

A run's curve is a step function: at time t it is the best final value of the
trials completed by t (pruned and failed trials have none). Before its first
completed trial a run has nothing to show; for medians such a run counts as
the worst (the median is then defined once more than half the runs have a
value); the plot's band is the interquartile range over runs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np


def best_so_far(finished: Sequence[tuple[float, str, float | None]], direction: str) -> list[tuple[float, float]]:
    """(time, best value so far) at each time the best improved, from a run's finished trials."""
    better = (lambda a, b: a > b) if direction == "maximize" else (lambda a, b: a < b)
    curve: list[tuple[float, float]] = []
    for seconds, state, value in finished:
        finite = state == "COMPLETE" and value is not None and math.isfinite(value)
        if finite and (not curve or better(value, curve[-1][1])):
            curve.append((seconds, value))
    return curve


def value_at(curve: Sequence[tuple[float, float]], seconds: float) -> float | None:
    """The curve's value at `seconds` (None before its first point)."""
    value = None
    for when, best in curve:
        if when > seconds:
            break
        value = best
    return value


def time_to(curve: Sequence[tuple[float, float]], target: float, direction: str) -> float | None:
    """When the curve first reached `target` (None: never)."""
    for when, best in curve:
        if (best >= target) if direction == "maximize" else (best <= target):
            return when
    return None


def spread(values: Sequence[float | None], direction: str | None = None) -> dict[str, float | None]:
    """Median, min and max over runs. A missing value (None) counts as the worst: for a
    `direction`, the worse end of the values; without one (times: never reached), +inf.
    A median or bound that falls on a missing value is None."""
    worst = math.inf if direction in (None, "minimize") else -math.inf
    filled = sorted(worst if v is None else v for v in values)
    median = statistics.median(filled) if filled else worst
    low, high = (filled[0], filled[-1]) if filled else (worst, worst)
    return {key: (None if math.isinf(v) else v) for key, v in (("median", median), ("min", low), ("max", high))}


def metric_text(value: float | None, metric: str) -> str:
    """A metric's value as the tables print it: accuracies in percent, others to 4 places; "-" for none."""
    if value is None:
        return "-"
    return f"{100 * value:.2f}%" if metric.endswith("_acc") else f"{value:.4f}"


def spread_text(cell: dict[str, float | None], show: Any) -> str:
    """A `spread` cell as "median [min, max]", each value through `show`."""
    return f"{show(cell['median'])} [{show(cell['min'])}, {show(cell['max'])}]"


def grid_curves(
    curves: Sequence[Sequence[tuple[float, float]]], direction: str, grid: np.ndarray
) -> dict[str, np.ndarray]:
    """Median and interquartile range (25th, 75th percentile) of the runs' curves on `grid`;
    a run with no value yet counts as the worst, and a statistic that falls on one is NaN."""
    rows = np.array(
        [[np.nan if (v := value_at(curve, t)) is None else v for t in grid] for curve in curves], dtype=float
    )
    filled = np.where(np.isnan(rows), -np.inf if direction == "maximize" else np.inf, rows)
    stats = {"median": np.median(filled, axis=0)}
    for name, q in (("q25", 25), ("q75", 75)):  # "nearest": a run's own value, never a mean with an infinity
        stats[name] = np.percentile(filled, q, axis=0, method="nearest")
    stats = {name: np.where(np.isinf(values), np.nan, values) for name, values in stats.items()}
    return stats


def plot(
    curves: dict[str, list[list[tuple[float, float]]]],
    ends: dict[str, list[float]],
    direction: str,
    metric: str,
    title: str,
    path: Any,
) -> None:
    """Median best-so-far per method against wall time, interquartile band over seeds; written to `path`."""
    import matplotlib
    from matplotlib.figure import Figure

    horizon = max(max(seconds) for seconds in ends.values())
    grid = np.linspace(0.0, horizon, 400)
    figure = Figure(figsize=(7.5, 4.5), layout="constrained")
    axes = figure.add_subplot()
    for method, runs in curves.items():
        stats = grid_curves(runs, direction, grid)
        until = grid <= statistics.median(ends[method])  # draw each method to its median end
        (line,) = axes.plot(grid[until], stats["median"][until], label=method, drawstyle="steps-post")
        axes.fill_between(
            grid[until],
            stats["q25"][until],
            stats["q75"][until],
            color=line.get_color(),
            alpha=0.12,
            step="post",
            linewidth=0,
        )
    axes.set_xlabel("wall time (s)")
    axes.set_ylabel(f"best {metric} so far")
    axes.set_title(title, fontsize=9)
    axes.legend(title="median; band: 25th-75th percentile over seeds", fontsize=8, title_fontsize=8)
    axes.grid(alpha=0.3)
    with matplotlib.rc_context({"svg.hashsalt": "hfta-nas"}):
        figure.savefig(path, dpi=110)
