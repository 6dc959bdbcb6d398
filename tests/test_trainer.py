"""End-to-end equivalence of ArrayTrainer with plain PyTorch, slot by slot (contract 1),
slot independence (contract 2) and surgery."""

import copy

import pytest
import torch
from conftest import synthetic_dataset
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import hfta_nas
from hfta_nas import ArrayTrainer, HftaNasError, ModelArray
from hfta_nas.optim import LRSchedule

INIT_SEEDS = [3, 1, 4, 1]
DATA_SEEDS = [10, 11, 12, 13]
EPOCHS = 3
BATCH = 16  # 60 samples: the last batch of every epoch is partial


def conv_bn_model():
    # No conv bias before BatchNorm: its true gradient is zero, so its float
    # noise (~1e-17) is all that adaptive optimizers would amplify.
    return nn.Sequential(
        nn.Conv1d(2, 4, 3, padding=1, bias=False),
        nn.BatchNorm1d(4),
        nn.ReLU(),
        nn.MaxPool1d(2),
        nn.Flatten(),
        nn.Linear(4 * 6, 8),
        nn.LayerNorm(8),
        nn.GELU(),
        nn.Linear(8, 3),
    )


OPTIMIZERS = {
    "SGD": {"lr": [0.1, 0.05, 0.02, 0.2], "momentum": [0.9, 0.0, 0.5, 0.9], "weight_decay": [0.0, 1e-3, 0.0, 1e-2]},
    "Adam": {"lr": [1e-2, 3e-3, 3e-2, 1e-3], "weight_decay": [0.0, 1e-2, 0.0, 1e-3]},
    "AdamW": {"lr": [1e-2, 3e-3, 3e-2, 1e-3], "weight_decay": [0.0, 1e-1, 1e-2, 1e-3]},
    "RMSprop": {"lr": [1e-3, 3e-3, 1e-2, 1e-3], "momentum": [0.0, 0.5, 0.9, 0.0]},
    "Adagrad": {"lr": [1e-2, 3e-2, 1e-1, 1e-2], "lr_decay": [0.0, 0.01, 0.1, 0.0]},
}
SCHEDULE = {
    "kind": ["step", "cosine", "exponential", "constant"],
    "step_size": [1, 2, 1, 1],
    "gamma": [0.5, 0.5, 0.8, 0.5],
    "t_max": [3, 3, 3, 3],
    "eta_min": [0.0, 1e-4, 0.0, 0.0],
    "warmup_steps": [0, 1, 0, 2],
    "warmup_start_factor": [0.5, 0.2, 0.5, 0.1],
}


def torch_schedule(opt, slot):
    a = {k: v[slot] for k, v in SCHEDULE.items()}
    lr_scheduler = torch.optim.lr_scheduler
    main = {
        "step": lambda: lr_scheduler.StepLR(opt, a["step_size"], a["gamma"]),
        "cosine": lambda: lr_scheduler.CosineAnnealingLR(opt, a["t_max"], a["eta_min"]),
        "exponential": lambda: lr_scheduler.ExponentialLR(opt, a["gamma"]),
        "constant": lambda: lr_scheduler.ConstantLR(opt, factor=1.0),
    }[a["kind"]]
    if a["warmup_steps"] == 0:
        return main()
    warm = lr_scheduler.LinearLR(opt, start_factor=a["warmup_start_factor"], total_iters=a["warmup_steps"])
    return lr_scheduler.SequentialLR(opt, [warm, main()], milestones=[a["warmup_steps"]])


def train_plain(slot, data, opt_name, hparams, dtype, factory=conv_bn_model, schedule=True):
    """One model alone: torch.optim, lr_scheduler and a shuffling DataLoader."""
    torch.manual_seed(INIT_SEEDS[slot])
    model = factory().to(dtype)
    opt = getattr(torch.optim, opt_name)(model.parameters(), **{k: v[slot] for k, v in hparams.items()})
    sched = torch_schedule(opt, slot) if schedule else None
    loader = DataLoader(
        TensorDataset(data.x_train, data.y_train),
        batch_size=BATCH,
        shuffle=True,
        generator=torch.Generator().manual_seed(DATA_SEEDS[slot]),
    )
    for _ in range(EPOCHS):
        model.train()
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if sched:
            sched.step()
    return model


