"""The packing's cost model: a measured curve of step seconds against array size."""

import pytest
import torch

from hfta_nas.models import model_factory
from hfta_nas.search import StepCost, StepCurve, cost_from_dict
from hfta_nas.search._cost import KNEE_GAIN, measure_step_cost

# per-step seconds of arrays of 1..16 slots: per-slot cost falls to 8 slots, then rises (a cache outgrown)
CURVE = StepCurve(macs=1000, sizes=(1, 2, 4, 8, 16), step_s=(1.0, 1.2, 1.6, 2.4, 6.0), fixed_share=0.25, array_s=0.5)


def test_the_curve_interpolates_between_measured_sizes_and_extends_its_last_segment():
    assert CURVE.step_seconds(4, 1000) == pytest.approx(1.6)
    assert CURVE.step_seconds(3, 1000) == pytest.approx(1.4)  # halfway between 2 and 4
    assert CURVE.step_seconds(12, 1000) == pytest.approx(4.2)
    assert CURVE.step_seconds(32, 1000) == pytest.approx(6.0 + (6.0 - 2.4) * 2)


def test_a_smaller_envelope_saves_only_the_share_that_scales_with_arithmetic():
    full = CURVE.step_seconds(8, 1000)
    assert CURVE.step_seconds(8, 0) == pytest.approx(0.25 * full)  # the fixed share stays
    assert CURVE.step_seconds(8, 500) == pytest.approx((0.25 + 0.75 * 0.5) * full)
    # the packing's form: multiply-adds over all slots, the slot count
    assert CURVE.seconds(8 * 500, batch_size=100, slots=8) == pytest.approx(CURVE.step_seconds(8, 500))


def test_the_knee_is_the_smallest_size_within_knee_gain_of_the_best_throughput():
    assert CURVE.knee == 8  # 4 steps 2.5 models a second, 8 steps 3.3 (the best), 16 steps 2.7
    late = StepCurve(1000, (1, 2, 4, 8), (1.0, 1.9, 2.5, 4.8), 0.0, 0.0)
    assert late.knee == 4  # two hardly pays (1.05x one's throughput), four does (1.6x): not stopped at 1
    flat = StepCurve(1000, (1, 2, 4), (1.0, 2.0 / KNEE_GAIN * 1.01, 4.0), 0.0, 0.0)
    assert flat.knee == 1
    rising = StepCurve(1000, (1, 2, 4), (1.0, 1.0, 1.0), 0.0, 0.0)
    assert rising.knee == 4


def test_costs_round_trip_through_their_dicts():
    assert cost_from_dict(CURVE.as_dict()) == CURVE
    line = StepCost(0.001, 0.2)
    assert cost_from_dict(line.as_dict()) == line
    assert line.array_s == 0.0 and line.seconds(1e9, 1, slots=4) == pytest.approx(0.201)


def test_a_measured_curve_stops_doubling_past_its_knee_and_keeps_the_global_random_state():
    factory = model_factory("mlp", {"depth": 1, "width": 8}, input_shape=(4,), num_classes=3)
    before = torch.random.get_rng_state()
    curve = measure_step_cost(
        factory,
        100,
        input_shape=(4,),
        num_classes=3,
        batch_size=8,
        dtype=torch.float32,
        optimizer="sgd",
        device=torch.device("cpu"),
        slots=4,
    )
    assert torch.equal(torch.random.get_rng_state(), before)
    assert curve.sizes[0] == 1 and list(curve.sizes) == sorted(curve.sizes) and curve.sizes[-1] <= 4
    assert all(s > 0 for s in curve.step_s) and 0.0 <= curve.fixed_share <= 1.0
    # an array's set-up is timed where arrays hold more than one model (a busy machine may measure no gain)
    assert (curve.array_s > 0) == (curve.knee > 1)


def test_a_curve_that_dips_was_measured_under_load():
    assert CURVE.steady
    busy = StepCurve(macs=1000, sizes=(1, 2, 4), step_s=(1.0, 0.6, 1.6), fixed_share=0.25, array_s=0.5)
    assert not busy.steady  # two slots cannot step in 60% of one slot's time: the first size was slowed


def _tiny_search(n_trials, tmp_path, monkeypatch):
    import optuna

    import hfta_nas
    from hfta_nas.data import load_dataset

    monkeypatch.setenv("HFTA_NAS_CACHE_DIR", str(tmp_path / "cache"))  # cold: nothing measured before
    digits = load_dataset("digits")

    def build(trial):
        width = trial.suggest_categorical("width", [16, 32])
        factory = model_factory("mlp", {"depth": 1, "width": width}, input_shape=digits.input_shape, num_classes=10)
        return hfta_nas.Candidate(factory, hparams={"lr": 3e-3}, epochs=1, batch_size=64)

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    hfta_nas.optimize(study, build, digits, n_trials=n_trials, seed=1)
    return study


def test_the_step_curve_is_measured_only_as_far_as_the_budget_can_use(tmp_path, monkeypatch):
    """auto never takes more than a third of the budget per array, so the curve stops there: 6 trials
    measure arrays of 1 and 2, not up to the memory limit (64)."""
    study = _tiny_search(6, tmp_path, monkeypatch)
    curves = [cost_from_dict(v) for k, v in study.user_attrs.items() if k.startswith("step_cost:")]
    assert curves and all(max(curve.sizes) <= 2 for curve in curves), [c.sizes for c in curves]


def test_a_curve_measured_under_load_is_used_but_not_kept(tmp_path, monkeypatch, caplog):
    import hfta_nas.search._optimize as optimize_module

    busy = StepCurve(macs=1000, sizes=(1, 2), step_s=(1e-3, 5e-4), fixed_share=0.25, array_s=1e-3)
    monkeypatch.setattr(optimize_module, "measure_step_cost", lambda *args, **kwargs: busy)  # a busy machine's
    with caplog.at_level("WARNING"):
        _tiny_search(3, tmp_path, monkeypatch)
    assert "measured under load" in caplog.text
    cache = tmp_path / "cache" / "step_costs.json"
    assert not cache.exists() or "step_s" not in cache.read_text()
