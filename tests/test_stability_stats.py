"""Statistics of stability studies: every figure against scipy, a hand computation, or a reference
implementation (deepsig for ASO, statsmodels for Holm and power), and `analyse` end to end on a
hand-built result."""

import itertools
import json
import math
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from hfta_nas.errors import HftaNasError
from hfta_nas.stability import _stats
from hfta_nas.stability._analysis import (
    COMPARISON_COLUMNS,
    DECOMPOSITION_COLUMNS,
    MODE_RULE,
    MODE_SOURCE_COLUMNS,
    PER_EPOCH_COLUMNS,
    POWER_COLUMNS,
    PROFILE_COLUMNS,
    RANKING_COLUMNS,
    SUMMARY_COLUMNS,
    analyse,
)
from hfta_nas.stability._result import CURVE_COLUMNS, METRICS, SEED_COLUMNS, StabilityResult

TIGHT = 1e-12
# comparison columns that `_analysis` adds to what `_stats.compare` returns
PAIRED_AND_RATE_COLUMNS = COMPARISON_COLUMNS[COMPARISON_COLUMNS.index("mean_diff_low") : -1]


def close(a, b, tol=TIGHT):
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol) or (math.isnan(a) and math.isnan(b))


@pytest.fixture
def no_warnings():
    """Degenerate data must come out as NaN, not as warnings leaking to the user."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def sample(n=25, seed=2):
    values = np.random.default_rng(seed).normal(0.9, 0.01, n)
    values[3] = 0.80  # a planted low outlier
    return values


# --------------------------------------------------------------------------- summarize


def test_summarize_matches_scipy_and_numpy(no_warnings):
    x = sample()
    row = _stats.summarize(x, n_failed=2, n_test=1000, bootstrap_seed=7, n_resamples=2000)
    assert list(row) == [c for c in SUMMARY_COLUMNS if c not in ("config", "design", "metric", "headline")]
    mean, std = x.mean(), x.std(ddof=1)
    q1, med, q3 = np.percentile(x, [25, 50, 75])
    t_low, t_high = stats.t.interval(0.95, x.size - 1, loc=mean, scale=stats.sem(x))
    boot = stats.bootstrap((x,), np.mean, method="BCa", n_resamples=2000, rng=np.random.default_rng(7))
    shapiro = stats.shapiro(x)
    floor = math.sqrt(mean * (1 - mean) / 1000)
    expected = {
        "n": 25,
        "n_failed": 2,
        "mean": mean,
        "std": std,
        "sem": std / 5,
        "ci_t_low": t_low,
        "ci_t_high": t_high,
        "ci_bca_low": boot.confidence_interval.low,
        "ci_bca_high": boot.confidence_interval.high,
        "median": med,
        "q1": q1,
        "q3": q3,
        "iqr": stats.iqr(x),
        "iqm": stats.trim_mean(x, 0.25),
        "min": x.min(),
        "max": x.max(),
        "range": x.max() - x.min(),
        "cv": std / mean,
        "normality_stat": shapiro.statistic,
        "normality_p": shapiro.pvalue,
        "n_outliers": 1,
        "noise_floor_std": floor,
        "variance_ratio": std**2 / floor**2,
    }
    for key, value in expected.items():
        assert close(row[key], value), key
    assert row["outliers"] == [3]
    assert list(row["best_of_k"]) == [1, 2, 4, 8, 16]
    assert close(row["best_of_k"][1], mean)


def test_iqm_is_the_mean_of_the_middle_half():
    x = np.array([10.0, 1.0, 4.0, 3.0, 2.0, 7.0, 5.0, 100.0])
    assert close(_stats.summarize(x, n_resamples=100)["iqm"], (3 + 4 + 5 + 7) / 4)


def test_summarize_losses_have_no_noise_floor():
    row = _stats.summarize(sample(), n_test=1000, is_accuracy=False, n_resamples=100)
    assert math.isnan(row["noise_floor_std"]) and math.isnan(row["variance_ratio"])


@pytest.mark.parametrize("values", [[], [0.9], [0.9, 0.9, 0.9, 0.9]])
def test_summarize_degenerate_input_gives_nan_without_warnings(values, no_warnings):
    row = _stats.summarize(np.asarray(values, dtype=np.float64), n_test=100, n_resamples=200)
    assert row["n"] == len(values)
    assert math.isnan(row["normality_stat"]) and math.isnan(row["normality_p"])
    if len(values) < 2:
        for key in ("std", "sem", "ci_t_low", "ci_t_high", "ci_bca_low", "ci_bca_high", "cv", "variance_ratio"):
            assert math.isnan(row[key]), key
    else:  # all equal: no spread, so every interval is the point itself
        assert row["std"] == 0 and row["cv"] == 0 and row["n_outliers"] == 0
        assert row["ci_t_low"] == row["ci_t_high"] == row["ci_bca_low"] == row["ci_bca_high"] == 0.9
    assert row["best_of_k"] == ({} if not values else {k: 0.9 for k in row["best_of_k"]})


def test_bootstrap_interval_is_reproducible_from_its_seed():
    x = sample()
    one = _stats.bootstrap_interval([x], np.mean, seed=3, n_resamples=2000)
    assert one == _stats.bootstrap_interval([x], np.mean, seed=3, n_resamples=2000)
    assert one != _stats.bootstrap_interval([x], np.mean, seed=4, n_resamples=2000)


def test_expected_best_of_k_is_exact():
    x = np.array([0.3, 0.9, 0.1, 0.5, 0.9, 0.7, 0.2, 0.4])  # with a tie
    for k in range(1, x.size + 1):
        brute = np.mean([max(c) for c in itertools.combinations(x, k)])
        assert close(_stats.expected_best_of_k(x, k), brute), k
    assert math.isnan(_stats.expected_best_of_k(x, 9))
    big = np.random.default_rng(0).normal(size=1000)  # binomials far beyond float range
    best = _stats.expected_best_of_k(big, 512)
    assert np.sort(big)[-3] < best <= big.max()


# --------------------------------------------------------------------------- compare


def test_compare_matches_scipy(no_warnings):
    a, b = sample(12, seed=1), sample(15, seed=2) - 0.005
    row = _stats.compare(a, b, bootstrap_seed=5)
    assert list(row) == [
        c
        for c in COMPARISON_COLUMNS
        if c not in ("metric", "a", "b", "better", "welch_p_holm", "mwu_p_holm", "aso_confidence")
        and c not in PAIRED_AND_RATE_COLUMNS
    ]
    welch = stats.ttest_ind(a, b, equal_var=False)
    mwu = stats.mannwhitneyu(a, b, alternative="two-sided")
    pooled = math.sqrt((11 * a.var(ddof=1) + 14 * b.var(ddof=1)) / 25)
    signs = np.sign(a[:, None] - b[None, :])
    assert close(row["mean_diff"], a.mean() - b.mean())
    assert close(row["welch_t"], welch.statistic) and close(row["welch_p"], welch.pvalue)
    assert close(row["mwu_u"], mwu.statistic) and close(row["mwu_p"], mwu.pvalue)
    assert close(row["cohen_d"], (a.mean() - b.mean()) / pooled)
    assert close(row["cliff_delta"], signs.mean())
    assert close(row["p_a_better"], np.mean((signs > 0) + 0.5 * (signs == 0)))
    assert row["p_a_better_low"] <= row["p_a_better"] <= row["p_a_better_high"]
    assert row == _stats.compare(a, b, bootstrap_seed=5)


def test_comparisons_of_a_metric_to_minimise_read_better_as_lower(no_warnings):
    """A's losses are lower: A is the better configuration, and every directional figure says so."""
    a, b = sample(10, seed=1), sample(10, seed=2) + 0.05
    for_loss = _stats.compare(a, b, higher_is_better=False, bootstrap_seed=1)
    for_accuracy = _stats.compare(-a, -b, bootstrap_seed=1)
    for key in ("cohen_d", "cliff_delta", "p_a_better", "p_a_better_low", "p_a_better_high", "aso_eps_min"):
        assert close(for_loss[key], for_accuracy[key]), key
    assert for_loss["p_a_better"] > 0.5 and for_loss["cliff_delta"] > 0 and for_loss["aso_eps_min"] < 0.5
    assert for_loss["mean_diff"] < 0  # the raw difference keeps its sign


