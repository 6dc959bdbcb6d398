"""The statistics of a seed-stability study: pure functions over 1-D arrays.

Everything scipy already does (t and chi-square intervals, BCa bootstrap,
Welch and Mann-Whitney tests, Shapiro-Wilk, trimmed means, noncentral t,
root finding) is called, not rewritten; what is written here is what scipy
lacks: expected best-of-k, Almost Stochastic Order, Holm's adjustment, power
for seeds, and variance decompositions. Every function takes plain numbers
and returns plain numbers (floats, lists, dicts), so `_analysis` only has to
arrange them into frames, and each figure can be checked on its own.

Degenerate input (no values, one value, all values equal) never raises: a
figure that is undefined there is NaN, and scipy's warnings about it are
silenced because the NaN already says so.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy import optimize, stats

from . import _robust

NAN = float("nan")
# The interval of the mean is Student's t. benchmarks/coverage.py measures it at 92.7-96.2% for
# a nominal 95% from 5 seeds on normal, skewed (gamma 4) and heavy-tailed (t, 3 df) data, where
# BCa under-covers (83% at n = 5 on normal data); it collapses on mixtures of modes and on a tail
# of bad seeds (42-84% at n = 5, benchmarks/results/coverage_shapes.json), which is why the report
# leads with the median's exact interval (`_robust`) and labels this one. Below this many seeds
# its level rests on normality alone, and the report says so.
FEW_SEEDS = 5

# The mode rule (find_modes): a study splits into two modes when the widest gap between its
# sorted values is at least MODE_GAP_FLOOR within-mode standard deviations and beyond the
# MODE_LEVEL quantile of that statistic on normal samples of the same size. Measured false-
# positive rates on unimodal data and detection rates on mixtures are in benchmarks/coverage.py
# and docs/stability.md; the floor keeps heavy-tailed unimodal studies from splitting too often.
MODE_GAP_FLOOR = 5.0
MODE_LEVEL = 0.99
MIN_SEEDS_FOR_MODES = 4


def _as_1d(values: ArrayLike) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).reshape(-1)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Ignore degenerate-data warnings and numpy float errors; the caller returns NaN for those cases."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UserWarning)  # e.g. shapiro's "range zero"
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        yield


# --------------------------------------------------------------------------- intervals


def t_interval(values: ArrayLike, confidence: float = 0.95) -> tuple[float, float]:
    """Student-t interval for the mean; collapses to the mean when every value is equal (zero sem)."""
    x = _as_1d(values)
    if x.size < 2:
        return NAN, NAN
    mean, sem = float(np.mean(x)), float(stats.sem(x))
    if sem == 0.0:
        return mean, mean
    low, high = stats.t.interval(confidence, x.size - 1, loc=mean, scale=sem)
    return float(low), float(high)


def headline_interval(values: ArrayLike, confidence: float = 0.95) -> dict[str, Any]:
    """The interval of the mean in the summary's ci_* columns: t (see FEW_SEEDS), and whether n is too small
    to trust its level. The headline leads with the median's exact interval instead."""
    low, high = t_interval(values, confidence)
    return {"ci_low": low, "ci_high": high, "ci_method": "t", "few_seeds": _as_1d(values).size < FEW_SEEDS}


def bootstrap_interval(
    samples: Sequence[ArrayLike],
    statistic: Callable[..., Any],
    *,
    confidence: float = 0.95,
    seed: int = 0,
    n_resamples: int = 9999,
) -> tuple[float, float]:
    """BCa interval of `statistic(*samples, axis=-1)` from scipy.stats.bootstrap, reproducible from `seed`.

    When every resample gives the same value (all values equal, fully separated samples)
    BCa's acceleration is 0/0 and scipy returns NaN; the interval is then that one value,
    which is what any bootstrap interval of a distribution without spread is.
    """
    data = tuple(_as_1d(s) for s in samples)
    if any(s.size < 2 for s in data):
        return NAN, NAN
    with _quiet():
        result = stats.bootstrap(
            data,
            statistic,
            method="BCa",
            confidence_level=confidence,
            n_resamples=n_resamples,
            rng=np.random.default_rng(seed),
        )
    low, high = (float(v) for v in result.confidence_interval)
    spread = result.bootstrap_distribution
    if (math.isnan(low) or math.isnan(high)) and np.ptp(spread) == 0:
        return float(spread[0]), float(spread[0])
    return low, high


# --------------------------------------------------------------------------- one sample


def expected_best_of_k(values: ArrayLike, k: int) -> float:
    """Expected maximum of k draws *without replacement* from the sample (exact, no simulation).

    Sort the sample, x_(1) <= ... <= x_(n). The best of k draws is at most x_(i) exactly when
    all k draws fall among the i smallest, which has the hypergeometric probability
    C(i, k) / C(n, k). So P(best = x_(i)) = [C(i, k) - C(i-1, k)] / C(n, k) = C(i-1, k-1) / C(n, k) and

        E[best of k] = sum_i x_(i) * C(i-1, k-1) / C(n, k).

    k = 1 gives the mean, k = n the maximum. This is the "expected validation performance"
    of Dodge et al. (2019) for a budget of k seeds, but drawn without replacement, since a
    seed cannot be trained twice. scipy's hypergeom keeps the binomials finite for large n.
    """
    x = np.sort(_as_1d(values))
    n = x.size
    if not 1 <= k <= n:
        return NAN
    at_most = stats.hypergeom.pmf(k, n, np.arange(n + 1), k)  # P(best <= x_(i)), i = 0..n
    # An expectation of sample values lies within their range; clipping removes the
    # rounding of the weighted sum (e.g. 0.9000000000000001 for a constant sample).
    return float(np.clip(np.dot(np.diff(at_most), x), x[0], x[-1]))


def best_of_k(values: ArrayLike) -> dict[int, float]:
    """Expected best of k seeds for k = 1, 2, 4, 8, ... up to the sample size."""
    n = _as_1d(values).size
    ks = [2**j for j in range(n.bit_length())] if n else []
    return {k: expected_best_of_k(values, k) for k in ks}