def train_array(
    data, opt_name, hparams, dtype, factory=conv_bn_model, schedule=True, seeds=INIT_SEEDS, data_seeds=DATA_SEEDS
):
    arr = ModelArray.from_factory(factory, seeds=seeds, dtype=dtype)
    opt = getattr(hfta_nas.optim, opt_name)(arr, **hparams)
    sched = LRSchedule(opt, **SCHEDULE) if schedule else None
    trainer = ArrayTrainer(arr, opt, data, batch_size=BATCH, data_seeds=data_seeds, schedule=sched)
    results = trainer.fit(EPOCHS)
    return arr, results


def assert_equivalent(arr, models, rtol):
    for slot, model in enumerate(models):
        state = arr.slot_state_dict(slot)
        assert list(state) == list(model.state_dict())
        for key, expected in model.state_dict().items():
            scale = expected.abs().max().item() if expected.is_floating_point() else 0.0
            torch.testing.assert_close(
                state[key],
                expected,
                rtol=rtol,
                atol=rtol * scale,
                msg=lambda m, slot=slot, key=key: f"slot {slot} {key}: {m}",
            )


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-10), (torch.float32, 1e-5)], ids=["float64", "float32"])
def test_array_training_equals_plain_pytorch(opt_name, dtype, rtol):
    data = synthetic_dataset(dtype=dtype)
    arr, results = train_array(data, opt_name, OPTIMIZERS[opt_name], dtype)
    refs = [train_plain(b, data, opt_name, OPTIMIZERS[opt_name], dtype) for b in range(len(INIT_SEEDS))]
    assert_equivalent(arr, refs, rtol)  # parameters AND BatchNorm running stats / num_batches_tracked
    assert all(r.status == "completed" and r.epochs == EPOCHS for r in results.values())


def slot_model(arr, slot, factory=conv_bn_model):
    """Slot `slot` of `arr` as its own float64 model, in eval mode."""
    model = factory().double()
    model.load_state_dict(arr.slot_state_dict(slot))
    return model.eval()


def test_reported_metrics_equal_plain_evaluation(tiny_data):
    arr, results = train_array(tiny_data, "Adam", OPTIMIZERS["Adam"], torch.float64)
    for slot in range(len(arr)):
        with torch.no_grad():
            logits = slot_model(arr, slot)(tiny_data.x_val)
        final = results[slot].final
        assert final["val_loss"] == pytest.approx(F.cross_entropy(logits, tiny_data.y_val).item(), rel=1e-12)
        assert final["val_acc"] == pytest.approx(
            (logits.argmax(1) == tiny_data.y_val).double().mean().item(), rel=1e-12
        )
        assert len(results[slot].history) == EPOCHS and "test_acc" in final


def test_shared_order_equals_plain_pytorch(tiny_data):
    hp = {"lr": [1e-2, 3e-3, 3e-2, 1e-3]}
    arr = ModelArray.from_factory(conv_bn_model, seeds=INIT_SEEDS, dtype=torch.float64)
    trainer = ArrayTrainer(arr, hfta_nas.optim.Adam(arr, **hp), tiny_data, batch_size=BATCH, shared_order_seed=7)
    trainer.fit(EPOCHS)
    global DATA_SEEDS
    saved, DATA_SEEDS = DATA_SEEDS, [7] * 4
    try:
        refs = [train_plain(b, tiny_data, "Adam", hp, torch.float64, schedule=False) for b in range(4)]
    finally:
        DATA_SEEDS = saved
    assert_equivalent(arr, refs, 1e-10)