def test_newcombe_interval_solves_its_score_equation_and_survives_separation():
    a, b = np.array([0.91, 0.93, 0.95, 0.90, 0.97]), np.array([0.89, 0.92, 0.90, 0.88, 0.91, 0.86])
    theta = float(_stats.prob_greater(a, b))
    low, high = _stats.prob_greater_interval(a, b)
    z2, m, n = stats.norm.ppf(0.975) ** 2, 5, 6

    def variance(t):
        return t * (1 - t) * (1 + ((m + n) / 2 - 1) * ((1 - t) / (2 - t) + t / (1 + t))) / (m * n)

    assert low < theta < high
    for end in (low, high):
        assert math.isclose((theta - end) ** 2, z2 * variance(end), rel_tol=1e-9)
    # complete separation, 3 seeds against 3: a bootstrap interval collapses to [1, 1]; this one does not
    low, high = _stats.prob_greater_interval([4.0, 5.0, 6.0], [1.0, 2.0, 3.0])
    assert high == 1.0 and low == pytest.approx(0.5, abs=0.01)
    assert _stats.prob_greater_interval([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == (0.0, pytest.approx(1 - low))
    # the published example of R's SingleCaseES (Newcombe's method 5): [0.5973, 0.9860]
    low, high = _stats.prob_greater_interval([28, 25, 24, 27, 30, 30, 29], [20, 20, 26, 25, 22, 23])
    assert (low, high) == (pytest.approx(0.5973, abs=1e-4), pytest.approx(0.9860, abs=1e-4))


def test_newcombe_interval_holds_its_level_on_a_shift():
    rng = np.random.default_rng(0)
    truth = stats.norm.cdf(0.5 / math.sqrt(2))  # P(A > B) for A ~ N(0.5, 1), B ~ N(0, 1)
    hits = [
        low <= truth <= high
        for low, high in (_stats.prob_greater_interval(rng.normal(0.5, 1, 8), rng.normal(0, 1, 8)) for _ in range(400))
    ]
    assert 0.91 <= np.mean(hits) <= 0.99


def test_headline_interval_is_t_and_flags_few_seeds():
    row = _stats.summarize(sample(4, seed=3), n_resamples=100)
    assert (row["ci_low"], row["ci_high"]) == (row["ci_t_low"], row["ci_t_high"])
    assert row["ci_method"] == "t" and row["few_seeds"]
    assert not _stats.summarize(sample(5, seed=3), n_resamples=100)["few_seeds"]


def test_probability_of_superiority_on_known_inputs(no_warnings):
    a = np.arange(10, dtype=np.float64)
    separated = _stats.compare(a + 100, a)
    assert separated["p_a_better"] == separated["p_a_better_high"] == 1.0 and separated["p_a_better_low"] < 1.0
    assert separated["cliff_delta"] == 1.0
    assert _stats.compare(a, a + 100)["p_a_better"] == 0.0
    same = _stats.compare(a, a)
    assert same["p_a_better"] == 0.5 and same["cliff_delta"] == 0.0
    # 2 of the 4 pairs won, 1 tied, 1 lost: (2 + 0.5) / 4
    assert _stats.compare([1.0, 3.0], [2.0, 3.0])["p_a_better"] == 0.375


def test_compare_degenerate_input(no_warnings):
    assert all(math.isnan(v) for v in _stats.compare([], [1.0, 2.0]).values())
    flat = _stats.compare([1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
    assert math.isnan(flat["welch_p"]) and math.isnan(flat["cohen_d"]) and flat["p_a_better"] == 0.5


# --------------------------------------------------------------------------- ASO

# Reference values from the established implementation, deepsig 1.2.8 (pip install deepsig; its module
# __version__ reads 1.2.6) with numpy 2.4.6 / scipy 1.17.1, on the pairs built by `aso_pairs` below:
#   ratio:   deepsig.aso.compute_violation_ratio(a, b, dt=1e-4)
#   default: deepsig.aso(list(a), list(b), seed=0, show_progress=False)            (dt=0.005, 1000 bootstraps)
#   fine:    mean of deepsig.aso(list(a), list(b), seed=s * 100000, dt=0.001, show_progress=False), s = 0..7
# deepsig integrates on a grid t = dt, 2 dt, ... (and leaves the first grid point out of the numerator);
# we integrate the step functions exactly, so the ratios agree to O(dt): at dt=1e-4 to 4e-4 (tolerance
# 2e-3), while deepsig's default dt=0.005 moves eps_min by up to ~0.02 on these pairs.
# Tolerances come from the bootstrap: one eps_min from 1000 bootstraps varies across seeds with sd up to
# 0.013 (both implementations); the 8-run deepsig mean has sd <= 0.004 and ours with 20000 bootstraps
# <= 0.003, so "fine" is held to 0.02 (about 4 sd); "default" (one run each, plus the grid) to 0.05.
ASO_REFERENCE = {  # name: (ratio, default, fine)
    "shift0.0": (0.36286369582428274, 0.8728144695424389, 0.876464657359775),
    "shift0.5": (0.015951858416445613, 0.15482026399511672, 0.15829972786365187),
    "shift1.0": (0.0, 0.003843119340351039, 0.00452259375863402),
    "unequal": (0.044446228259108045, 0.5293353512274389, 0.5380793861764388),
    "dominating": (0.0, 0.0, 0.0),
    "dominated": (0.9998999899989999, 0.9966129096138835, 0.9993228357051969),
}


def aso_pairs():
    b = np.random.default_rng(2).standard_normal(20)
    pairs = {f"shift{s}": (np.random.default_rng(1).standard_normal(20) + s, b) for s in (0.0, 0.5, 1.0)}
    pairs["unequal"] = (
        np.random.default_rng(3).standard_normal(15) + 0.5,
        np.random.default_rng(4).standard_normal(25),
    )
    pairs["dominating"], pairs["dominated"] = (b + 10.0, b), (b - 10.0, b)
    return pairs


@pytest.mark.parametrize("name", list(ASO_REFERENCE))
def test_aso_matches_deepsig(name):
    a, b = aso_pairs()[name]
    ratio, default, fine = ASO_REFERENCE[name]
    assert abs(float(_stats.violation_ratio(np.sort(a), np.sort(b))) - ratio) < 2e-3
    assert abs(_stats.aso_epsilon_min(a, b, seed=0, num_bootstrap=20000) - fine) < 0.02
    assert abs(_stats.aso_epsilon_min(a, b, seed=0) - default) < 0.05


def test_aso_is_reproducible_and_symmetric(no_warnings):
    a, b = aso_pairs()["unequal"]
    assert _stats.aso_epsilon_min(a, b, seed=3) == _stats.aso_epsilon_min(a, b, seed=3)
    forward = _stats.violation_ratio(np.sort(a), np.sort(b))
    backward = _stats.violation_ratio(np.sort(b), np.sort(a))
    assert close(float(forward + backward), 1.0)  # del Barrio et al.: eps(A, B) = 1 - eps(B, A)
    assert _stats.violation_ratio(np.sort(a), np.sort(a)) == 0.5
    assert math.isnan(_stats.aso_epsilon_min([], b))


def test_violation_ratio_is_the_exact_integral():
    # F^-1 = 0 | 2 on (0, .5] | (.5, 1]; G^-1 = 1 | 1 | 1 on thirds. Pieces (0,1/3], (1/3,1/2], (1/2,2/3], (2/3,1]:
    # diff = G - F = 1, 1, -1, -1, widths 1/3, 1/6, 1/6, 1/3: violation 1/2 of a total 1.
    assert close(float(_stats.violation_ratio(np.array([0.0, 2.0]), np.array([1.0, 1.0, 1.0]))), 0.5)
    assert close(float(_stats.violation_ratio(np.array([0.0, 3.0]), np.array([1.0, 1.0, 1.0]))), 1 / 5)


# --------------------------------------------------------------------------- Holm


def test_holm_by_hand_and_statsmodels():
    p = [0.01, 0.04, 0.03, 0.005, 0.2, 0.04]
    # by hand: sorted 0.005*6, 0.01*5, 0.03*4, 0.04*3, 0.04*2 -> 0.12 (running max), 0.2*1
    hand = [0.05, 0.12, 0.12, 0.03, 0.2, 0.12]
    # statsmodels 0.15.0: multipletests(p, method="holm")[1]
    statsmodels = [0.05, 0.12, 0.12, 0.03, 0.2, 0.12]
    np.testing.assert_allclose(_stats.holm(p), hand, rtol=0, atol=TIGHT)
    np.testing.assert_allclose(_stats.holm(p), statsmodels, rtol=0, atol=TIGHT)
    np.testing.assert_array_equal(_stats.holm([0.5, 0.6]), [1.0, 1.0])  # clipped
    np.testing.assert_allclose(_stats.holm([0.01, np.nan, 0.02]), [0.02, np.nan, 0.02])
    assert _stats.holm([]).shape == (0,)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1, allow_nan=False), min_size=0, max_size=30))
def test_holm_properties(p):
    adjusted = _stats.holm(p)
    assert np.all(adjusted >= np.asarray(p) - TIGHT) and np.all(adjusted <= 1.0)
    order = np.argsort(p, kind="stable")
    assert np.all(np.diff(adjusted[order]) >= -TIGHT)  # monotone in the raw p-values


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=20),
    st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=20),
)
def test_best_of_k_and_violation_ratio_properties(a, b):
    best = list(_stats.best_of_k(a).values())
    assert all(later >= earlier - 1e-9 * (1 + abs(earlier)) for earlier, later in zip(best, best[1:]))
    assert best[-1] <= max(a) + 1e-9 * (1 + abs(max(a)))
    ab = float(_stats.violation_ratio(np.sort(a), np.sort(b)))
    ba = float(_stats.violation_ratio(np.sort(b), np.sort(a)))
    assert 0 <= ab <= 1 and abs(ab + ba - 1) < 1e-9