def tukey_outliers(values: ArrayLike) -> list[int]:
    """Positions of values outside Tukey's fences [q1 - 1.5 iqr, q3 + 1.5 iqr]."""
    x = _as_1d(values)
    if x.size == 0:
        return []
    q1, q3 = np.quantile(x, [0.25, 0.75])
    low, high = q1 - 1.5 * (q3 - q1), q3 + 1.5 * (q3 - q1)
    return [int(i) for i in np.flatnonzero((x < low) | (x > high))]


def noise_floor_std(accuracy: float, n_test: int | None) -> float:
    """Std of an accuracy measured on n_test examples from test-set sampling alone: sqrt(p(1-p)/n_test).

    It is how far one seed's test accuracy may sit from its accuracy on the population the test
    set was drawn from. It is not a floor on seed-to-seed differences: every seed is scored on the
    same test set, so their differences do not contain this error. The variance ratio sets the
    seed-to-seed variance beside it.
    """
    if not n_test or n_test <= 0 or not math.isfinite(accuracy):
        return NAN
    return math.sqrt(accuracy * (1.0 - accuracy) / n_test)


# --------------------------------------------------------------------------- modes and failures


def studentized_gaps(sorted_values: np.ndarray) -> np.ndarray:
    """For each split of sorted values into a low and a high group: the gap between them divided
    by the pooled within-group standard deviation (n - 2 degrees of freedom). Works on the last
    axis, so a batch of simulated samples is one call; a split with no spread on either side and a
    gap gives inf, one without a gap NaN."""
    x = np.asarray(sorted_values, dtype=np.float64)
    n = x.shape[-1]
    sums, squares = np.cumsum(x, axis=-1), np.cumsum(x**2, axis=-1)
    low_size = np.arange(1, n)
    low_sum, low_squares = sums[..., :-1], squares[..., :-1]
    high_sum, high_squares = sums[..., -1:] - low_sum, squares[..., -1:] - low_squares
    within = (low_squares - low_sum**2 / low_size) + (high_squares - high_sum**2 / (n - low_size))
    with np.errstate(all="ignore"):
        spread = np.sqrt(np.maximum(within, 0.0) / (n - 2))
        # sums of squares by cumulative sums leave rounding noise where the spread is truly zero
        spread = np.where(spread <= 1e-12 * np.maximum(np.abs(x[..., -1:]), 1.0), 0.0, spread)
        return np.diff(x, axis=-1) / spread


@functools.cache
def mode_threshold(n: int) -> float:
    """The studentized gap above which n values split into two modes: the MODE_LEVEL quantile of
    the widest studentized gap of n normal values (20,000 seeded samples; past 64 seeds the
    quantile is far below the floor, so 64 stands for every larger n), and never below MODE_GAP_FLOOR."""
    if n < MIN_SEEDS_FOR_MODES:
        return math.inf
    size = min(n, 64)
    samples = np.sort(np.random.default_rng(20240528).normal(size=(20_000, size)), axis=-1)
    widest = np.nanmax(studentized_gaps(samples), axis=-1)
    return max(float(np.quantile(widest, MODE_LEVEL)), MODE_GAP_FLOOR)


def find_modes(values: ArrayLike, higher_is_better: bool = True) -> dict[str, Any]:
    """Split the values at their widest studentized gap when it passes `mode_threshold`.

    Returns modes (1 or 2), the statistic and threshold, and the positions (into `values`) of the
    good and the worse mode: the worse mode is the one on the metric's wrong side (lower for an
    accuracy, higher for a loss), whatever its size. One mode: every position is good, none worse.
    At most two modes are reported: a third would need more seeds than studies usually have.
    """
    x = _as_1d(values)
    everything = {"modes": 1, "mode_stat": NAN, "mode_threshold": mode_threshold(x.size)}
    if x.size < MIN_SEEDS_FOR_MODES:
        return {**everything, "good": list(range(x.size)), "worse": []}
    order = np.argsort(x, kind="stable")
    gaps = studentized_gaps(x[order])
    if np.all(np.isnan(gaps)):  # every value equal
        return {**everything, "good": list(range(x.size)), "worse": []}
    split = int(np.nanargmax(gaps))
    everything["mode_stat"] = float(gaps[split])
    if not gaps[split] >= everything["mode_threshold"]:
        return {**everything, "good": list(range(x.size)), "worse": []}
    low, high = sorted(order[: split + 1].tolist()), sorted(order[split + 1 :].tolist())
    good, worse = (high, low) if higher_is_better else (low, high)
    return {**everything, "modes": 2, "good": good, "worse": worse}


def clopper_pearson(successes: float, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) two-sided interval for a binomial proportion, from beta quantiles,
    as scipy's binomtest(...).proportion_ci(method="exact"). A non-integer count (ties counted
    half) takes the same formula, the beta quantile being continuous in its parameters."""
    if trials <= 0:
        return NAN, NAN
    tail = (1 - confidence) / 2
    low = 0.0 if successes <= 0 else float(stats.beta.ppf(tail, successes, trials - successes + 1))
    high = 1.0 if successes >= trials else float(stats.beta.ppf(1 - tail, successes + 1, trials - successes))
    return low, high


def clopper_pearson_upper(successes: int, trials: int, confidence: float = 0.95) -> float:
    """One-sided exact upper bound: the largest rate still consistent with the count at `confidence`.
    0 of n gives 1 - (1 - confidence)^(1/n): 0 of 8 at 95% is 31%."""
    if trials <= 0:
        return NAN
    return 1.0 if successes >= trials else float(stats.beta.ppf(confidence, successes + 1, trials - successes))


def failure_rate(bad: int, total: int, confidence: float = 0.95) -> dict[str, Any]:
    """How often a seed goes wrong: bad of total, the share, its exact two-sided interval and
    one-sided upper bound (what "0 of 8 went wrong" still allows)."""
    low, high = clopper_pearson(bad, total, confidence)
    return {
        "bad_n": int(bad),
        "bad_of": int(total),
        "bad_rate": bad / total if total else NAN,
        "bad_low": low,
        "bad_high": high,
        "bad_upper": clopper_pearson_upper(bad, total, confidence),
    }


def seeds_to_see_failure(rate: float, probability: float = 0.9) -> float:
    """Seeds needed to see at least one failure of a kind that hits a share `rate` of seeds with
    `probability`: the smallest n with 1 - (1 - rate)^n >= probability (a 1-in-10 failure with
    90% probability: 22 seeds)."""
    if not (0 < rate <= 1 and 0 < probability < 1):
        return NAN
    if rate == 1:
        return 1
    n = math.ceil(math.log1p(-probability) / math.log1p(-rate))
    return n - 1 if n > 1 and 1 - (1 - rate) ** (n - 1) >= probability else n  # guard the logs' rounding


def compare_rates(bad_a: int, of_a: int, bad_b: int, of_b: int) -> float:
    """Two-sided Fisher's exact p-value for a difference between two failure rates (NaN without seeds)."""
    if of_a <= 0 or of_b <= 0:
        return NAN
    table = [[bad_a, of_a - bad_a], [bad_b, of_b - bad_b]]
    return float(stats.fisher_exact(table, alternative="two-sided").pvalue)