def test_diverging_slot_fails_alone(tiny_data):
    """Slot 1 gets a huge lr and goes NaN: it is reported failed, the others are
    bit-identical to a run where slot 1 was sane, and equal a run without it."""
    sane = {"lr": [0.05, 0.05, 0.02, 0.1]}
    crazy = {"lr": [0.05, 1e30, 0.02, 0.1]}
    arr_sane, _ = train_array(tiny_data, "SGD", sane, torch.float64, schedule=False)
    arr_crazy, results = train_array(tiny_data, "SGD", crazy, torch.float64, schedule=False)
    assert results[1].status == "failed" and "non-finite" in results[1].reason
    assert all(results[b].status == "completed" for b in (0, 2, 3))
    for slot in (0, 2, 3):
        for key, value in arr_sane.slot_state_dict(slot).items():
            assert torch.equal(arr_crazy.slot_state_dict(slot)[key], value), key
    without = [0, 2, 3]
    arr_without, _ = train_array(
        tiny_data,
        "SGD",
        {"lr": [0.05, 0.02, 0.1]},
        torch.float64,
        schedule=False,
        seeds=[INIT_SEEDS[b] for b in without],
        data_seeds=[DATA_SEEDS[b] for b in without],
    )
    for new, old in enumerate(without):
        for key, value in arr_without.slot_state_dict(new).items():
            torch.testing.assert_close(arr_crazy.slot_state_dict(old)[key], value, rtol=1e-12, atol=1e-12)


def test_drop_and_replace_equal_a_fresh_array_of_survivors(tiny_data):
    """Train 2 epochs, drop slot 1 and replace slot 2 with a fresh model, train 1 more:
    survivors equal a fresh array trained 3 epochs; the newcomer equals a fresh 1-epoch run."""
    hp = {"lr": [1e-2, 3e-3, 3e-2, 1e-3]}
    arr = ModelArray.from_factory(conv_bn_model, seeds=INIT_SEEDS, dtype=torch.float64)
    opt = hfta_nas.optim.Adam(arr, **hp)
    sched = LRSchedule(opt, "step", step_size=1, gamma=0.5)
    trainer = ArrayTrainer(arr, opt, tiny_data, batch_size=BATCH, data_seeds=DATA_SEEDS, schedule=sched)
    trainer.fit(2)
    trainer.results = {k: copy.copy(v) for k, v in trainer.results.items()}
    for r in trainer.results.values():
        r.status = "running"
    trainer.stop([1])
    torch.manual_seed(99)
    newcomer = conv_bn_model().double()
    trainer.replace(2, "new", newcomer, data_seed=42, dropout_seed=5, hparams={"lr": 5e-3})
    assert trainer.slot_ids == [0, "new", 3] and len(arr) == 3 and len(opt.steps) == 3
    trainer.fit(1)

    survivors = ModelArray.from_factory(conv_bn_model, seeds=[INIT_SEEDS[0], INIT_SEEDS[3]], dtype=torch.float64)
    s_opt = hfta_nas.optim.Adam(survivors, lr=[hp["lr"][0], hp["lr"][3]])
    s_sched = LRSchedule(s_opt, "step", step_size=1, gamma=0.5)
    ArrayTrainer(
        survivors, s_opt, tiny_data, batch_size=BATCH, data_seeds=[DATA_SEEDS[0], DATA_SEEDS[3]], schedule=s_sched
    ).fit(3)
    for new, old in [(0, 0), (1, 2)]:
        for key, value in survivors.slot_state_dict(new).items():
            torch.testing.assert_close(arr.slot_state_dict(old)[key], value, rtol=1e-12, atol=1e-12)

    fresh = ModelArray.from_factory(conv_bn_model, seeds=[99], dtype=torch.float64, dropout_seeds=[5])
    f_opt = hfta_nas.optim.Adam(fresh, lr=5e-3)
    f_sched = LRSchedule(f_opt, "step", step_size=1, gamma=0.5)
    ArrayTrainer(fresh, f_opt, tiny_data, batch_size=BATCH, data_seeds=[42], schedule=f_sched).fit(1)
    for key, value in fresh.slot_state_dict(0).items():
        torch.testing.assert_close(arr.slot_state_dict(1)[key], value, rtol=1e-12, atol=1e-12)


