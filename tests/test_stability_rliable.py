"""The report's IQM, stratified bootstrap, performance profile and probability of improvement
equal rliable's (Agarwal et al. 2021) on the same scores.

Skipped only when rliable cannot be imported: rliable 1.2.0 pins arch<8, and every arch 7 fails
to import under pandas 3 (arch.univariate calls pandas' deprecate_kwarg with the old signature),
so `pip install .[dev]` with pandas 3 installs an rliable that does not import; with arch 8
installed beside it (`pip install --no-deps arch==8.0.0`, as .ci/run does: pip warns of the pin)
rliable imports, and CI runs these tests. arch 8
renamed the bootstrap's random_state argument, so rliable's own get_interval_estimates fails
there: the bootstrap test draws its resamples through rliable's StratifiedBootstrap.update_indices
and takes arch's percentile interval (np.percentile) of rliable's aggregate_iqm on them.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from hfta_nas.stability import _robust, _stats

try:
    from rliable import library as rly
    from rliable import metrics
except (ImportError, TypeError) as error:  # TypeError: arch 7 under pandas 3 (see above)
    pytest.skip(f"rliable does not import here: {error}", allow_module_level=True)


def seeds_in_three_modes(rng: np.random.Generator, n: int) -> np.ndarray:
    """70% of seeds near 75%, 15% near 45%, 15% near chance: the audit's three-mode study."""
    which = rng.choice(3, n, p=[0.7, 0.15, 0.15])
    return np.choose(which, [rng.normal(0.75, 0.01, n), rng.normal(0.45, 0.01, n), rng.normal(0.10, 0.01, n)])


@pytest.mark.parametrize("shape", [(16, 1), (7, 3), (64, 1)])
def test_iqm_equals_rliables(shape):
    scores = np.random.default_rng(sum(shape)).normal(size=shape)
    assert _robust.iqm(scores) == pytest.approx(metrics.aggregate_iqm(scores), abs=1e-15)


@pytest.mark.parametrize("shape", [(10, 1), (6, 4)])
def test_stratified_bootstrap_interval_equals_rliables_draws(shape):
    """The same resamples (numpy's legacy generator, seeded alike) give the same percentile interval."""
    scores = np.random.default_rng(3).normal(size=shape)
    reps = 400
    rliables = SimpleNamespace(
        _num_items=shape[0],
        _args_shape=shape,
        _task_bootstrap=False,
        _strata_indices=rly.StratifiedBootstrap._get_strata_indices(SimpleNamespace(_args_shape=shape)),
    )
    np.random.seed(11)  # rliable draws from numpy's global generator
    values = [metrics.aggregate_iqm(scores[rly.StratifiedBootstrap.update_indices(rliables)]) for _ in range(reps)]
    expected = np.percentile(values, [2.5, 97.5])  # arch's 'percentile' interval
    ours = _robust.stratified_bootstrap(scores, reps=reps, rng=np.random.RandomState(11))
    assert ours == pytest.approx(tuple(expected), abs=1e-15)


def test_the_reports_iqm_interval_agrees_with_rliables_within_monte_carlo_error():
    """With the report's own generator (numpy's default) the interval differs from rliable's only by
    resampling noise: the ends agree to a few bootstrap standard errors of a 2.5% quantile."""
    scores = seeds_in_three_modes(np.random.default_rng(5), 32)
    ours = np.array(_robust.stratified_bootstrap(scores, reps=4000, rng=1))
    np.random.seed(2)
    rliables = SimpleNamespace(
        _num_items=32,
        _args_shape=(32, 1),
        _task_bootstrap=False,
        _strata_indices=rly.StratifiedBootstrap._get_strata_indices(SimpleNamespace(_args_shape=(32, 1))),
    )
    column = scores.reshape(-1, 1)
    values = [metrics.aggregate_iqm(column[rly.StratifiedBootstrap.update_indices(rliables)]) for _ in range(4000)]
    theirs = np.percentile(values, [2.5, 97.5])
    spread = np.std(values)
    assert np.all(np.abs(ours - theirs) < 0.2 * spread)


def test_performance_profile_equals_rliables():
    scores = seeds_in_three_modes(np.random.default_rng(9), 24)
    taus = np.linspace(0.0, 1.0, 41)
    # create_performance_profile's point profile (its band needs the bootstrap arch 8 breaks; ours is DKW's)
    points = {"a": rly.score_distributions(scores.reshape(-1, 1), taus)}
    ours = _robust.performance_profile(scores, taus)
    np.testing.assert_array_equal(ours["share"], points["a"])
    half = _robust.dkw_half_width(24)
    assert half == pytest.approx(np.sqrt(np.log(2 / 0.05) / 48))
    np.testing.assert_allclose(ours["low"], np.clip(points["a"] - half, 0, 1))
    np.testing.assert_allclose(ours["high"], np.clip(points["a"] + half, 0, 1))


@pytest.mark.parametrize("ties", [False, True])
def test_probability_of_improvement_equals_rliables(ties):
    rng = np.random.default_rng(4)
    a, b = rng.normal(0.76, 0.02, 12), rng.normal(0.75, 0.02, 9)
    if ties:
        a, b = np.round(a, 2), np.round(b, 2)  # ties count half in both
    expected = metrics.probability_of_improvement(a.reshape(-1, 1), b.reshape(-1, 1))
    assert float(_stats.prob_greater(a, b)) == pytest.approx(expected, abs=1e-15)
    assert _stats.compare(a, b)["p_a_better"] == pytest.approx(expected, abs=1e-15)