def compare_paired_rates(bad_a: ArrayLike, bad_b: ArrayLike) -> dict[str, Any]:
    """McNemar's exact test of a difference between two failure rates when the seeds are paired
    (bad_a[i] and bad_b[i]: whether slot i went wrong under A and under B, same seeds).

    Only the discordant slots (wrong under one configuration, right under the other) carry
    information; under no difference each is equally likely to go either way, so the count of
    A-only slots is binomial(discordant, 1/2): an exact two-sided binomial test. Fisher's test
    treats the two columns as independent samples and, with shared seeds, is conservative.
    No discordant slot: p = 1 (nothing speaks for a difference)."""
    a, b = np.asarray(bad_a, dtype=bool).reshape(-1), np.asarray(bad_b, dtype=bool).reshape(-1)
    if a.size != b.size:
        raise ValueError(f"compare_paired_rates needs as many slots of A as of B, got {a.size} and {b.size}.")
    a_only, b_only = int(np.sum(a & ~b)), int(np.sum(b & ~a))
    discordant = a_only + b_only
    p = float(stats.binomtest(a_only, discordant, 0.5).pvalue) if discordant else (1.0 if a.size else NAN)
    return {"a_only_bad": a_only, "b_only_bad": b_only, "bad_rate_p": p}


def mode_follows_levels(worse: ArrayLike, levels: ArrayLike) -> dict[str, Any]:
    """Whether the worse-mode runs crowd into some levels of one seed source (e.g. a few init seeds
    of a grid), by an exact permutation test: how often the worse runs, placed at random among all
    runs (the grid's margins kept), would be at least as concentrated. Concentration is
    sum over levels of worse_in_level^2 / runs_in_level (the chi-square statistic of the
    levels x {worse, good} table, up to constants, when the margins are fixed). Its null
    distribution is the multivariate hypergeometric of the per-level counts, summed exactly level by
    level (Fisher-Freeman-Halton's test with this statistic); Fraction keys keep ties exact.

    Returns worse_n, runs, levels, levels_with_worse and p (1 when fewer than two runs are worse:
    one run cannot crowd anywhere; NaN without runs)."""
    from fractions import Fraction

    worse = np.asarray(worse, dtype=bool).reshape(-1)
    names, level_of = np.unique(np.asarray(levels).reshape(-1), return_inverse=True)
    sizes = np.bincount(level_of, minlength=names.size)
    counts = np.bincount(level_of, weights=worse, minlength=names.size).astype(int)
    w, n = int(worse.sum()), int(worse.size)
    row = {"worse_n": w, "runs": n, "levels": int(names.size), "levels_with_worse": int(np.sum(counts > 0))}
    if n == 0:
        return {**row, "p": NAN}
    if w < 2 or w == n:
        return {**row, "p": 1.0}
    observed = sum(Fraction(int(c) ** 2, int(m)) for c, m in zip(counts, sizes))
    ways: dict[tuple[int, Fraction], int] = {(0, Fraction(0)): 1}  # (worse placed so far, statistic) -> count
    for m in sizes.tolist():
        following: dict[tuple[int, Fraction], int] = {}
        for (placed, statistic), count in ways.items():
            for c in range(min(m, w - placed) + 1):
                key = (placed + c, statistic + Fraction(c * c, m))
                following[key] = following.get(key, 0) + count * math.comb(m, c)
        ways = following
    extreme = sum(count for (placed, statistic), count in ways.items() if placed == w and statistic >= observed)
    return {**row, "p": extreme / math.comb(n, w)}


