"""Anytime-valid confidence sequences: intervals that hold at every look at once.

A t interval is valid at one sample size fixed in advance; looked at after
every round of seeds and stopped when it is narrow (or when p < 0.05), it
misses far more often than its 5% (benchmarks/stopping.py measures how often).
A confidence sequence (CS) is a sequence of intervals that contains the truth
at every sample size simultaneously with probability 1 - alpha (Ville's
inequality on a nonnegative martingale), so a study may stop whenever it likes.

- `hedged_cs`: the mean of observations in [0, 1], with no other assumption on
  their shape: Waudby-Smith & Ramdas (2023, JRSS-B), hedged capital process
  with predictable plug-in bets, the construction and defaults of their
  `confseq.betting.hedged_cs` (theta 1/2, truncation 1/2, a grid of
  `breaks` candidate means, running intersection).
- `bernoulli_cs`: a rate from a count: Robbins' beta-binomial mixture
  martingale with a Jeffreys Beta(1/2, 1/2) mixing density (tight for rare
  events: 0 of 32 bounds the rate at 15%).
- `median_cs`: the median by inverting `bernoulli_cs` on the count of
  observations at or below each candidate: an order-statistic interval.

Each function takes the observations in the order they arrived (seed index
order), which must not depend on their values.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence

import numpy as np
from scipy.optimize import brentq
from scipy.special import betaln

ALPHA = 0.05
_CHUNK = 2048  # observations per pass of `hedged_cs`: its grid x chunk arrays stay near 16 MB at any size
_JEFFREYS = 0.5  # both parameters of the mixing Beta density of `bernoulli_cs`


def predictable_bets(x: np.ndarray, alpha: float) -> np.ndarray:
    """The bet placed before observation t sees x[t]: sqrt(2 log(1/alpha) / (sigma2 t log(1+t))),
    sigma2 the variance of x[:t] regularised by one fake observation of variance 1/4 at 1/2."""
    t = np.arange(1, len(x) + 1)
    mean = np.minimum((0.5 + np.cumsum(x)) / (t + 1), 1.0)
    variance = (0.25 + np.cumsum((x - mean) ** 2)) / (t + 1)
    before = np.concatenate([[0.25], variance[:-1]])  # only what was seen before x[t]
    return np.sqrt(2 * math.log(1 / alpha) / (t * np.log1p(t) * before))


def hedged_cs(
    x: Sequence[float], alpha: float = ALPHA, breaks: int = 1000, theta: float = 0.5, truncation: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds on the mean of x (each in [0, 1]) after each observation.

    A candidate mean m is rejected once the hedged capital max(theta K+, (1-theta) K-) of betting
    against it exceeds 1/alpha; K+ bets that the mean is above m, K- below. The CS is the grid
    of candidates not rejected, widened by one grid step (the true mean may lie between two)."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return np.zeros(0), np.zeros(0)
    if np.any((x < 0) | (x > 1)) or not np.all(np.isfinite(x)):
        raise ValueError("hedged_cs needs observations in [0, 1]")
    grid = np.arange(0, 1 + 1 / breaks, 1 / breaks)[:, None]
    bets_up, bets_down = predictable_bets(x, alpha * theta), predictable_bets(x, alpha * (1 - theta))
    log_up, log_down = np.full_like(grid, math.log(theta)), np.full_like(grid, math.log(1 - theta))
    lower, upper = [], []
    for start in range(0, len(x), _CHUNK):  # the capital carried from chunk to chunk
        part = slice(start, start + _CHUNK)
        with np.errstate(divide="ignore"):  # the cap is infinite at m = 0 (up) and m = 1 (down)
            up = np.minimum(bets_up[part], truncation / grid)
            down = np.minimum(bets_down[part], truncation / (1 - grid))
        # capped bets keep every factor >= 1 - truncation > 0: the capital's logarithm is finite
        steps_up = np.cumsum(np.log1p(up * (x[part] - grid)), axis=1) + log_up
        steps_down = np.cumsum(np.log1p(-down * (x[part] - grid)), axis=1) + log_down
        log_up, log_down = steps_up[:, -1:], steps_down[:, -1:]
        low, high = _kept_range(grid[:, 0], np.maximum(steps_up, steps_down) <= math.log(1 / alpha))
        lower.append(low)
        upper.append(high)
    return np.maximum.accumulate(np.concatenate(lower)), np.minimum.accumulate(np.concatenate(upper))


def _kept_range(grid: np.ndarray, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per observation (column), the lowest and highest candidates kept, widened by one grid step
    (the true mean may lie between two); [0, 1] where none is kept."""
    step = grid[1] - grid[0]
    any_kept = kept.any(axis=0)
    first = np.argmax(kept, axis=0)
    last = len(grid) - 1 - np.argmax(kept[::-1], axis=0)
    lower = np.where(any_kept, np.maximum(grid[first] - step, 0.0), 0.0)
    upper = np.where(any_kept, np.minimum(grid[last] + step, 1.0), 1.0)
    return lower, upper


