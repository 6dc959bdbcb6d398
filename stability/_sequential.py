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

import functools
import math
from collections.abc import Sequence

import numpy as np
from scipy.optimize import brentq
from scipy.special import betaln

ALPHA = 0.05
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
    with np.errstate(divide="ignore"):  # the cap is infinite at m = 0 (up) and m = 1 (down)
        up = np.minimum(predictable_bets(x, alpha * theta), truncation / grid)
        down = np.minimum(predictable_bets(x, alpha * (1 - theta)), truncation / (1 - grid))
    # capped bets keep every factor >= 1 - truncation > 0: the capital's logarithm is finite
    log_up = np.cumsum(np.log1p(up * (x - grid)), axis=1) + math.log(theta)
    log_down = np.cumsum(np.log1p(-down * (x - grid)), axis=1) + math.log(1 - theta)
    kept = np.maximum(log_up, log_down) <= math.log(1 / alpha)
    any_kept = kept.any(axis=0)
    first = np.argmax(kept, axis=0)
    last = len(grid) - 1 - np.argmax(kept[::-1], axis=0)
    step = 1 / breaks
    lower = np.where(any_kept, np.maximum(grid[first, 0] - step, 0.0), 0.0)
    upper = np.where(any_kept, np.minimum(grid[last, 0] + step, 1.0), 1.0)
    return np.maximum.accumulate(lower), np.minimum.accumulate(upper)


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


@functools.lru_cache(maxsize=4096)  # a function of n and alpha alone: each study size asks it again
def _largest_count_below_half(n: int, alpha: float) -> int | None:
    below = [k for k in range((n + 1) // 2) if bernoulli_cs(k, n, alpha)[1] < 0.5]
    return below[-1] if below else None


def running_median_cs(
    x: Sequence[float], alpha: float = ALPHA, lowest: float = 0.0, highest: float = 1.0
) -> tuple[float, float]:
    """`median_cs` intersected over every prefix of x: each holds at once, so their intersection does."""
    low, high = lowest, highest
    for t in range(1, len(x) + 1):
        a, b = median_cs(x[:t], alpha, lowest, highest)
        low, high = max(low, a), min(high, b)
    return low, high