# --------------------------------------------------------------------------- power


@pytest.mark.parametrize("d, n", [(0.5, 64), (0.8, 26), (0.2, 394)])
def test_seeds_needed_textbook(d, n):
    # Cohen (1988) / G*Power, two-sided two-sample t-test, alpha .05, power .8.
    assert _stats.seeds_needed(d * 0.01, 0.01) == n
    assert _stats.power(d, 1.0, n) >= 0.8 > _stats.power(d, 1.0, n - 1)


def test_power_against_statsmodels():
    # statsmodels 0.15.0: TTestIndPower().power(0.5, 64, 0.05), .power(0.3, 20, 0.01),
    # .solve_power(None, nobs1=20, alpha=0.05, power=0.8)
    assert close(_stats.power(0.5, 1.0, 64), 0.8014595579222542)
    assert close(_stats.power(0.03, 0.1, 20, alpha=0.01), 0.04792988013447679)
    # statsmodels' root finder stops about 1e-8 short; ours meets power 0.8 to rounding (next lines)
    assert close(_stats.min_detectable_difference(2.0, 20), 2.0 * 0.9091290410935777, 1e-7)
    mdd = _stats.min_detectable_difference(0.01, 32)
    assert close(_stats.power(mdd, 0.01, 32), 0.8)
    assert close(_stats.power(_stats.min_detectable_difference(2.0, 20), 2.0, 20), 0.8)


def test_paired_power_against_statsmodels():
    """The paired design's power is the one-sample t-test's on the differences (n pairs, n - 1 df).
    statsmodels 0.15.0: TTestPower().power(0.5, 34, 0.05), .power(0.5, 33, 0.05), .power(0.3, 20, 0.01),
    .solve_power(None, nobs=20, alpha=0.05, power=0.8); .solve_power(0.5 | 0.8, power=0.8) = 33.37 | 14.30."""
    assert close(_stats.power(0.5, 1.0, 34, paired=True), 0.8077775012792737)
    assert close(_stats.power(0.5, 1.0, 33, paired=True), 0.795365841487504)
    assert close(_stats.power(0.03, 0.1, 20, alpha=0.01, paired=True), 0.08898120601027107)
    assert close(_stats.min_detectable_difference(2.0, 20, paired=True), 2.0 * 0.6604416544380312, 1e-7)
    assert close(_stats.power(_stats.min_detectable_difference(0.01, 12, paired=True), 0.01, 12, paired=True), 0.8)
    assert _stats.seeds_needed(0.005, 0.01, paired=True) == 34 and _stats.seeds_needed(0.008, 0.01, paired=True) == 15
    # pairs cost fewer seeds than independent groups at the same sd (64 per group for d = 0.5)
    assert _stats.seeds_needed(0.005, 0.01) == 64


def test_power_is_a_number_far_in_the_tail():
    """scipy's noncentral t cdf is NaN far in its lower tail (df 1-10, noncentrality above about 8): a
    2-pair compare of two very different configurations made the root finder fail."""
    assert _stats.power(10.0, 1.0, 2) == pytest.approx(stats.nct.sf(stats.t.ppf(0.975, 2), 2, 10.0), rel=1e-12)
    assert _stats.power(20.0, 1.0, 2, paired=True) == pytest.approx(stats.nct.sf(12.706204736, 1, 20 * 2**0.5))
    mdd = _stats.min_detectable_difference(0.001, 2, paired=True)
    assert close(_stats.power(mdd, 0.001, 2, paired=True), 0.8)


def test_power_degenerate():
    assert math.isnan(_stats.min_detectable_difference(float("nan"), 10))
    assert math.isnan(_stats.min_detectable_difference(1.0, 1))
    assert _stats.min_detectable_difference(0.0, 10) == 0.0
    assert _stats.seeds_needed(0.0, 1.0) == math.inf
    assert _stats.seeds_needed(0.01, 0.0) == 2
    assert math.isnan(_stats.seeds_needed(0.01, float("nan")))


# --------------------------------------------------------------------------- decomposition


