"""Array optimizers and schedules against torch.optim / lr_scheduler, slot by slot."""

import pytest
import torch
from torch import nn

import hfta_nas
from hfta_nas import HftaNasError
from hfta_nas.optim import LRSchedule

SEEDS = [3, 1, 4]


def make_model():
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def batches(steps, dtype):
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(len(SEEDS), 5, 6, generator=g, dtype=dtype), torch.randint(0, 3, (len(SEEDS), 5), generator=g))
        for _ in range(steps)
    ]


def train_array(opt_cls, per_slot, shared, dtype, steps=12, schedule=None):
    arr = hfta_nas.ModelArray.from_factory(make_model, seeds=SEEDS, dtype=dtype)
    opt = opt_cls(arr, **per_slot, **shared)
    sched = LRSchedule(opt, **schedule) if schedule else None
    for x, y in batches(steps, dtype):
        logits = arr(x)
        loss = sum(nn.functional.cross_entropy(logits[b], y[b]) for b in range(len(arr)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if sched:
            sched.step()
    return arr


def train_reference(slot, opt_cls, per_slot, shared, dtype, steps=12, schedule=None):
    torch.manual_seed(SEEDS[slot])
    model = make_model().to(dtype)
    kwargs = {k: (v[slot] if not isinstance(v, tuple) else tuple(x[slot] for x in v)) for k, v in per_slot.items()}
    opt = opt_cls(model.parameters(), **kwargs, **shared)
    sched = schedule(opt, slot) if schedule else None
    for x, y in batches(steps, dtype):
        loss = nn.functional.cross_entropy(model(x[slot]), y[slot])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if sched:
            sched.step()
    return model


def assert_slots_match(arr, models, rtol):
    """Every tensor of every slot within rtol, relative to the tensor's scale."""
    for slot, model in enumerate(models):
        for key, value in model.state_dict().items():
            got = arr.slot_state_dict(slot)[key]
            scale = value.abs().max().item() if value.is_floating_point() else 0.0
            torch.testing.assert_close(got, value, rtol=rtol, atol=rtol * scale)


CASES = [
    ("SGD", {"lr": [0.1, 0.05, 0.2]}, {}),
    (
        "SGD",
        {
            "lr": [0.1, 0.05, 0.2],
            "momentum": [0.0, 0.9, 0.5],
            "dampening": [0.0, 0.1, 0.3],
            "weight_decay": [0.0, 1e-2, 1e-3],
        },
        {},
    ),
    ("SGD", {"lr": [0.1, 0.05, 0.2], "momentum": [0.9, 0.8, 0.5]}, {"nesterov": True}),
    ("Adam", {"lr": [1e-2, 3e-3, 3e-2], "weight_decay": [0.0, 0.1, 0.01]}, {}),
    (
        "Adam",
        {"lr": [1e-2, 3e-3, 3e-2], "betas": ([0.9, 0.8, 0.5], [0.999, 0.99, 0.9]), "eps": [1e-8, 1e-6, 1e-3]},
        {"amsgrad": True},
    ),
    ("Adam", {"lr": [1e-2, 3e-3, 3e-2]}, {"maximize": True}),
    ("AdamW", {"lr": [1e-2, 3e-3, 3e-2], "weight_decay": [0.0, 0.1, 0.01]}, {}),
    ("RMSprop", {"lr": [1e-2, 3e-3, 3e-2], "alpha": [0.99, 0.9, 0.5]}, {}),
    (
        "RMSprop",
        {"lr": [1e-2, 3e-3, 3e-2], "momentum": [0.0, 0.9, 0.5], "weight_decay": [0.0, 0.1, 0.0]},
        {"centered": True},
    ),
    (
        "Adagrad",
        {
            "lr": [1e-2, 3e-2, 1e-1],
            "lr_decay": [0.0, 0.1, 0.01],
            "initial_accumulator_value": [0.0, 0.1, 1.0],
            "weight_decay": [0.0, 0.1, 0.0],
        },
        {},
    ),
]


@pytest.mark.parametrize("name,per_slot,shared", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_optimizer_matches_torch_per_slot(name, per_slot, shared, dtype, rtol):
    arr = train_array(getattr(hfta_nas.optim, name), per_slot, shared, dtype)
    refs = [train_reference(b, getattr(torch.optim, name), per_slot, shared, dtype) for b in range(len(SEEDS))]
    assert_slots_match(arr, refs, rtol)


def _torch_schedule(kind, args, warmup):
    def build(opt, slot):
        a = {k: v[slot] for k, v in args.items()}
        main = {
            "constant": lambda: torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0),
            "step": lambda: torch.optim.lr_scheduler.StepLR(opt, step_size=int(a["step_size"]), gamma=a["gamma"]),
            "exponential": lambda: torch.optim.lr_scheduler.ExponentialLR(opt, gamma=a["gamma"]),
            "cosine": lambda: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=a["t_max"], eta_min=a["eta_min"]),
        }[kind[slot]]
        w = warmup[slot]
        if w == 0:
            return main()
        warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=a["warmup_start_factor"], total_iters=w)
        return torch.optim.lr_scheduler.SequentialLR(opt, [warm, main()], milestones=[w])

    return build


