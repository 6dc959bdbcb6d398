"""Distribution-free figures of a seed study: they hold whatever shape the seeds take.

A seed study's values may be normal, heavy-tailed, or fall into two, three or more modes with
seeds between them. The t interval of the mean and any rule that first counts modes rest on a
guess about that shape; these figures do not:

- the median with its exact order-statistic interval (a binomial count, valid for any continuous
  distribution; its exact level is returned beside it, since n seeds allow only a few levels);
- the interquartile mean (IQM) with a stratified percentile bootstrap interval, as rliable
  computes it (Agarwal et al. 2021); its level is measured, not guaranteed (benchmarks/coverage.py);
- the performance profile: the share of seeds scoring above each threshold, with the
  Dvoretzky-Kiefer-Wolfowitz band (Massart's constant), simultaneous over every threshold;
- "gone wrong": a seed below a user threshold, or worse than the median by more than a relative
  margin; never "in the worse mode". In a grid, counted per independent unit (an init seed).

tests/test_stability_rliable.py checks the IQM, the bootstrap, the profile and the probability of
improvement against the rliable package.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from ._formats import FAIL_MARGIN

NAN = float("nan")
BOOTSTRAP_REPS = 2000  # rliable's default


def _as_1d(values: ArrayLike) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).reshape(-1)


# --------------------------------------------------------------------------- the median


def median_interval(values: ArrayLike, confidence: float = 0.95) -> dict[str, float]:
    """The median and its exact order-statistic interval [x_(k), x_(n+1-k)].

    The true median lies below x_(k) exactly when fewer than k values fall below it, which for any
    continuous distribution has the binomial(n, 1/2) probability P(B <= k - 1); so the interval
    covers it with probability 1 - 2 P(B <= k - 1) whatever the shape. k is the largest with a
    level of at least `confidence`; below 6 seeds no k reaches 95%, and the widest interval
    (the range, level 1 - 2^(1-n): 93.75% at n = 5) is returned. `level` is that exact level.
    """
    x = np.sort(_as_1d(values))
    n = x.size
    if n == 0:
        return {"median": NAN, "low": NAN, "high": NAN, "level": NAN}
    ks = np.arange(1, n // 2 + 1)
    levels = 1.0 - 2.0 * stats.binom.cdf(ks - 1, n, 0.5)
    reaching = np.flatnonzero(levels >= confidence)
    k = int(ks[reaching[-1]]) if reaching.size else 1
    level = float(levels[k - 1]) if ks.size else 0.0
    return {"median": float(np.median(x)), "low": float(x[k - 1]), "high": float(x[n - k]), "level": level}


# --------------------------------------------------------------------------- IQM and the stratified bootstrap


def iqm(scores: ArrayLike) -> float:
    """Interquartile mean of every score (runs x tasks flattened): the mean of the middle half,
    scipy's trim_mean(..., 0.25), as rliable's aggregate_iqm."""
    x = _as_1d(scores)
    return float(stats.trim_mean(x, 0.25)) if x.size else NAN


def iqm_of_resamples(resamples: np.ndarray) -> np.ndarray:
    """IQM of each resample in a batch (..., runs, tasks): the batched form `stratified_bootstrap` calls."""
    flat = resamples.reshape(*resamples.shape[:-2], -1)
    return stats.trim_mean(flat, 0.25, axis=-1)


def stratified_bootstrap(
    scores: ArrayLike,
    statistic: Callable[[np.ndarray], np.ndarray] = iqm_of_resamples,
    *,
    confidence: float = 0.95,
    reps: int = BOOTSTRAP_REPS,
    rng: np.random.Generator | np.random.RandomState | int = 0,
) -> tuple[float, float]:
    """Percentile interval of `statistic` over resamples that redraw the runs within each task
    (rliable's StratifiedBootstrap; a 1-D array is one task). `statistic` maps a batch of
    resamples (reps, runs, tasks) to reps values. Each replicate draws rng.choice(runs, (runs,
    tasks)), the draw rliable makes, so a legacy RandomState seeded as numpy's global one gives
    rliable's interval exactly."""
    x = np.asarray(scores, dtype=np.float64)
    x = x.reshape(-1, 1) if x.ndim == 1 else x
    runs, tasks = x.shape
    if runs < 2:
        return NAN, NAN
    rng = np.random.default_rng(rng) if isinstance(rng, int) else rng
    rows = rng.choice(runs, (reps, runs, tasks))
    values = statistic(x[rows, np.arange(tasks)])
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


# --------------------------------------------------------------------------- performance profiles


def dkw_half_width(n: int, confidence: float = 0.95) -> float:
    """Half-width of the Dvoretzky-Kiefer-Wolfowitz band with Massart's constant: the empirical
    distribution of n values lies within sqrt(log(2 / alpha) / (2 n)) of the true one at every
    point at once, with probability at least 1 - alpha, for any distribution."""
    return math.sqrt(math.log(2 / (1 - confidence)) / (2 * n)) if n > 0 else NAN


def profile_band(confidence: float = 0.95) -> str:
    """What the performance profile's band is, in the words of the plot's caption and every export."""
    return f"{confidence:.0%} DKW band (simultaneous over every threshold, any distribution)"


def performance_profile(values: ArrayLike, thresholds: ArrayLike, confidence: float = 0.95) -> dict[str, np.ndarray]:
    """The share of seeds scoring above each threshold (rliable's score distribution, run-wise),
    with the DKW band clipped to [0, 1]: share, low, high, one per threshold."""
    x, taus = _as_1d(values), _as_1d(thresholds)
    if x.size == 0:
        empty = np.full(taus.shape, NAN)
        return {"share": empty, "low": empty, "high": empty}
    share = np.mean(x[:, None] > taus[None, :], axis=0)
    half = dkw_half_width(x.size, confidence)
    return {"share": share, "low": np.clip(share - half, 0.0, 1.0), "high": np.clip(share + half, 0.0, 1.0)}


# --------------------------------------------------------------------------- gone wrong


def failure_cut(
    values: ArrayLike, *, higher_is_better: bool = True, below: float | None = None, margin: float = FAIL_MARGIN
) -> float:
    """The value past which a seed counts as gone wrong: the user's threshold when given, else the
    median moved by `margin` of its size towards worse (75% median, margin 0.1: below 67.5%)."""
    if below is not None:
        return float(below)
    x = _as_1d(values)
    if x.size == 0:
        return NAN
    median = float(np.median(x))
    return median - margin * abs(median) if higher_is_better else median + margin * abs(median)


def past_cut(values: ArrayLike, cut: float, higher_is_better: bool = True) -> np.ndarray:
    """Which values are worse than the cut (strictly)."""
    x = _as_1d(values)
    return x < cut if higher_is_better else x > cut


def wrong_units(wrong: ArrayLike, units: ArrayLike) -> tuple[int, int]:
    """(units with a run gone wrong, units): runs that share a unit (an init seed of a grid) are one
    independent observation, so the exact interval is taken over units, not runs. The share of units
    with any run gone wrong is at least the share of runs gone wrong, so its upper bound bounds both."""
    wrong = np.asarray(wrong, dtype=bool).reshape(-1)
    names, unit_of = np.unique(np.asarray(units).reshape(-1), return_inverse=True)
    hit = np.bincount(unit_of, weights=wrong, minlength=names.size) > 0
    return int(hit.sum()), int(names.size)


def describe_profile(values: ArrayLike, thresholds: ArrayLike, confidence: float = 0.95) -> list[dict[str, Any]]:
    """The profile as rows (threshold, share, low, high) for the report's frame."""
    figures = performance_profile(values, thresholds, confidence)
    return [
        {"threshold": float(t), "share": float(s), "low": float(lo), "high": float(hi)}
        for t, s, lo, hi in zip(_as_1d(thresholds), figures["share"], figures["low"], figures["high"])
    ]