def summarize(
    values: ArrayLike,
    *,
    n_failed: int = 0,
    n_test: int | None = None,
    is_accuracy: bool = True,
    higher_is_better: bool = True,
    fail_below: float | None = None,
    fail_margin: float = _robust.FAIL_MARGIN,
    confidence: float = 0.95,
    bootstrap_seed: int = 0,
    n_resamples: int = 9999,
) -> dict[str, Any]:
    """Every figure of one row of `Analysis.summary` (without config/design/metric/headline), over completed seeds.

    `outliers` and `worse_mode_seeds` are lists of positions into `values` and `best_of_k` a dict
    {k: expected best}; the analysis turns them into the report's strings. The noise floor and
    variance ratio are only defined for accuracies measured on `n_test` examples. A seed "went
    wrong" (bad_*) when it failed or is worse than the cut: `fail_below` when given, else the
    median moved by `fail_margin` of its size (`_robust.failure_cut`). Modes describe the values;
    no interval rests on them.
    """
    x = _as_1d(values)
    n = int(x.size)
    row: dict[str, Any] = {"n": n, "n_failed": int(n_failed)}
    with _quiet():
        mean = float(np.mean(x)) if n else NAN
        std = float(np.std(x, ddof=1)) if n >= 2 else NAN
        q1, median, q3 = (float(q) for q in np.quantile(x, [0.25, 0.5, 0.75])) if n else (NAN, NAN, NAN)
        ci_t = t_interval(x, confidence)
        ci_bca = bootstrap_interval([x], np.mean, confidence=confidence, seed=bootstrap_seed, n_resamples=n_resamples)
        exact = _robust.median_interval(x, confidence)
        iqm_low, iqm_high = _robust.stratified_bootstrap(x, confidence=confidence, reps=n_resamples, rng=bootstrap_seed)
        normal = stats.shapiro(x) if n >= 3 and np.ptp(x) > 0 else None
        row.update(
            mean=mean,
            std=std,
            sem=float(stats.sem(x)) if n >= 2 else NAN,
            **headline_interval(x, confidence),
            ci_t_low=ci_t[0],
            ci_t_high=ci_t[1],
            ci_bca_low=ci_bca[0],
            ci_bca_high=ci_bca[1],
            median=median,
            median_low=exact["low"],
            median_high=exact["high"],
            median_level=exact["level"],
            q1=q1,
            q3=q3,
            iqr=q3 - q1,
            iqm=_robust.iqm(x),
            iqm_low=iqm_low,
            iqm_high=iqm_high,
            min=float(np.min(x)) if n else NAN,
            max=float(np.max(x)) if n else NAN,
            range=float(np.ptp(x)) if n else NAN,
            cv=std / mean if n >= 2 and mean != 0 else NAN,
            normality_stat=float(normal.statistic) if normal else NAN,
            normality_p=float(normal.pvalue) if normal else NAN,
        )
    outliers = tukey_outliers(x)
    floor = noise_floor_std(mean, n_test) if is_accuracy else NAN
    row.update(
        n_outliers=len(outliers),
        outliers=outliers,
        best_of_k=best_of_k(x),
        noise_floor_std=floor,
        variance_ratio=std**2 / floor**2 if floor > 0 else NAN,
    )
    row.update(describe_modes(x, higher_is_better))
    cut = _robust.failure_cut(x, higher_is_better=higher_is_better, below=fail_below, margin=fail_margin)
    past = int(np.sum(_robust.past_cut(x, cut, higher_is_better)))
    row.update(bad_failed=int(n_failed), bad_below=past, bad_cut=cut, bad_unit="seed")
    row.update(failure_rate(int(n_failed) + past, n + int(n_failed), confidence))
    return row


def describe_modes(x: np.ndarray, higher_is_better: bool) -> dict[str, Any]:
    """The summary's mode fields, a description of the values' shape (each mode's size, mean and
    spread; the worse mode's positions): no bound of the report is computed from them."""
    modes = find_modes(x, higher_is_better)
    good, worse = x[modes["good"]], x[modes["worse"]]
    with _quiet():
        return {
            "modes": modes["modes"],
            "mode_stat": modes["mode_stat"],
            "mode_threshold": modes["mode_threshold"],
            "good_mode_n": int(good.size),
            "good_mode_mean": float(np.mean(good)) if good.size else NAN,
            "good_mode_std": float(np.std(good, ddof=1)) if good.size >= 2 else NAN,
            "worse_mode_n": int(worse.size),
            "worse_mode_mean": float(np.mean(worse)) if worse.size else NAN,
            "worse_mode_std": float(np.std(worse, ddof=1)) if worse.size >= 2 else NAN,
            "worse_mode_seeds": modes["worse"],
        }


# --------------------------------------------------------------------------- two samples