SCHEDULES = [
    ["constant", "constant", "constant"],
    ["step", "step", "step"],
    ["exponential", "cosine", "step"],
    ["cosine", "cosine", "cosine"],
]


@pytest.mark.parametrize("kinds", SCHEDULES, ids=["-".join(k) for k in SCHEDULES])
@pytest.mark.parametrize("warmup", [[0, 0, 0], [3, 0, 2]], ids=["nowarmup", "warmup"])
def test_schedule_lr_sequence_matches_torch(kinds, warmup):
    args = {
        "step_size": [2, 3, 1],
        "gamma": [0.5, 0.9, 0.7],
        "t_max": [5, 7, 4],
        "eta_min": [0.0, 1e-3, 1e-2],
        "warmup_start_factor": [0.1, 0.5, 0.25],
    }
    lrs = [0.1, 0.05, 0.2]
    arr = hfta_nas.ModelArray.from_factory(make_model, seeds=SEEDS, dtype=torch.float64)
    opt = hfta_nas.optim.SGD(arr, lr=lrs)
    sched = LRSchedule(opt, kinds, warmup_steps=warmup, **args)
    build = _torch_schedule(kinds, args, warmup)
    torch_opts = [torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=lr) for lr in lrs]
    torch_scheds = [build(o, b) for b, o in enumerate(torch_opts)]
    for _ in range(15):
        expected = [o.param_groups[0]["lr"] for o in torch_opts]
        torch.testing.assert_close(opt.hparams["lr"], torch.tensor(expected, dtype=torch.float64), rtol=1e-10, atol=0)
        for o, s in zip(torch_opts, torch_scheds):
            o.step()
            s.step()
        sched.step()


def test_training_with_schedule_matches_torch():
    per_slot = {"lr": [0.1, 0.05, 0.2], "momentum": [0.9, 0.0, 0.5]}
    kinds = ["step", "cosine", "exponential"]
    args = {
        "step_size": [2, 3, 1],
        "gamma": [0.5, 0.9, 0.7],
        "t_max": [5, 7, 4],
        "eta_min": [0.0, 1e-3, 1e-2],
        "warmup_start_factor": [0.1, 0.5, 0.25],
    }
    warmup = [2, 0, 3]
    arr = train_array(
        hfta_nas.optim.SGD, per_slot, {}, torch.float64, schedule={"kind": kinds, "warmup_steps": warmup, **args}
    )
    refs = [
        train_reference(b, torch.optim.SGD, per_slot, {}, torch.float64, schedule=_torch_schedule(kinds, args, warmup))
        for b in range(3)
    ]
    assert_slots_match(arr, refs, 1e-10)


def test_bad_hyperparameters_are_refused():
    arr = hfta_nas.ModelArray.from_factory(make_model, seeds=SEEDS)
    with pytest.raises(HftaNasError, match="has 2 values but the array has 3 slots"):
        hfta_nas.optim.Adam(arr, lr=[0.1, 0.2])
    with pytest.raises(HftaNasError, match="'lr' must be finite and >= 0"):
        hfta_nas.optim.SGD(arr, lr=-1.0)
    with pytest.raises(HftaNasError, match="beta1"):
        hfta_nas.optim.Adam(arr, betas=(1.5, 0.9))
    with pytest.raises(HftaNasError, match="unknown arguments \\['momentum'\\]"):
        hfta_nas.optim.Adam(arr, momentum=0.9)
    with pytest.raises(HftaNasError, match="unknown schedule 'linear'"):
        LRSchedule(hfta_nas.optim.SGD(arr), "linear")