def test_callback_can_prune_and_refill(tiny_data):
    arr = ModelArray.from_factory(conv_bn_model, seeds=[0, 1, 2], dtype=torch.float64)
    trainer = ArrayTrainer(arr, hfta_nas.optim.Adam(arr, lr=1e-2), tiny_data, batch_size=BATCH)
    seen = []

    def on_epoch(report, tr):
        seen.append(sorted(map(str, report.metrics)))
        if report.epoch == 1:
            tr.stop([0], reason="pruned")
            torch.manual_seed(7)
            tr.replace(1, "refill", conv_bn_model(), data_seed=3, hparams={"lr": 1e-3})

    results = trainer.fit(2, on_epoch=on_epoch)
    assert results[0].status == "stopped" and results[0].reason == "pruned" and results[0].epochs == 1
    assert results[1].status == "stopped" and results[2].status == "completed" and results[2].epochs == 2
    assert results["refill"].status == "completed" and results["refill"].epochs == 2
    assert seen == [["0", "1", "2"], ["2", "refill"], ["refill"]]


def test_trainer_rejects_bad_arguments(tiny_data):
    arr = ModelArray.from_factory(conv_bn_model, seeds=[0, 1])
    other = ModelArray.from_factory(conv_bn_model, seeds=[0, 1])
    opt = hfta_nas.optim.SGD(arr, lr=0.1)
    with pytest.raises(HftaNasError, match="different ModelArray"):
        ArrayTrainer(other, opt, tiny_data)
    with pytest.raises(HftaNasError, match="not both"):
        ArrayTrainer(arr, opt, tiny_data, data_seeds=[0, 1], shared_order_seed=3)
    with pytest.raises(HftaNasError, match="epochs must be a non-negative integer"):
        ArrayTrainer(arr, opt, tiny_data).fit(-1)


def test_per_slot_splits_equal_training_each_slot_on_its_own_split(tiny_data):
    """Slot b with split seed s trains on its own partition of the train + validation samples and is
    validated on the rest: exactly a plain run on a Dataset holding that partition (float64)."""
    from dataclasses import replace

    from hfta_nas.data import pooled, slot_splits

    seeds, split_seeds = [3, 1, 4], [11, None, 12]
    run = hfta_nas.train(
        conv_bn_model,
        dataset=tiny_data,
        seeds=seeds,
        data_seeds=DATA_SEEDS[:3],
        dropout_seeds=seeds,
        split_seeds=split_seeds,
        epochs=2,
        batch_size=BATCH,
        dtype="float64",
    )
    pool, splits = pooled(tiny_data), slot_splits(tiny_data, split_seeds)
    assert splits.train.shape == (3, len(tiny_data.y_train)) and splits.val.shape == (3, len(tiny_data.y_val))
    assert not torch.equal(splits.val[0], splits.val[2])  # two seeds, two partitions
    for b in range(3):
        own = replace(
            tiny_data,
            x_train=pool.x_train[splits.train[b]],
            y_train=pool.y_train[splits.train[b]],
            x_val=pool.x_train[splits.val[b]],
            y_val=pool.y_train[splits.val[b]],
        )
        if split_seeds[b] is None:  # the data's own split, row for row
            assert torch.equal(own.x_train, tiny_data.x_train) and torch.equal(own.x_val, tiny_data.x_val)
        alone = hfta_nas.train(
            conv_bn_model,
            dataset=own,
            seeds=[seeds[b]],
            data_seeds=[DATA_SEEDS[b]],
            dropout_seeds=[seeds[b]],
            epochs=2,
            batch_size=BATCH,
            dtype="float64",
        )
        for mine, reference in zip(run.results[b].history, alone.results[0].history):
            for key in ("train_loss", "val_loss", "val_acc", "test_loss", "test_acc"):
                assert mine[key] == pytest.approx(reference[key], rel=1e-10, abs=1e-12), (b, key)