def prob_greater(a: ArrayLike, b: ArrayLike, axis: int = -1) -> np.ndarray:
    """P(A > B) + 0.5 P(A = B) over all pairs: the Mann-Whitney U of `a` divided by n_a n_b.

    Vectorised along `axis` so scipy.stats.bootstrap can resample it in batches.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    with _quiet():
        u = stats.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic", axis=axis).statistic
    return u / (a.shape[axis] * b.shape[axis])


def prob_greater_interval(a: ArrayLike, b: ArrayLike, confidence: float = 0.95) -> tuple[float, float]:
    """Newcombe's (2006, method 5) score interval for theta = P(A > B) + 0.5 P(A = B).

    Like Wilson's interval for a proportion it inverts a test whose variance is a function of
    theta itself (Hanley and McNeil's, with exponential-shaped placements), so it stays inside
    [0, 1] and does not collapse when the samples separate completely: 3 seeds against 3 with
    every A above every B give [0.50, 1] (a bootstrap gives [1, 1]). Checked against the published
    example of the SingleCaseES package; its level is measured in benchmarks/coverage.py.
    """
    a, b = _as_1d(a), _as_1d(b)
    m, n = a.size, b.size
    if m == 0 or n == 0:
        return NAN, NAN
    theta = float(prob_greater(a, b))
    z2 = stats.norm.ppf(0.5 + confidence / 2) ** 2
    half_n = (m + n) / 2.0  # Newcombe's N: both m - 1 and n - 1 of Hanley and McNeil become N - 1

    def excess(t: float) -> float:  # (theta_hat - t)^2 - z^2 var(t): zero at the interval's ends
        variance = t * (1 - t) * (1 + (half_n - 1) * ((1 - t) / (2 - t) + t / (1 + t))) / (m * n)
        return (theta - t) ** 2 - z2 * variance

    # theta itself is inside (excess < 0 there), except at 0 or 1 where the variance vanishes:
    # then the search starts just inside, where it is negative again.
    inside_low, inside_high = min(theta, 1.0 - 1e-9), max(theta, 1e-9)
    low = 0.0 if theta <= 0.0 or excess(0.0) <= 0 else optimize.brentq(excess, 0.0, inside_low)
    high = 1.0 if theta >= 1.0 or excess(1.0) <= 0 else optimize.brentq(excess, inside_high, 1.0)
    return float(low), float(high)


def cohen_d(a: ArrayLike, b: ArrayLike) -> float:
    """(mean_a - mean_b) / pooled sd, the pooled variance weighting each sample by its degrees of freedom."""
    a, b = _as_1d(a), _as_1d(b)
    if a.size + b.size < 3 or a.size == 0 or b.size == 0:
        return NAN
    ss = (a.size - 1) * np.var(a, ddof=1 if a.size > 1 else 0) + (b.size - 1) * np.var(b, ddof=1 if b.size > 1 else 0)
    pooled = math.sqrt(ss / (a.size + b.size - 2))
    return float((np.mean(a) - np.mean(b)) / pooled) if pooled > 0 else NAN


def compare(
    a: ArrayLike,
    b: ArrayLike,
    *,
    confidence: float = 0.95,
    bootstrap_seed: int = 0,
    higher_is_better: bool = True,
    aso_confidence: float | None = None,
) -> dict[str, float]:
    """Every figure of one row of `Analysis.comparisons`: is configuration A better than B?

    Welch's t-test does not assume equal variances; Mann-Whitney and the effect sizes built on
    it do not assume normality; ASO compares the whole distributions. The directional figures
    read "A better than B" for the metric's direction (`higher_is_better=False` for a loss):
    Cohen's d and Cliff's delta are positive when A is better, `p_a_better` is P(A > B) for a
    metric to maximise and P(A < B) for one to minimise (ties count half) with Newcombe's
    interval, and ASO's epsilon_min is below 0.5 when A tends to be better, at
    `aso_confidence` (default `confidence`; a family of pairs raises it, see `_analysis`).
    `mean_diff` and `welch_t` keep the raw sign of A - B.
    """
    a, b = _as_1d(a), _as_1d(b)
    row = dict.fromkeys(
        (
            "mean_diff",
            "welch_t",
            "welch_p",
            "mwu_u",
            "mwu_p",
            "cohen_d",
            "cliff_delta",
            "p_a_better",
            "p_a_better_low",
            "p_a_better_high",
            "aso_eps_min",
        ),
        NAN,
    )
    if a.size == 0 or b.size == 0:
        return row
    with _quiet():
        welch = stats.ttest_ind(a, b, equal_var=False)
        mwu = stats.mannwhitneyu(a, b, alternative="two-sided")
    better_a, better_b = (a, b) if higher_is_better else (-a, -b)
    p = float(prob_greater(better_a, better_b))
    low, high = prob_greater_interval(better_a, better_b, confidence)
    row.update(
        mean_diff=float(np.mean(a) - np.mean(b)),
        welch_t=float(welch.statistic),
        welch_p=float(welch.pvalue),
        mwu_u=float(mwu.statistic),
        mwu_p=float(mwu.pvalue),
        cohen_d=cohen_d(better_a, better_b),
        cliff_delta=2.0 * p - 1.0,
        p_a_better=p,
        p_a_better_low=low,
        p_a_better_high=high,
        aso_eps_min=aso_epsilon_min(better_a, better_b, confidence=aso_confidence or confidence, seed=bootstrap_seed),
    )
    return row


def compare_paired(
    a: ArrayLike, b: ArrayLike, *, confidence: float = 0.95, higher_is_better: bool = True
) -> dict[str, float]:
    """Paired figures for seeds shared slot for slot (a[i] and b[i] trained with the same seeds):
    the mean difference A - B over the pairs (`paired_mean_diff`, the point of the paired
    interval: both are computed on the same pairs), the paired t-test and its interval, the Wilcoxon signed-rank
    test, and P(A better) over the pairs (ties half) with its exact Clopper-Pearson interval.

    Sharing seeds makes the two runs of a slot alike (same initialisation, same batches), so the
    differences vary less than two independent samples would: independent-sample tests (Welch,
    Mann-Whitney) ignore that and lose power, and their intervals are wider than they need be.
    """
    a, b = _as_1d(a), _as_1d(b)
    row = dict.fromkeys(
        (
            "n_pairs",
            "paired_mean_diff",
            "paired_diff_std",
            "paired_diff_low",
            "paired_diff_high",
            "paired_t",
            "paired_t_p",
            "wilcoxon_w",
            "wilcoxon_p",
        ),
        NAN,
    )
    row.update(dict.fromkeys(("p_a_better_pairs", "p_a_better_pairs_low", "p_a_better_pairs_high"), NAN))
    if a.size != b.size:
        raise ValueError(f"compare_paired needs as many values of A as of B, got {a.size} and {b.size}.")
    row["n_pairs"] = a.size
    if a.size == 0:
        return row
    diff = a - b
    row["paired_mean_diff"] = float(np.mean(diff))
    with _quiet():
        if a.size >= 2:
            row["paired_diff_std"] = float(np.std(diff, ddof=1))
            paired = stats.ttest_rel(a, b)
            low, high = t_interval(diff, confidence)
            row.update(paired_t=float(paired.statistic), paired_t_p=float(paired.pvalue))
            row.update(paired_diff_low=low, paired_diff_high=high)
        if np.any(diff != 0):
            signed = stats.wilcoxon(a, b, zero_method="wilcox")
            row.update(wilcoxon_w=float(signed.statistic), wilcoxon_p=float(signed.pvalue))
    better = diff if higher_is_better else -diff
    wins = float(np.sum(better > 0) + 0.5 * np.sum(better == 0))
    low, high = clopper_pearson(wins, a.size, confidence)
    row.update(p_a_better_pairs=wins / a.size, p_a_better_pairs_low=low, p_a_better_pairs_high=high)
    return row


def welch_interval(a: ArrayLike, b: ArrayLike, confidence: float = 0.95) -> tuple[float, float]:
    """Welch's interval for mean(A) - mean(B) (independent samples, unequal variances)."""
    a, b = _as_1d(a), _as_1d(b)
    if a.size < 2 or b.size < 2:
        return NAN, NAN
    with _quiet():
        low, high = stats.ttest_ind(a, b, equal_var=False).confidence_interval(confidence)
    return float(low), float(high)


# --------------------------------------------------------------------------- Almost Stochastic Order


def _quantile_steps(n: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces on which both empirical quantile functions are constant.

    F^-1(t) = x_(ceil(n t)) jumps at multiples of 1/n, G^-1 at multiples of 1/m. Counting t in
    units of 1/(n m) makes every jump an integer, so the pieces are exact: the piece ending at
    e has width e - previous end, A's order statistic ceil(e/m) and B's ceil(e/n) (1-based).
    """
    ends = np.union1d(np.arange(1, n + 1) * m, np.arange(1, m + 1) * n)
    widths = np.diff(ends, prepend=0) / (n * m)
    return widths, -(-ends // m) - 1, -(-ends // n) - 1


def violation_ratio(a_sorted: np.ndarray, b_sorted: np.ndarray) -> np.ndarray:
    """epsilon_W2(F, G): the share of the squared 2-Wasserstein distance where A's quantiles lie below B's.

        eps = int_{F^-1(t) < G^-1(t)} (F^-1 - G^-1)^2 dt / int_0^1 (F^-1 - G^-1)^2 dt

    (Dror et al. 2019, eq. 4-5; del Barrio et al. 2018). 0 means A stochastically dominates B,
    1 the reverse. The integral is exact over the steps of the two empirical quantile functions
    (deepsig sums a grid t = dt, 2 dt, ...; the two agree to O(dt)). Identical quantile functions
    give 0/0, taken as 0.5 as deepsig does. Works on the last axis, so a batch of bootstrap
    resamples is one call.
    """
    widths, ia, ib = _quantile_steps(a_sorted.shape[-1], b_sorted.shape[-1])
    diff = b_sorted[..., ib] - a_sorted[..., ia]
    total = np.sum(widths * diff**2, axis=-1)
    violated = np.sum(widths * np.maximum(diff, 0.0) ** 2, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, violated / np.where(total > 0, total, 1.0), 0.5)


def aso_epsilon_min(
    a: ArrayLike, b: ArrayLike, *, confidence: float = 0.95, num_bootstrap: int = 1000, seed: int = 0
) -> float:
    """Almost Stochastic Order: the smallest epsilon for which "A is almost stochastically larger than B"
    holds at `confidence` (Dror et al. 2019, after del Barrio et al. 2018; as `deepsig.aso`, Ulmer et al.).

    With the violation ratio eps_W2 of the two samples, lambda = n m / (n + m), and sigma the
    bootstrap estimate of the std of sqrt(lambda) (eps_W2* - eps_W2), where each bootstrap
    iteration resamples both samples with replacement (deepsig draws them through the quantile
    functions, the same thing),

        eps_min = eps_W2 - (1 / sqrt(lambda)) * sigma * Phi^-1(1 - confidence), clipped to [0, 1].

    eps_min < 0.5 says A is better than B; near 0 A dominates; near 1 B dominates. Exactly
    reproducible for a given `seed` (NumPy Generator); differs from deepsig only by bootstrap noise
    and deepsig's grid integral.
    """
    a, b = np.sort(_as_1d(a)), np.sort(_as_1d(b))
    if a.size == 0 or b.size == 0:
        return NAN
    ratio = float(violation_ratio(a, b))
    rng = np.random.default_rng(seed)
    resampled_a = np.sort(a[rng.integers(0, a.size, (num_bootstrap, a.size))], axis=-1)
    resampled_b = np.sort(b[rng.integers(0, b.size, (num_bootstrap, b.size))], axis=-1)
    boot = violation_ratio(resampled_a, resampled_b)
    root_lambda = math.sqrt(a.size * b.size / (a.size + b.size))
    sigma = float(np.std(root_lambda * (boot - ratio)))
    return float(np.clip(ratio - sigma / root_lambda * stats.norm.ppf(1.0 - confidence), 0.0, 1.0))


# --------------------------------------------------------------------------- multiple comparisons


def holm(pvalues: ArrayLike) -> np.ndarray:
    """Holm-Bonferroni step-down adjusted p-values: sorted ascending, p_(i) * (m - i + 1),
    made monotone by a running maximum and clipped at 1. Controls the family-wise error
    rate under any dependence, and is never less powerful than Bonferroni.
    NaN p-values stay NaN and are not counted in m.
    """
    p = np.asarray(pvalues, dtype=np.float64)
    adjusted = np.full(p.shape, NAN)
    finite = ~np.isnan(p)
    q = p[finite]
    order = np.argsort(q, kind="stable")
    steps = np.minimum(np.maximum.accumulate((q.size - np.arange(q.size)) * q[order]), 1.0)
    values = np.empty(q.size)
    values[order] = steps
    adjusted[finite] = values
    return adjusted


# --------------------------------------------------------------------------- power


def power(delta: float, std: float, n: float, alpha: float = 0.05, *, paired: bool = False) -> float:
    """Power of the two-sided t-test with n seeds per group (paired: n pairs, `std` the sd of the
    differences) to detect a true difference `delta`."""
    return _t_test_power(delta, std, n, alpha, paired)


def _t_test_power(delta: float, std: float, n: float, alpha: float, paired: bool = False) -> float:
    """Power of the two-sided t-test to detect a true difference `delta`.

    Two-sample (n seeds per group, pooled variance): under the alternative the statistic follows a
    noncentral t with 2n - 2 degrees of freedom and noncentrality (delta/std) sqrt(n/2). Paired
    (n pairs, std the sd of the differences: the one-sample t-test of the differences): n - 1
    degrees of freedom and noncentrality (delta/std) sqrt(n). Power is its mass beyond +-t_{1-alpha/2}.
    """
    if not (n >= 2 and math.isfinite(std) and math.isfinite(delta)):
        return NAN
    if std == 0:
        return 1.0 if delta != 0 else alpha
    df, ncp = (n - 1, abs(delta) / std * math.sqrt(n)) if paired else (2 * n - 2, abs(delta) / std * math.sqrt(n / 2))
    critical = stats.t.ppf(1 - alpha / 2, df)
    # The lower tail P(T < -t) = P(T' > t) for T' noncentral at -ncp: scipy's cdf returns NaN far out in
    # that tail (df 1-10, ncp above about 8), where its sf returns the (vanishing) value.
    lower = stats.nct.sf(critical, df, -ncp)
    return float(stats.nct.sf(critical, df, ncp) + (lower if math.isfinite(lower) else 0.0))


def seeds_needed(delta: float, std: float, alpha: float = 0.05, power: float = 0.8, *, paired: bool = False) -> float:
    """Smallest number of seeds per configuration (paired: of pairs; >= 2) whose t-test reaches
    `power` for `delta`.

    Power grows with n, so double n until it is enough, then bisect between the last two.
    inf when delta is 0 (no finite n detects no difference), NaN when std is unknown.
    """
    target = power

    def reach(d: float, s: float, n: float, a: float) -> float:
        return _t_test_power(d, s, n, a, paired)

    if not (math.isfinite(std) and math.isfinite(delta)):
        return NAN
    if delta == 0:
        return math.inf
    if reach(delta, std, 2, alpha) >= target:
        return 2
    low, high = 2, 4
    while reach(delta, std, high, alpha) < target:
        low, high = high, high * 2
        if high > 2**40:
            return math.inf
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if reach(delta, std, middle, alpha) >= target else (middle, high)
    return high


def min_detectable_difference(
    std: float, n: float, alpha: float = 0.05, power: float = 0.8, *, paired: bool = False
) -> float:
    """Smallest true difference that n seeds per configuration (paired: n pairs, `std` the sd of
    the differences) detect with `power` (brentq on the power curve)."""
    target = power

    def reach(d: float) -> float:
        return _t_test_power(d, std, n, alpha, paired)

    if not (n >= 2 and math.isfinite(std)):
        return NAN
    if std == 0:
        return 0.0
    high = std
    while reach(high) < target:
        high *= 2
    return float(optimize.brentq(lambda d: reach(d) - target, 0.0, high, xtol=1e-14 * std, rtol=1e-12))


# --------------------------------------------------------------------------- variance decomposition


def variance_interval(values: ArrayLike, confidence: float = 0.95) -> dict[str, float]:
    """Sample variance (ddof=1) with the chi-square interval (n-1) s^2 / chi2_{1-a/2, 0+a/2}(n-1)."""
    x = _as_1d(values)
    if x.size < 2:
        return {"variance": NAN, "ci_low": NAN, "ci_high": NAN}
    var = float(np.var(x, ddof=1))
    return {"variance": var, **_chi2_interval(var, x.size - 1, confidence)}


def _chi2_interval(var: float, df: float, confidence: float) -> dict[str, float]:
    tail = (1 - confidence) / 2
    return {"ci_low": df * var / stats.chi2.ppf(1 - tail, df), "ci_high": df * var / stats.chi2.ppf(tail, df)}


def decompose_one_at_a_time(
    by_source: Mapping[str, ArrayLike], total: ArrayLike | None = None, confidence: float = 0.95
) -> list[dict[str, Any]]:
    """Variance of each one-source-at-a-time design (Bouthillier et al. 2021) and its share of their sum.

    Rows: one per source (variance, chi-square CI, share = var_s / sum of source variances);
    "sum_of_sources" (their sum, with a Welch-Satterthwaite chi-square interval, share 1);
    and, given the all-sources-vary design, "total" (its variance and chi-square CI, share =
    var_total / sum_of_sources). If the sources add up, total's share is near 1 and its interval
    overlaps the sum's. An interaction pushes it below 1: with y = a + b + ab, varying only a
    gives var(a) + var(ab), varying only b gives var(b) + var(ab), so the sum counts var(ab)
    twice and the total once (`--decompose grid` separates it).
    """
    rows = [{"source": str(s), **variance_interval(v, confidence)} for s, v in by_source.items()]
    summed = float(sum(r["variance"] for r in rows)) if rows else NAN
    for r in rows:
        r["share"] = r["variance"] / summed if summed > 0 else NAN
    if rows:
        # Welch-Satterthwaite: a sum of independent scaled chi-squares is ~ chi-square with these df.
        dfs = [_as_1d(v).size - 1 for v in by_source.values()]
        denominator = sum(r["variance"] ** 2 / df for r, df in zip(rows, dfs)) if min(dfs) >= 1 else NAN
        df = summed**2 / denominator if denominator > 0 else NAN
        interval = _chi2_interval(summed, df, confidence) if math.isfinite(df) else {"ci_low": NAN, "ci_high": NAN}
        rows.append({"source": "sum_of_sources", "variance": summed, **interval, "share": 1.0 if summed > 0 else NAN})
    if total is not None:
        whole = variance_interval(total, confidence)
        rows.append({"source": "total", **whole, "share": whole["variance"] / summed if summed > 0 else NAN})
    return rows


def variance_components(frame: pd.DataFrame, factors: Sequence[str], value: str) -> pd.DataFrame:
    """Variance components of a balanced, fully crossed two-factor grid (e.g. init seed x data seed).

    Two-way random-effects ANOVA, y_ijk = mu + a_i + b_j + (ab)_ij + e_ijk, by the method of
    moments: with I levels of the first factor, J of the second and r replicates per cell,

        E[MS_A] = s2_e + r s2_ab + J r s2_a    E[MS_B] = s2_e + r s2_ab + I r s2_b
        E[MS_AB] = s2_e + r s2_ab              E[MS_E] = s2_e

    so s2_a = (MS_A - MS_AB) / (J r), s2_b = (MS_B - MS_AB) / (I r), s2_ab = (MS_AB - MS_E) / r,
    s2_e = MS_E. With one replicate the interaction and the residual cannot be told apart and
    are reported together ("<a>:<b>+residual" = MS_AB). A moment estimate below zero means the
    component is too small to see against the noise; it is truncated at 0 (the usual convention,
    at the price of a small upward bias). Returns source, df, mean_square, variance, share.
    """
    if len(factors) != 2:
        raise ValueError(f"variance_components takes exactly two crossed factors, got {list(factors)}.")
    fa, fb = factors
    y = frame[value].astype(np.float64)
    cells = frame.groupby([fa, fb])[value]
    counts = cells.size()
    levels_a, levels_b = frame[fa].nunique(), frame[fb].nunique()
    if len(counts) != levels_a * levels_b or counts.nunique() != 1:
        raise ValueError(
            f"variance_components needs a balanced, fully crossed grid of {fa} x {fb} "
            f"(every pair of levels with the same number of runs)."
        )
    r = int(counts.iloc[0])
    grand = y.mean()
    mean_a = frame.groupby(fa)[value].mean()
    mean_b = frame.groupby(fb)[value].mean()
    mean_ab = cells.mean()
    interaction = (
        mean_ab.to_numpy()
        - mean_a[mean_ab.index.get_level_values(0)].to_numpy()
        - mean_b[mean_ab.index.get_level_values(1)].to_numpy()
        + grand
    )
    residual = y - cells.transform("mean")
    ss = {
        "a": levels_b * r * float(((mean_a - grand) ** 2).sum()),
        "b": levels_a * r * float(((mean_b - grand) ** 2).sum()),
        "ab": r * float((interaction**2).sum()),
        "e": float((residual**2).sum()),
    }
    df = {
        "a": levels_a - 1,
        "b": levels_b - 1,
        "ab": (levels_a - 1) * (levels_b - 1),
        "e": levels_a * levels_b * (r - 1),
    }
    ms = {k: ss[k] / df[k] if df[k] > 0 else NAN for k in ss}
    components = {"a": (ms["a"] - ms["ab"]) / (levels_b * r), "b": (ms["b"] - ms["ab"]) / (levels_a * r)}
    names = {"a": fa, "b": fb}
    if r > 1:
        components.update(ab=(ms["ab"] - ms["e"]) / r, e=ms["e"])
        names.update(ab=f"{fa}:{fb}", e="residual")
    else:
        components.update(ab=ms["ab"])
        names.update(ab=f"{fa}:{fb}+residual")
    variance = {k: max(float(v), 0.0) if math.isfinite(v) else NAN for k, v in components.items()}
    summed = sum(v for v in variance.values() if math.isfinite(v))
    return pd.DataFrame(
        [
            {
                "source": names[k],
                "df": df[k],
                "mean_square": ms[k],
                "variance": v,
                "share": v / summed if summed > 0 else NAN,
            }
            for k, v in variance.items()
        ]
    )


def difference_interval(
    ms1: float, df1: float, ms2: float, df2: float, c: float, confidence: float = 0.95
) -> tuple[float, float]:
    """Modified large-sample interval (Ting, Burdick, Graybill et al. 1990) for c (E[MS1] - E[MS2]),
    a variance component from two independent mean squares; the lower end truncated at 0.

    This is the interval Burdick and Graybill (1992) recommend for a component estimated as a
    difference of mean squares, where a chi-square interval does not apply; its level is
    checked by simulation in the tests.
    """
    if not all(math.isfinite(v) for v in (ms1, ms2)) or df1 < 1 or df2 < 1:
        return NAN, NAN
    tail = (1 - confidence) / 2
    g1, g2 = 1 - df1 / stats.chi2.ppf(1 - tail, df1), 1 - df2 / stats.chi2.ppf(1 - tail, df2)
    h1, h2 = df1 / stats.chi2.ppf(tail, df1) - 1, df2 / stats.chi2.ppf(tail, df2) - 1
    f_high, f_low = stats.f.ppf(1 - tail, df1, df2), stats.f.ppf(tail, df1, df2)
    g12 = ((f_high - 1) ** 2 - g1**2 * f_high**2 - h2**2) / f_high
    h12 = ((1 - f_low) ** 2 - h1**2 * f_low**2 - g2**2) / f_low
    estimate = c * (ms1 - ms2)
    below = math.sqrt(max(g1**2 * (c * ms1) ** 2 + h2**2 * (c * ms2) ** 2 + g12 * c * c * ms1 * ms2, 0.0))
    above = math.sqrt(max(h1**2 * (c * ms1) ** 2 + g2**2 * (c * ms2) ** 2 + h12 * c * c * ms1 * ms2, 0.0))
    return max(estimate - below, 0.0), max(estimate + above, 0.0)


def grid_decomposition(
    frame: pd.DataFrame, factors: Sequence[str], value: str, confidence: float = 0.95
) -> list[dict[str, Any]]:
    """`variance_components` of a crossed grid with one run per cell, each component with an
    interval: the two factors by `difference_interval`, the interaction-plus-residual by chi-square."""
    table = variance_components(frame, factors, value).set_index("source")
    (a, b), rest = factors, f"{factors[0]}:{factors[1]}+residual"
    ms_ab, df_ab = float(table.loc[rest, "mean_square"]), float(table.loc[rest, "df"])
    rows = []
    for name, other in ((a, b), (b, a)):
        levels = frame[other].nunique()  # the component is (MS - MS_AB) / (levels of the other factor)
        low, high = difference_interval(
            float(table.loc[name, "mean_square"]), float(table.loc[name, "df"]), ms_ab, df_ab, 1.0 / levels, confidence
        )
        rows.append(
            {
                "source": name,
                "variance": float(table.loc[name, "variance"]),
                "ci_low": low,
                "ci_high": high,
                "share": float(table.loc[name, "share"]),
            }
        )
    rows.append(
        {
            "source": rest,
            "variance": float(table.loc[rest, "variance"]),
            **_chi2_interval(ms_ab, df_ab, confidence),
            "share": float(table.loc[rest, "share"]),
        }
    )
    return rows


def crossed_mean_interval(
    frame: pd.DataFrame, factors: Sequence[str], value: str, confidence: float = 0.95
) -> tuple[float, float]:
    """Interval for the grand mean of a crossed grid (I levels x J levels, one run per cell).

    The k x k runs are not independent: runs that share an init seed share its effect. Under
    the two-way random model, var(grand mean) = s2_a / I + s2_b / J + s2_ab+e / (I J), whose
    unbiased estimate is (MS_A + MS_B - MS_AB) / (I J); its degrees of freedom come from
    Satterthwaite. When MS_A + MS_B - MS_AB is below MS_AB (components estimated negative), the
    runs are taken as independent (MS_AB / (I J), df of the interaction), the usual truncation.
    """
    table = variance_components(frame, factors, value).set_index("source")
    if len(table) != 3:
        raise ValueError("crossed_mean_interval takes a grid with one run per cell.")
    ms, df = table["mean_square"].to_numpy(), table["df"].to_numpy(dtype=np.float64)
    cells = frame[factors[0]].nunique() * frame[factors[1]].nunique()
    combined = ms[0] + ms[1] - ms[2]
    if not all(math.isfinite(v) for v in ms) or min(df) < 1:
        return NAN, NAN
    if combined <= ms[2]:
        variance, dof = ms[2] / cells, df[2]
    else:
        variance, dof = combined / cells, combined**2 / (ms[0] ** 2 / df[0] + ms[1] ** 2 / df[1] + ms[2] ** 2 / df[2])
    mean = float(frame[value].mean())
    if variance <= 0:
        return mean, mean
    half = float(stats.t.ppf(0.5 + confidence / 2, dof)) * math.sqrt(variance)
    return mean - half, mean + half