def test_decompose_one_at_a_time_recovers_shares():
    rng = np.random.default_rng(0)
    sds = {"init": 2.0, "data": 1.0, "dropout": 0.5}
    by_source = {s: rng.normal(0, sd, 4000) for s, sd in sds.items()}
    total = rng.normal(0, math.sqrt(sum(sd**2 for sd in sds.values())), 4000)
    rows = {r["source"]: r for r in _stats.decompose_one_at_a_time(by_source, total)}
    assert list(rows) == ["init", "data", "dropout", "sum_of_sources", "total"]
    true_sum = sum(sd**2 for sd in sds.values())
    for s, sd in sds.items():
        assert abs(rows[s]["share"] - sd**2 / true_sum) < 0.02
        var = by_source[s].var(ddof=1)
        assert close(rows[s]["variance"], var)
        assert close(rows[s]["ci_low"], 3999 * var / stats.chi2.ppf(0.975, 3999))
        assert close(rows[s]["ci_high"], 3999 * var / stats.chi2.ppf(0.025, 3999))
        assert rows[s]["ci_low"] < sd**2 < rows[s]["ci_high"]
    assert close(rows["sum_of_sources"]["variance"], sum(rows[s]["variance"] for s in sds))
    assert rows["sum_of_sources"]["ci_low"] < true_sum < rows["sum_of_sources"]["ci_high"]
    assert abs(rows["total"]["share"] - 1.0) < 0.05  # independent sources add up


def test_decompose_without_total_or_values(no_warnings):
    rows = _stats.decompose_one_at_a_time({"init": [1.0, 2.0, 3.0], "data": [1.0]})
    assert [r["source"] for r in rows] == ["init", "data", "sum_of_sources"]
    assert math.isnan(rows[1]["variance"]) and math.isnan(rows[2]["ci_low"])


def crossed_grid(levels_a, levels_b, replicates, sd_a, sd_b, sd_ab, sd_e, seed=0):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(0, sd_a, levels_a), rng.normal(0, sd_b, levels_b)
    ab = rng.normal(0, sd_ab, (levels_a, levels_b))
    i, j, _ = np.meshgrid(np.arange(levels_a), np.arange(levels_b), np.arange(replicates), indexing="ij")
    i, j = i.ravel(), j.ravel()
    y = 5.0 + a[i] + b[j] + ab[i, j] + rng.normal(0, sd_e, i.size)
    return pd.DataFrame({"init": i, "data": j, "acc": y})


def test_variance_components_recover_known_values():
    grid = crossed_grid(300, 300, 2, sd_a=2.0, sd_b=1.0, sd_ab=0.5, sd_e=1.0)
    table = _stats.variance_components(grid, ["init", "data"], "acc").set_index("source")
    assert list(table.index) == ["init", "data", "init:data", "residual"]
    truth = {"init": 4.0, "data": 1.0, "init:data": 0.25, "residual": 1.0}
    for source, var in truth.items():  # 300 levels: a variance is known to about sqrt(2/299) = 8%
        assert abs(table.loc[source, "variance"] / var - 1) < 0.25, source
    assert close(table["share"].sum(), 1.0)
    # the sums of squares partition the total (ANOVA identity)
    ss = (table["df"] * table["mean_square"]).sum()
    assert close(ss, float(((grid["acc"] - grid["acc"].mean()) ** 2).sum()), 1e-10)


def test_variance_components_truncates_and_checks_the_grid():
    grid = crossed_grid(6, 5, 1, sd_a=0.0, sd_b=3.0, sd_ab=0.0, sd_e=1.0, seed=3)
    table = _stats.variance_components(grid, ["init", "data"], "acc").set_index("source")
    assert list(table.index) == ["init", "data", "init:data+residual"]
    assert (table["variance"] >= 0).all()
    ms = table["mean_square"]
    assert close(table.loc["init", "variance"], max((ms["init"] - ms["init:data+residual"]) / 5, 0.0))
    with pytest.raises(ValueError, match="balanced"):
        _stats.variance_components(grid.iloc[1:], ["init", "data"], "acc")
    with pytest.raises(ValueError, match="two"):
        _stats.variance_components(grid, ["init"], "acc")


# --------------------------------------------------------------------------- analyse


def hand_built_result(decompose=True):
    """Three configs x 5 seeds on design "all" (seed 2 of A fails), plus only_init/only_data for A."""
    rng = np.random.default_rng(11)
    seeds, curves = [], []
    plan = [(c, "all") for c in ("A", "B", "C")] + ([("A", "only_init"), ("A", "only_data")] if decompose else [])
    for config, design in plan:
        shift = {"A": 0.0, "B": 0.02, "C": 0.021}[config]
        for i in range(5):
            failed = (config, design, i) == ("A", "all", 2)
            final = {m: np.nan for m in METRICS}
            if not failed:
                final.update(
                    test_acc=0.9 + shift + rng.normal(0, 0.01),
                    test_loss=0.3 - shift + rng.normal(0, 0.02),
                    train_acc=0.95 + shift + rng.normal(0, 0.01),
                    train_loss=0.2 + rng.normal(0, 0.02),
                )
            seeds.append(
                {
                    "config": config,
                    "seed_index": i,
                    "design": design,
                    "seed_init": 100 + i,
                    "seed_data": 200 + i,
                    "seed_dropout": 300,
                    "status": "failed" if failed else "completed",
                    "reason": "loss is nan" if failed else "",
                    "epochs": 2 if failed else 3,
                    **final,
                }
            )
            for epoch in range(1, (2 if failed else 3) + 1):
                for metric in ("test_acc", "test_loss"):
                    curves.append(
                        {
                            "config": config,
                            "design": design,
                            "seed_index": i,
                            "epoch": epoch,
                            "metric": metric,
                            "value": 0.5 + 0.1 * epoch + rng.normal(0, 0.01),
                        }
                    )
    seeds = pd.DataFrame(seeds, columns=[*SEED_COLUMNS, *METRICS])
    curves = pd.DataFrame(curves, columns=list(CURVE_COLUMNS))
    return StabilityResult(seeds, curves, {"n_test": 2000, "bootstrap_seed": 4})


@pytest.fixture(scope="module")
def analysed():
    result = hand_built_result()
    return result, analyse(result, n_resamples=500)


def test_analyse_fills_every_documented_column(analysed):
    _, an = analysed
    assert tuple(an.summary.columns) == SUMMARY_COLUMNS
    assert tuple(an.per_epoch.columns) == PER_EPOCH_COLUMNS
    assert tuple(an.comparisons.columns) == COMPARISON_COLUMNS
    assert tuple(an.ranking.columns) == RANKING_COLUMNS
    assert tuple(an.power.columns) == (
        *POWER_COLUMNS,
        "seeds_needed_0.005",
        "seeds_needed_0.01",
        "seeds_needed_0.02",
        "note",
    )
    assert tuple(an.decomposition.columns) == DECOMPOSITION_COLUMNS
    assert an.settings == {
        "confidence": 0.95,
        "bootstrap_seed": 4,
        "n_resamples": 500,
        "alpha": 0.05,
        "power": 0.8,
        "fail_below": {},
        "fail_margin": 0.1,
        "gone_wrong_rule": "failed, or worse than the median by more than 10% of it; in a grid, counted per init seed",
        "profile_band": "95% DKW band (simultaneous over every threshold, any distribution)",
        "mode_rule": MODE_RULE,
        "seeds_to_see_1_in_10_with_90_percent": 22,
    }
    assert tuple(an.profiles.columns) == PROFILE_COLUMNS
    # val_* were never recorded, so they get no rows; the others one per (config, design)
    assert set(an.summary["metric"]) == {"test_acc", "test_loss", "train_acc", "train_loss"}
    assert len(an.summary) == 5 * 4 and len(an.comparisons) == 3 * 4 and len(an.power) == 3 * 4


