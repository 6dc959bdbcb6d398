"""Where fusion does not pay, a search trains as plain Optuna would: arrays of one, and no step-cost
measuring past the sizes that decide it (issue 43: never slower than plain).

The step timer is replaced by a fixed cost model (seconds proportional to the array's size: an array of
two steps exactly as long as two models alone), so the decision is tested without a clock."""

import optuna
import pytest
import torch

import hfta_nas
from hfta_nas.data import load_dataset
from hfta_nas.models import model_factory
from hfta_nas.search._cost import KNEE_GAIN, measure_step_cost

STEP_S = 0.01  # one model's step in the fake timer


@pytest.fixture
def timed(monkeypatch):
    """The array sizes (and model factories) the step-cost measurement times, in the order timed; each
    step costs STEP_S per model, unless a test sets `gain[size]` (throughput at `size` over one model's)."""
    calls: list[tuple[int, object]] = []
    gain: dict[int, float] = {}

    def fake_in_turns(arrays, *args, **kwargs):
        calls.extend((slots, factory) for factory, slots in arrays)
        return [STEP_S * slots / gain.get(slots, 1.0) for _, slots in arrays]

    monkeypatch.setattr("hfta_nas.search._cost.interleaved_step_seconds", fake_in_turns)
    built = []
    monkeypatch.setattr("hfta_nas.search._cost._array_seconds", lambda *a, **k: built.append(1) or 0.5)
    return calls, gain, built


def _measure(smallest=None):
    factory = model_factory("mlp", {"depth": 1, "width": 8}, input_shape=(4,), num_classes=3)
    return measure_step_cost(
        factory,
        100,
        input_shape=(4,),
        num_classes=3,
        batch_size=8,
        dtype=torch.float32,
        optimizer="sgd",
        device=torch.device("cpu"),
        slots=16,
        smallest=smallest,
    )


def test_no_gain_at_two_and_four_stops_the_measurement_there(timed):
    calls, _, built = timed
    small = model_factory("mlp", {"depth": 1, "width": 4}, input_shape=(4,), num_classes=3)
    curve = _measure(smallest=(small, 50))
    assert [size for size, _ in calls] == [1, 2, 2, 4]  # each size in turns with the one before; no 8
    assert all(factory is not small for _, factory in calls)  # no step of the smallest model
    assert built == []  # no array built to time its set-up: arrays of one pay per trial, as plain does
    assert curve.knee == 1 and curve.sizes == (1, 2, 4) and curve.array_s == 0.0
    assert curve.step_s == pytest.approx((STEP_S, 2 * STEP_S, 4 * STEP_S))
    assert curve.fixed_share == 0.0  # two steps cost two: nothing shared


def test_an_array_of_four_that_pays_where_two_do_not_is_measured_and_chosen(timed):
    calls, gain, built = timed
    gain.update({2: 1.05, 4: 1.6, 8: 1.65, 16: 1.65})  # as a small 1-D CNN measured on this CPU
    curve = _measure()
    assert [size for size, _ in calls] == [1, 2, 2, 4, 4, 8, 8, 16]  # 4 -> 8 and 8 -> 16 gain too little
    assert curve.knee == 4 and built == [1]


def test_a_gain_at_two_measures_on_to_the_knee(timed):
    calls, gain, built = timed
    gain.update({2: KNEE_GAIN * 1.2, 4: KNEE_GAIN * 1.3, 8: KNEE_GAIN * 1.3, 16: KNEE_GAIN * 1.3})
    curve = _measure()
    assert [size for size, _ in calls] == [1, 2, 2, 4, 4, 8]  # two doublings past the knee (2)
    assert curve.knee == 2 and built == [1]


def test_a_search_where_fusion_does_not_pay_trains_every_trial_alone(timed, tmp_path, monkeypatch):
    calls, _, built = timed
    monkeypatch.setenv("HFTA_NAS_CACHE_DIR", str(tmp_path / "cache"))
    digits = load_dataset("digits")

    def build(trial):
        lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)
        factory = model_factory("mlp", {"depth": 1, "width": 16}, input_shape=digits.input_shape, num_classes=10)
        return hfta_nas.Candidate(factory, hparams={"lr": lr}, epochs=1, batch_size=64)

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    n_trials = 19
    first_round = 7  # the pool asked before any structure's curve is known: a third of the budget
    summary = hfta_nas.optimize(study, build, digits, n_trials=n_trials, seed=1)
    assert summary.trials == {"COMPLETE": n_trials}
    assert [(a["array_size"], a["slots"]) for a in summary.arrays] == [(1, 1)] * n_trials  # one at a time
    assert [size for size, _ in calls] == [1, 2, 2, 4] and built == []  # measured once, to the sizes that decided it
    # after the first round, each trial is asked once every earlier one is told: as study.optimize asks
    trials = study.get_trials()
    assert all(t.datetime_start < trials[0].datetime_complete for t in trials[:first_round])
    for later in trials[first_round:]:
        assert all(earlier.datetime_complete <= later.datetime_start for earlier in trials[: later.number])
