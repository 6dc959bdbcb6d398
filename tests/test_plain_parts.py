"""The plain loop's settings-dependent parts (benchmarks/_plain_parts.py) train as the engine does:
schedules against the engine's LRSchedule, losses against its Objective for one slot, metrics
against scikit-learn, early stopping against its EarlyStopping; what it cannot write is refused."""

import dataclasses

import pytest
import torch
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score
from torch import nn

import hfta_nas
from benchmarks._plain_parts import PlainEarlyStopping, plain_loss, plain_metric, plain_schedule, refuse_unlike
from hfta_nas import EarlyStopping, Objective, SlotResult
from hfta_nas.optim import LRSchedule

SCHEDULES = [
    {"kind": "constant"},
    {"kind": "step", "step_size": 3, "gamma": 0.5},
    {"kind": "exponential", "gamma": 0.8},
    {"kind": "cosine", "t_max": 7, "eta_min": 1e-3},
]
DEFAULTS = {"step_size": 1, "gamma": 0.1, "t_max": 1, "eta_min": 0.0, "warmup_start_factor": 1 / 3}


@pytest.mark.parametrize("schedule", SCHEDULES, ids=[s["kind"] for s in SCHEDULES])
@pytest.mark.parametrize("warmup", [0, 3])
def test_plain_schedule_sets_the_engine_schedules_learning_rates(schedule, warmup):
    full = {**DEFAULTS, **schedule, "warmup_steps": warmup, "warmup_start_factor": 0.2}
    array = hfta_nas.ModelArray.from_factory(lambda: nn.Linear(2, 1), seeds=[0], dtype=torch.float64)
    engine = LRSchedule(hfta_nas.optim.SGD(array, lr=0.1), **full)
    plain_optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1, dtype=torch.float64))], lr=0.1)
    plain = plain_schedule(plain_optimizer, full)
    for _ in range(12):
        assert plain_optimizer.param_groups[0]["lr"] == pytest.approx(engine.optimizer.hparams["lr"].item(), rel=1e-12)
        plain_optimizer.step()
        if plain is not None:
            plain.step()
        engine.step()


@pytest.mark.parametrize(
    "loss",
    [
        None,
        {"name": "cross_entropy", "label_smoothing": 0.1, "class_weights": [1.0, 2.0, 0.5]},
        {"name": "mse"},
        {"name": "mae"},
        {"name": "huber", "delta": 0.3},
    ],
    ids=["cross_entropy", "weighted_smoothed", "mse", "mae", "huber"],
)
def test_plain_loss_is_the_engines_loss_for_one_model(loss):
    generator = torch.Generator().manual_seed(0)
    classify = loss is None or loss["name"] == "cross_entropy"
    output = torch.randn(16, 3 if classify else 1, generator=generator, dtype=torch.float64)
    target = torch.randint(0, 3, (16,), generator=generator) if classify else torch.randn(16, dtype=torch.float64)
    spec = dict(loss or {"name": "cross_entropy"})
    objective = Objective(spec.pop("name"), **spec)
    total, count = objective.slot_losses(output.unsqueeze(0), target.unsqueeze(0))
    assert plain_loss(loss)(output, target).item() == pytest.approx((total / count).item(), rel=1e-12)


def test_plain_regression_metrics_are_scikit_learns():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(40, 3, generator=generator, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + 0.3 * torch.randn(40, generator=generator)
    model = nn.Linear(3, 1).double()
    data = dataclasses.make_dataclass("Data", ["x_val", "y_val"])(x, y)
    with torch.no_grad():
        predicted = model(x).squeeze(-1).numpy()
    expected = {
        "val_rmse": mean_squared_error(y.numpy(), predicted) ** 0.5,
        "val_mae": mean_absolute_error(y.numpy(), predicted),
        "val_r2": r2_score(y.numpy(), predicted),
        "val_loss": mean_squared_error(y.numpy(), predicted),
    }
    for metric, value in expected.items():
        assert plain_metric(model, data, metric, {"name": "mse"}) == pytest.approx(value, rel=1e-12), metric


@pytest.mark.parametrize("metric,min_delta", [("val_rmse", 0.0), ("val_acc", 0.01)])
def test_plain_early_stopping_stops_at_the_engines_epoch(metric, min_delta):
    values = [0.5, 0.4, 0.41, 0.395, 0.45, 0.39, 0.42, 0.43, 0.44, 0.38]
    plain = PlainEarlyStopping(metric, patience=2, min_delta=min_delta)
    engine, result = EarlyStopping(metric, patience=2, min_delta=min_delta), SlotResult(0)
    stops = [(plain.stalled({metric: v}, None, None, None), engine.update(result, v)) for v in values]
    assert [p for p, _ in stops] == [e for _, e in stops] and any(e for _, e in stops)


def test_what_the_plain_loop_does_not_write_is_refused_by_name():
    @dataclasses.dataclass
    class Config:
        accumulate: int = 1
        augment: dict | None = None
        precision: str = "float32"
        hparam_schedule: dict | None = None

    refuse_unlike(Config())
    with pytest.raises(SystemExit, match="training.precision"):
        refuse_unlike(Config(precision="bf16"))
    with pytest.raises(SystemExit, match="training.accumulate"):
        refuse_unlike(Config(accumulate=2))
    with pytest.raises(SystemExit, match="losses only"):
        plain_loss({"name": "mse", "masked": True})