def test_analyse_counts_the_failed_seed_and_matches_summarize(analysed):
    result, an = analysed
    row = an.summary.set_index(["config", "design", "metric"]).loc[("A", "all", "test_acc")]
    assert row["n"] == 4 and row["n_failed"] == 1
    done = result.seeds.query("config == 'A' and design == 'all' and status == 'completed'")
    expected = _stats.summarize(done["test_acc"].to_numpy(), n_failed=1, n_test=2000, bootstrap_seed=4, n_resamples=500)
    for key in ("mean", "std", "ci_t_low", "ci_bca_low", "ci_bca_high", "iqm", "noise_floor_std", "variance_ratio"):
        assert close(row[key], expected[key]), key
    assert json.loads(row["best_of_k"]) == {str(k): v for k, v in expected["best_of_k"].items()}
    assert an.summary.query("metric == 'test_loss'")["noise_floor_std"].isna().all()
    assert an.summary.query("config == 'B'")["n_failed"].eq(0).all()


def test_analyse_outliers_are_seed_indices():
    result = hand_built_result(decompose=False)
    mask = (result.seeds["config"] == "B") & (result.seeds["seed_index"] == 4)
    result.seeds.loc[mask, "test_acc"] = 0.5
    row = analyse(result, n_resamples=200).summary.query("config == 'B' and metric == 'test_acc'").iloc[0]
    assert row["n_outliers"] == 1 and row["outliers"] == "4"


def test_analyse_per_epoch_uses_completed_seeds(analysed):
    result, an = analysed
    row = an.per_epoch.query("config == 'A' and design == 'all' and metric == 'test_acc' and epoch == 1").iloc[0]
    completed = result.seeds.query("config == 'A' and design == 'all' and status == 'completed'")["seed_index"]
    values = result.curves.query("config == 'A' and design == 'all' and metric == 'test_acc' and epoch == 1")
    values = values[values["seed_index"].isin(completed)]["value"].to_numpy()
    low, high = stats.t.interval(0.95, values.size - 1, loc=values.mean(), scale=stats.sem(values))
    assert row["n"] == 4 and close(row["mean"], values.mean()) and close(row["std"], values.std(ddof=1))
    assert close(row["ci_low"], low) and close(row["ci_high"], high)


def test_analyse_comparisons_ranking_power(analysed):
    result, an = analysed
    acc = an.comparisons.query("metric == 'test_acc'")
    assert list(zip(acc["a"], acc["b"])) == [("A", "B"), ("A", "C"), ("B", "C")]
    np.testing.assert_allclose(acc["welch_p_holm"], _stats.holm(acc["welch_p"]), rtol=0, atol=TIGHT)
    np.testing.assert_allclose(acc["mwu_p_holm"], _stats.holm(acc["mwu_p"]), rtol=0, atol=TIGHT)
    assert (acc["aso_confidence"] == 1 - 0.05 / 3).all() and (acc["better"] == "higher").all()
    assert (an.comparisons.query("metric == 'test_loss'")["better"] == "lower").all()
    main = result.seeds.query("design == 'all' and status == 'completed'")
    direct = _stats.compare(
        main.query("config == 'A'")["test_acc"],
        main.query("config == 'B'")["test_acc"],
        bootstrap_seed=4,
        aso_confidence=1 - 0.05 / 3,
    )
    for key, value in direct.items():
        assert close(acc.iloc[0][key], value), key
    for metric, best_first in (("test_acc", False), ("test_loss", True)):  # noqa: B007 - query reads @metric
        ranked = an.ranking.query("metric == @metric")
        assert list(ranked["rank"]) == [1, 2, 3]
        assert list(ranked["mean"]) == sorted(ranked["mean"], reverse=not best_first)
    # the three configurations trained the same seeds: power is the paired t-test's, one row per pair,
    # at the sd of the differences over the 4 slots both completed (A's seed 2 failed)
    power = an.power.set_index(["config", "metric"]).loc[("A - B", "test_acc")]
    a = main.query("config == 'A'").set_index("seed_index")["test_acc"]
    b = main.query("config == 'B'").set_index("seed_index")["test_acc"].loc[a.index]
    assert power["test"] == "paired t (same seeds)" and power["n"] == 4
    assert close(power["std"], np.std(a.to_numpy() - b.to_numpy(), ddof=1))
    assert close(power["min_detectable_diff"], _stats.min_detectable_difference(power["std"], 4, paired=True))
    assert power["seeds_needed_0.01"] == _stats.seeds_needed(0.01, power["std"], paired=True)


def test_analyse_decomposition(analysed):
    result, an = analysed
    acc = an.decomposition.query("metric == 'test_acc'").set_index("source")
    assert list(acc.index) == ["init", "data", "sum_of_sources", "total"] and set(acc["config"]) == {"A"}
    only_init = result.seeds.query("config == 'A' and design == 'only_init'")["test_acc"]
    assert close(acc.loc["init", "variance"], only_init.var(ddof=1))
    assert close(acc.loc["init", "share"] + acc.loc["data", "share"], 1.0)


def test_analyse_without_decompose_or_curves_keeps_the_columns():
    result = hand_built_result(decompose=False)
    result.curves = result.curves.iloc[:0]
    an = analyse(result, n_resamples=200, bootstrap_seed=9)
    assert an.decomposition.empty and tuple(an.decomposition.columns) == DECOMPOSITION_COLUMNS
    assert an.per_epoch.empty and tuple(an.per_epoch.columns) == PER_EPOCH_COLUMNS
    assert an.settings["bootstrap_seed"] == 9


# --------------------------------------------------------------------------- decomposition designs
def test_decomposition_designs_never_share_a_seed():
    from hfta_nas.stability._design import plan

    plans = plan(6, vary=("init", "data", "dropout"), decompose="sources")
    seen = {}
    for p in plans:
        for source, seed in p.seeds.items():
            seen.setdefault((source, seed), set()).add(p.design)
    shared = {key: designs for key, designs in seen.items() if len(designs) > 1}
    assert not shared  # every design draws its own seeds: independent variance estimates
    assert len({tuple(sorted(p.seeds.items())) for p in plans}) == len(plans)  # no model trained twice


def test_grid_design_crosses_init_with_data():
    from hfta_nas.stability._design import grid_size, plan

    grid = [p for p in plan(16, decompose="grid") if p.design == "grid"]
    k = grid_size(16)
    assert k == 4 and len(grid) == 16
    assert len({p.seeds["init"] for p in grid}) == k and len({p.seeds["data"] for p in grid}) == k
    assert len({(p.seeds["init"], p.seeds["data"]) for p in grid}) == k * k
    assert len({p.seeds["dropout"] for p in grid}) == k * k  # dropout varies per cell: in the residual
    with pytest.raises(HftaNasError, match="vary both"):
        plan(16, vary=("init", "dropout"), decompose="grid")