def bernoulli_cs(successes: int, trials: int, alpha: float = ALPHA) -> tuple[float, float]:
    """The rate's bounds after `successes` of `trials`: every p whose beta-binomial mixture
    martingale (marginal likelihood over the Jeffreys prior / likelihood at p) stays below 1/alpha."""
    if trials == 0:
        return 0.0, 1.0
    # the Jeffreys prior is symmetric: the upper bound on the rate is 1 - the lower bound on its complement
    return _lower_rate(successes, trials, alpha), 1 - _lower_rate(trials - successes, trials, alpha)


def _lower_rate(successes: int, trials: int, alpha: float) -> float:
    if successes == 0:
        return 0.0  # the wealth against p falls as p falls to 0, so nothing below the centre is rejected
    a = b = _JEFFREYS
    evidence = betaln(a + successes, b + trials - successes) - betaln(a, b)
    excess = lambda p: (  # noqa: E731 (the log wealth against p, less log(1/alpha))
        evidence - successes * math.log(p) - (trials - successes) * math.log1p(-p) - math.log(1 / alpha)
    )
    centre = successes / trials  # the wealth's minimum, always below 1/alpha (a marginal < its maximum)
    top = min(centre, 1 - 1e-15)  # log(1 - p) is -inf at p = 1
    return brentq(excess, 1e-300, top) if excess(1e-300) > 0 else 0.0


def median_cs(
    x: Sequence[float], alpha: float = ALPHA, lowest: float = 0.0, highest: float = 1.0
) -> tuple[float, float]:
    """Bounds on the median after the observations x, anywhere in [lowest, highest].

    v lies surely below the median when the rate P(X <= v) is bounded below 1/2 (each side at
    alpha/2). The count at or below v only grows with v and the bound only grows with the count,
    so the rejected v are those below the (k+1)-th smallest observation, k the largest count
    whose upper bound is below 1/2; by symmetry the upper bound is the (k+1)-th largest."""
    values = np.sort(np.asarray(x, dtype=np.float64))
    n = len(values)
    k = _largest_count_below_half(n, alpha / 2)
    if k is None:
        return lowest, highest
    return float(values[k]), float(values[n - 1 - k])


@functools.cache  # a function of n and alpha alone: each round asks again for every smaller n
def _largest_count_below_half(n: int, alpha: float) -> int | None:
    """The largest k < n/2 whose upper bound on the rate after k of n is below 1/2; the bound grows
    with k, so a bisection finds it."""
    below_half = lambda k: bernoulli_cs(k, n, alpha)[1] < 0.5  # noqa: E731 (the bisection's test)
    if n == 0 or not below_half(0):
        return None
    low, high = 0, (n + 1) // 2  # below_half(low) holds; the answer lies in [low, high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if below_half(middle) else (low, middle)
    return low


def running_median_cs(
    x: Sequence[float], alpha: float = ALPHA, lowest: float = 0.0, highest: float = 1.0
) -> tuple[float, float]:
    """`median_cs` after every prefix of x, intersected: each holds at once, so their intersection does."""
    seen: list[float] = []  # the prefix, sorted
    low, high = lowest, highest
    for value in x:
        bisect.insort(seen, float(value))
        k = _largest_count_below_half(len(seen), alpha / 2)
        if k is not None:
            low, high = max(low, seen[k]), min(high, seen[len(seen) - 1 - k])
    return low, high