def test_grid_decomposition_recovers_known_shares():
    """Synthetic grids with init variance 4, data variance 1, residual 0.5: the components are
    unbiased on average and their intervals hold about their level."""
    rng = np.random.default_rng(0)
    truth = {"init": 4.0, "data": 1.0, "init:data+residual": 0.5}
    estimates, hits = {k: [] for k in truth}, {k: 0 for k in truth}
    sims, k = 300, 6
    for _ in range(sims):
        a, b = rng.normal(0, 2.0, k), rng.normal(0, 1.0, k)
        y = a[:, None] + b[None, :] + rng.normal(0, math.sqrt(0.5), (k, k))
        frame = pd.DataFrame({"init": np.repeat(range(k), k), "data": np.tile(range(k), k), "v": y.reshape(-1)})
        for row in _stats.grid_decomposition(frame, ["init", "data"], "v"):
            estimates[row["source"]].append(row["variance"])
            hits[row["source"]] += row["ci_low"] <= truth[row["source"]] <= row["ci_high"]
    for source, value in truth.items():
        assert abs(np.mean(estimates[source]) - value) < 0.2 * value, source
        assert 0.9 <= hits[source] / sims <= 0.995, (source, hits[source] / sims)


# --------------------------------------------------------------------------- modes and failure rates


def widest_gaps(samples):
    return np.nanmax(_stats.studentized_gaps(np.sort(samples, axis=-1)), axis=-1)


@pytest.mark.parametrize("n", [5, 8, 16, 32])
def test_mode_rule_rarely_splits_unimodal_seeds(n):
    """Seeded simulation: the rule's false-positive rate on normal seeds is at most its 1% level
    (up to Monte-Carlo error), and stays low on skewed seeds; docs/stability.md states the rates."""
    rng = np.random.default_rng(n)
    threshold = _stats.mode_threshold(n)
    normal = np.mean(widest_gaps(rng.normal(size=(2000, n))) >= threshold)
    skewed = np.mean(widest_gaps(-rng.gamma(4.0, 1.0, size=(2000, n))) >= threshold)
    assert normal <= 0.02 and skewed <= 0.05, (normal, skewed)


@pytest.mark.parametrize("n", [5, 8, 16, 32])
@pytest.mark.parametrize("bad_share", [0.05, 0.1, 0.2])
def test_mode_rule_finds_a_worse_mode_and_exactly_its_seeds(n, bad_share):
    """Most seeds near 75% (sd 1 point), a minority near 40%: whenever a bad seed is drawn, the
    rule splits the study and the worse mode holds exactly the bad seeds."""
    rng = np.random.default_rng(int(n * 100 * bad_share))
    found = 0
    samples = 0
    for _ in range(150):
        bad = rng.random(n) < bad_share
        if not bad.any() or bad.all():
            continue
        values = np.where(bad, rng.normal(0.40, 0.01, n), rng.normal(0.75, 0.01, n))
        modes = _stats.find_modes(values)
        samples += 1
        found += modes["modes"] == 2 and modes["worse"] == list(np.flatnonzero(bad))
    assert samples > 0 and found == samples


def test_find_modes_reads_worse_in_the_metric_direction_and_handles_degenerate_input(no_warnings):
    losses = np.array([0.3, 0.31, 0.29, 0.30, 2.0])
    modes = _stats.find_modes(losses, higher_is_better=False)
    assert modes["modes"] == 2 and modes["worse"] == [4] and modes["good"] == [0, 1, 2, 3]
    for values in ([], [0.5], [0.5, 0.4, 0.6], [0.7] * 6):  # too few seeds, or no spread: one mode
        assert _stats.find_modes(values)["modes"] == 1
    tied = _stats.find_modes([0.8, 0.8, 0.8, 0.8, 0.5])  # no spread within the modes, a gap between
    assert tied["modes"] == 2 and tied["worse"] == [4]


@pytest.mark.parametrize("k,n", [(0, 8), (1, 8), (3, 10), (8, 8), (17, 40), (0, 1)])
def test_clopper_pearson_matches_scipy(k, n):
    exact = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    low, high = _stats.clopper_pearson(k, n)
    assert close(low, exact.low, 1e-9) and close(high, exact.high, 1e-9)
    upper = stats.binomtest(k, n, alternative="less").proportion_ci(confidence_level=0.95, method="exact").high
    assert close(_stats.clopper_pearson_upper(k, n), upper, 1e-9)


def test_no_failure_in_eight_seeds_still_allows_31_percent():
    rate = _stats.failure_rate(0, 8)
    assert rate["bad_rate"] == 0 and rate["bad_low"] == 0
    assert rate["bad_upper"] == pytest.approx(1 - 0.05 ** (1 / 8)) and round(rate["bad_upper"], 2) == 0.31


def test_seeds_to_see_a_failure():
    assert _stats.seeds_to_see_failure(0.1, 0.9) == 22
    for rate, probability in ((0.1, 0.9), (0.05, 0.95), (0.5, 0.5), (0.2, 0.99)):
        n = _stats.seeds_to_see_failure(rate, probability)
        assert 1 - (1 - rate) ** n >= probability > 1 - (1 - rate) ** (n - 1)
    assert math.isnan(_stats.seeds_to_see_failure(0.0))


@pytest.mark.parametrize("counts", [(0, 8, 3, 8), (2, 16, 9, 16), (5, 5, 0, 7)])
def test_failure_rates_compare_by_fishers_exact_test(counts):
    a, of_a, b, of_b = counts
    expected = stats.fisher_exact([[a, of_a - a], [b, of_b - b]]).pvalue
    assert close(_stats.compare_rates(*counts), expected)
    assert math.isnan(_stats.compare_rates(0, 0, 1, 2))


def test_summarize_counts_seeds_gone_wrong(no_warnings):
    values = np.array([0.75, 0.76, 0.74, 0.40, 0.75, 0.73, 0.70, 0.76])
    row = _stats.summarize(values, n_failed=1, fail_below=0.72, n_resamples=100)
    assert row["modes"] == 2 and row["worse_mode_seeds"] == [3] and row["good_mode_n"] == 7  # a description
    assert row["bad_failed"] == 1 and row["bad_below"] == 2 and row["bad_cut"] == 0.72  # 0.40 and 0.70
    assert (row["bad_n"], row["bad_of"]) == (3, 9)
    assert (row["bad_low"], row["bad_high"]) == pytest.approx(_stats.clopper_pearson(3, 9))
    assert row["good_mode_mean"] == pytest.approx(np.mean(np.delete(values, 3)))
    # without a threshold: more than 10% below the median (0.745 -> 0.6705), so 0.40 only
    row = _stats.summarize(values, n_failed=1, n_resamples=100)
    assert row["bad_cut"] == pytest.approx(0.6705) and row["bad_below"] == 1 and (row["bad_n"], row["bad_of"]) == (2, 9)


def test_three_modes_are_counted_gone_wrong_without_finding_modes(no_warnings):
    """Audit: 11 seeds at 73-76%, 3 at 45-47% and 2 at 10% read "one mode: 61.13% ± 23.03%, 0 of 16".
    The mode rule still sees one gap's worth (a description); the count does not depend on it."""
    values = np.array(
        [0.73, 0.735, 0.74, 0.745, 0.75, 0.75, 0.755, 0.76, 0.76, 0.76, 0.76, 0.45, 0.46, 0.47, 0.10, 0.10]
    )
    row = _stats.summarize(values, n_resamples=200)
    assert (row["bad_n"], row["bad_of"]) == (5, 16) and row["bad_below"] == 5
    assert (row["bad_low"], row["bad_high"]) == pytest.approx(_stats.clopper_pearson(5, 16))
    assert row["median_low"] <= 0.745 <= row["median_high"] and row["median_level"] >= 0.95


# --------------------------------------------------------------------------- paired designs and the grid


def test_compare_paired_matches_scipy(no_warnings):
    rng = np.random.default_rng(5)
    shared = rng.normal(0.8, 0.02, 12)  # what the shared seeds do to both configurations
    a, b = shared + 0.004 + rng.normal(0, 0.003, 12), shared + rng.normal(0, 0.003, 12)
    row = _stats.compare_paired(a, b)
    paired, signed = stats.ttest_rel(a, b), stats.wilcoxon(a, b)
    assert close(row["paired_t"], paired.statistic) and close(row["paired_t_p"], paired.pvalue)
    assert close(row["wilcoxon_p"], signed.pvalue) and row["n_pairs"] == 12
    interval = paired.confidence_interval(0.95)
    assert close(row["paired_diff_low"], interval.low) and close(row["paired_diff_high"], interval.high)
    wins = np.sum(a > b)
    assert row["p_a_better_pairs"] == wins / 12
    assert (row["p_a_better_pairs_low"], row["p_a_better_pairs_high"]) == pytest.approx(
        _stats.clopper_pearson(wins, 12)
    )
    # the shared part cancels: the paired test sees the difference that Welch's does not
    assert paired.pvalue < 0.01 < stats.ttest_ind(a, b, equal_var=False).pvalue
    loss = _stats.compare_paired(-a, -b, higher_is_better=False)
    assert loss["p_a_better_pairs"] == row["p_a_better_pairs"]


def test_crossed_mean_interval_covers_where_the_t_interval_does_not():
    """A 6 x 6 grid whose init and data effects are shared along its rows and columns: treating the
    36 runs as independent covers the true mean far less than 95%; the crossed interval holds."""
    rng = np.random.default_rng(11)
    k, crossed, naive = 6, 0, 0
    for _ in range(300):
        y = rng.normal(0, 1, (k, 1)) + rng.normal(0, 1, (1, k)) + rng.normal(0, 0.5, (k, k))
        frame = pd.DataFrame({"init": np.repeat(range(k), k), "data": np.tile(range(k), k), "y": y.ravel()})
        low, high = _stats.crossed_mean_interval(frame, ["init", "data"], "y")
        crossed += low <= 0 <= high
        low, high = _stats.t_interval(y.ravel())
        naive += low <= 0 <= high
    assert 0.91 <= crossed / 300 <= 0.99 and naive / 300 < 0.75


def test_analyse_uses_paired_methods_only_when_seeds_are_shared(analysed):
    result, an = analysed
    assert an.comparisons["paired"].all()  # hand_built_result gives every config the same seeds
    seeds = result.seeds.copy()
    seeds.loc[seeds["config"] == seeds["config"].iloc[0], "seed_init"] += 1000
    apart = analyse(StabilityResult(seeds, result.curves, result.metadata), n_resamples=100)
    first = seeds["config"].iloc[0]
    involved = (apart.comparisons["a"] == first) | (apart.comparisons["b"] == first)
    assert not apart.comparisons.loc[involved, "paired"].any()
    assert apart.comparisons.loc[involved, "paired_t_p"].isna().all()


# --------------------------------------------------------------------------- paired failure rates


def test_mcnemar_exact_is_a_binomial_test_of_the_discordant_slots(no_warnings):
    # 10 shared seeds: 2 go wrong under both, 4 under A only, 0 under B only, 4 under neither
    bad_a = [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]
    bad_b = [1, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    row = _stats.compare_paired_rates(bad_a, bad_b)
    assert (row["a_only_bad"], row["b_only_bad"]) == (4, 0)
    assert close(row["bad_rate_p"], 2 * 0.5**4)  # two-sided: all 4 discordant slots the same way
    # by hand for 5 against 1: P(X <= 1) + P(X >= 5), X ~ binomial(6, 1/2)
    by_hand = (math.comb(6, 0) + math.comb(6, 1) + math.comb(6, 5) + math.comb(6, 6)) / 2**6
    assert close(_stats.compare_paired_rates([1] * 5 + [0], [0] * 5 + [1])["bad_rate_p"], by_hand)
    assert _stats.compare_paired_rates([1, 0, 1], [1, 0, 1])["bad_rate_p"] == 1.0  # no discordant slot
    assert math.isnan(_stats.compare_paired_rates([], [])["bad_rate_p"])
    with pytest.raises(ValueError, match="as many slots"):
        _stats.compare_paired_rates([1, 0], [1])


def test_mcnemar_sees_what_fisher_misses_when_the_same_seeds_go_wrong():
    """Shared seeds that fail under both configs carry no evidence of a difference; Fisher's test
    counts them as independent draws. 12 of 20 vs 6 of 20, the 6 of B all among A's 12: McNemar
    sees 6 discordant slots all one way (p = 0.031), Fisher 12/20 vs 6/20 (p = 0.11)."""
    bad_a = [1] * 12 + [0] * 8
    bad_b = [1] * 6 + [0] * 14
    mcnemar = _stats.compare_paired_rates(bad_a, bad_b)["bad_rate_p"]
    fisher = _stats.compare_rates(12, 20, 6, 20)
    assert close(mcnemar, 2 * 0.5**6) and mcnemar < 0.05 < fisher


def test_analyse_compares_failure_rates_of_shared_seeds_by_mcnemar(analysed):
    result, an = analysed
    rows = an.comparisons.query("metric == 'test_acc'").set_index(["a", "b"])
    assert (rows["bad_rate_test"] == "McNemar exact (paired)").all()
    # A's seed 2 failed, B and C completed every seed: one discordant slot, A only
    assert (rows.loc[("A", "B"), "a_only_bad"], rows.loc[("A", "B"), "b_only_bad"]) == (1, 0)
    assert rows.loc[("A", "B"), "bad_rate_p"] == 1.0  # binomial(1, 1/2): one slot proves nothing
    summary = an.summary.set_index(["config", "design", "metric"])
    for (a, b), row in rows.iterrows():  # the discordant counts agree with each config's bad_n
        bad_a, bad_b = summary.loc[(a, "all", "test_acc"), "bad_n"], summary.loc[(b, "all", "test_acc"), "bad_n"]
        assert row["a_only_bad"] - row["b_only_bad"] == bad_a - bad_b
    seeds = result.seeds.copy()
    seeds.loc[seeds["config"] == "A", "seed_init"] += 1000  # A no longer shares seeds with B and C
    apart = analyse(StabilityResult(seeds, result.curves, result.metadata), n_resamples=100)
    row = apart.comparisons.query("metric == 'test_acc' and a == 'A' and b == 'B'").iloc[0]
    assert row["bad_rate_test"] == "Fisher exact" and math.isnan(row["a_only_bad"])
    assert close(row["bad_rate_p"], _stats.compare_rates(1, 5, 0, 5))


# --------------------------------------------------------------------------- which source moves seeds between modes


def test_mode_follows_levels_is_exact():
    k = 5
    init, data = np.repeat(range(k), k), np.tile(range(k), k)
    one_init = init == 2  # every run of init seed 2 is in the worse mode, across all data seeds
    follows = _stats.mode_follows_levels(one_init, init)
    assert (follows["worse_n"], follows["levels_with_worse"], follows["levels"]) == (5, 1, 5)
    assert close(follows["p"], 5 / math.comb(25, 5))  # only the 5 ways of filling one level are as crowded
    assert _stats.mode_follows_levels(one_init, data)["p"] == 1.0  # one run per data seed: as even as can be
    assert _stats.mode_follows_levels((init == 2) & (data == 0), init)["p"] == 1.0  # one worse run cannot crowd
    assert math.isnan(_stats.mode_follows_levels([], [])["p"])


def test_mode_follows_levels_matches_brute_force_enumeration():
    """Unequal levels (a grid with failed runs left out): every placement of the worse runs counted."""
    levels = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 3, 3])
    worse = np.zeros(levels.size, dtype=bool)
    worse[[0, 1, 2, 7]] = True

    def crowding(mask):
        return sum(np.sum(mask[levels == v]) ** 2 / np.sum(levels == v) for v in np.unique(levels))

    observed = crowding(worse)
    placements = list(itertools.combinations(range(levels.size), int(worse.sum())))
    as_crowded = 0
    for chosen in placements:
        mask = np.zeros(levels.size, dtype=bool)
        mask[list(chosen)] = True
        as_crowded += crowding(mask) >= observed - 1e-12
    assert close(_stats.mode_follows_levels(worse, levels)["p"], as_crowded / len(placements))


def grid_result(worse_cells, k=5, seed=3):
    """One config's k x k init x data grid: runs near 80% accuracy, the cells in `worse_cells`
    (init level, data level) near 40%."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(k):
        for j in range(k):
            centre = 0.40 if (i, j) in worse_cells else 0.80
            acc = centre + rng.normal(0, 0.01)
            row = {"config": "A", "seed_index": i * k + j, "design": "grid", "seed_init": 100 + i}
            row |= {"seed_data": 200 + j, "seed_dropout": 300 + i * k + j, "status": "completed", "epochs": 3}
            rows.append(row | {"test_acc": acc, "test_loss": 2 - acc, "train_acc": acc, "train_loss": 2 - acc})
    seeds = pd.DataFrame(rows, columns=[*SEED_COLUMNS, *METRICS])
    return StabilityResult(seeds, pd.DataFrame(columns=list(CURVE_COLUMNS)), {"n_test": 1000})


@pytest.mark.parametrize(
    ("worse_cells", "verdict"),
    [
        ({(1, j) for j in range(5)} | {(3, j) for j in range(5)}, "the worse mode follows the init seed"),
        ({(i, 4) for i in range(5)}, "the worse mode follows the data seed"),
        ({(0, 1), (2, 3), (4, 0)}, "the worse mode follows neither seed on its own"),
    ],
)
def test_analyse_says_which_seed_the_worse_mode_follows_on_a_grid(worse_cells, verdict):
    an = analyse(grid_result(worse_cells), n_resamples=100)
    rows = an.mode_sources.query("metric == 'test_acc'").set_index("source")
    assert list(rows.index) == ["init", "data"] and (rows["method"] == "grid").all()
    assert rows["verdict"].str.startswith(verdict + ":").all()
    assert (rows["worse_n"] == len(worse_cells)).all() and (rows["runs"] == 25).all()
    loss = an.mode_sources.query("metric == 'test_loss'")  # the worse mode of a loss is the higher one
    assert loss["verdict"].str.startswith(verdict + ":").all()


def test_analyse_without_a_worse_mode_has_no_mode_sources():
    an = analyse(grid_result(set()), n_resamples=100)
    assert an.mode_sources.empty and tuple(an.mode_sources.columns) == MODE_SOURCE_COLUMNS


def test_analyse_says_which_one_at_a_time_design_moves_runs_between_modes():
    """Main design: 2 of 8 seeds in a worse mode; only_init has runs in both modes, only_data none
    in the worse one: the worse mode follows init."""
    rows = []
    values = {
        "all": [0.8, 0.81, 0.4, 0.79, 0.8, 0.41, 0.8, 0.82],
        "only_init": [0.8, 0.4, 0.81, 0.79, 0.42, 0.8, 0.8, 0.81],
        "only_data": [0.8, 0.81, 0.79, 0.8, 0.8, 0.82, 0.79, 0.8],
    }
    for design, accs in values.items():
        for i, acc in enumerate(accs):
            row = {"config": "A", "seed_index": i, "design": design, "seed_init": 100 + i, "seed_data": 200 + i}
            row |= {"seed_dropout": 300, "status": "completed", "epochs": 3, "test_acc": acc}
            rows.append(row | {"test_loss": 2 - acc, "train_acc": acc, "train_loss": 2 - acc})
    seeds = pd.DataFrame(rows, columns=[*SEED_COLUMNS, *METRICS])
    result = StabilityResult(seeds, pd.DataFrame(columns=list(CURVE_COLUMNS)), {"n_test": 1000})
    found = analyse(result, n_resamples=100).mode_sources.query("metric == 'test_acc'").set_index("source")
    assert found.loc["init", "worse_n"] == 2 and found.loc["data", "worse_n"] == 0
    assert found["verdict"].iloc[0] == (
        "the worse mode follows init (runs in both modes when it alone varies): "
        "init alone: 2 of 8 runs in the worse mode; data alone: 0 of 8 runs in the worse mode"
    )


@pytest.mark.parametrize(
    ("worse_cells", "unit", "bad"),
    [
        ({(1, j) for j in range(5)} | {(3, j) for j in range(5)}, "init seed", 2),  # 10 runs, 2 init seeds
        ({(i, 4) for i in range(5)}, "data seed", 1),  # 5 runs, all of data seed 4
        (set(), "init seed", 0),
    ],
)
def test_a_grid_counts_seeds_gone_wrong_per_independent_unit(worse_cells, unit, bad):
    """Audit: a 4x4 grid printed "0 of 16 ... up to 17%", its runs taken as independent seeds. Runs
    that share an init (or data) seed are one unit: the exact interval is over the 5 units."""
    row = analyse(grid_result(worse_cells), n_resamples=100).summary.set_index("metric").loc["test_acc"]
    assert row["bad_unit"] == unit and (row["bad_n"], row["bad_of"]) == (bad, 5)
    assert row["bad_below"] == len(worse_cells)  # the runs behind the count
    assert (row["bad_low"], row["bad_high"]) == pytest.approx(_stats.clopper_pearson(bad, 5))
    assert row["headline"].endswith(f"{bad} of 5 {unit}s gone wrong") or "; a gap:" in row["headline"]


@pytest.mark.parametrize("n", [1, 2, 5, 6, 8, 9, 16, 17, 33, 64])
def test_the_medians_interval_is_the_exact_order_statistic_one(n):
    """[x_(k), x_(n+1-k)] holds the median unless fewer than k values fall below it or above it; its
    level, summed from the binomial by hand, is the largest k's that reaches 95% (the range below 6)."""
    from hfta_nas.stability._robust import median_interval

    x = np.random.default_rng(n).normal(size=n)
    figures = median_interval(x)

    def level(k: int) -> float:
        return sum(math.comb(n, j) for j in range(k, n - k + 1)) / 2**n

    reaching = [k for k in range(1, n // 2 + 1) if level(k) >= 0.95]
    k = reaching[-1] if reaching else 1
    assert figures["level"] == pytest.approx(level(k) if n >= 2 else 0.0, abs=1e-12)
    assert (figures["low"], figures["high"]) == (np.sort(x)[k - 1], np.sort(x)[n - k])
    assert figures["median"] == np.median(x)
