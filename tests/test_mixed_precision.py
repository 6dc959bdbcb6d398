"""Mixed precision through the array: bf16 autocast reaches every fused layer, and per-slot loss
scaling follows torch.amp.GradScaler on each model alone (one slot's overflow skips only its step)."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import hfta_nas
from hfta_nas import ArrayTrainer, ModelArray
from hfta_nas.optim import SlotGradScaler
from tests.test_trainer import BATCH, DATA_SEEDS, INIT_SEEDS, conv_bn_model

# float32 with scales near its limit and the loss times 100: scaled gradients overflow in some
# slots and steps and not in others (as float16's do at 2^16), so slots skip steps and back off
# at different times, and the comparison with torch is exact to float32 rounding.
INIT_SCALE, GROWTH_INTERVAL, EPOCHS, LOUD = 2.0**120, 2, 3, 100.0
LR = [0.1, 0.05, 0.2, 0.02]


def test_per_slot_loss_scaling_equals_a_grad_scaler_per_model(tiny_data):
    arr = ModelArray.from_factory(conv_bn_model, seeds=INIT_SEEDS, dtype=torch.float32)
    opt = hfta_nas.optim.SGD(arr, lr=LR, momentum=0.9)
    scaler = SlotGradScaler(opt, init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    trainer = ArrayTrainer(arr, opt, tiny_data.to(dtype=torch.float32), batch_size=BATCH, data_seeds=DATA_SEEDS)
    skipped = torch.zeros(4, dtype=torch.long)
    for index in [step for _ in range(EPOCHS) for step in trainer.order.next_epoch()]:
        x, y = tiny_data.x_train.float()[index], tiny_data.y_train[index]
        losses = trainer.slot_losses(arr(x), y) * LOUD
        opt.zero_grad()
        scaler.scale(losses).sum().backward()
        scaler.step()
        skipped += scaler.found_inf.long()
        scaler.update()
    assert skipped.min() > 0 and len(set(skipped.tolist())) > 1, f"slots should skip different steps: {skipped}"

    for slot in range(4):
        torch.manual_seed(INIT_SEEDS[slot])
        model = conv_bn_model()
        alone = torch.optim.SGD(model.parameters(), lr=LR[slot], momentum=0.9)
        reference = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)
        loader = DataLoader(
            TensorDataset(tiny_data.x_train.float(), tiny_data.y_train),
            batch_size=BATCH,
            shuffle=True,
            generator=torch.Generator().manual_seed(DATA_SEEDS[slot]),
        )
        for _ in range(EPOCHS):
            for x, y in loader:
                alone.zero_grad()
                reference.scale(F.cross_entropy(model(x), y) * LOUD).backward()
                reference.step(alone)
                reference.update()
        assert scaler.scales[slot].item() == reference.get_scale()
        state = arr.slot_state_dict(slot)
        for key, value in model.state_dict().items():
            torch.testing.assert_close(
                state[key], value, rtol=1e-4, atol=1e-5, msg=lambda m, slot=slot, key=key: f"slot {slot} {key}: {m}"
            )


def test_bf16_autocast_reaches_the_fused_layers():
    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        models.append(
            nn.Sequential(
                nn.Conv1d(1, 64, 3, padding=1), nn.BatchNorm1d(64), nn.ReLU(), nn.Flatten(), nn.Linear(64 * 64, 5)
            )
        )
    arr = ModelArray(models)
    x = torch.randn(3, 20, 1, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = arr(x)
        alone = [model(x[b]) for b, model in enumerate(models)]
    assert out.dtype == torch.bfloat16  # the array's output in autocast's dtype, as each model's
    for b in range(3):  # bf16 has 8 bits of mantissa: equal to its rounding (the fused kernels sum in another order)
        torch.testing.assert_close(out[b].float(), alone[b].float(), rtol=2e-2, atol=2e-2)
    out.float().sum().backward()
    assert arr.flat.grad.dtype == torch.float32 and torch.isfinite(arr.flat.grad).all()  # float32 master weights


def test_the_trainer_trains_in_bf16_and_fp16(tiny_data):
    runs = {
        precision: hfta_nas.train(
            conv_bn_model,
            dataset=tiny_data,
            seeds=[0, 1, 2],
            epochs=3,
            batch_size=16,
            dtype="float32",
            precision=precision,
        )
        for precision in ("float32", "bf16", "fp16")
    }
    for precision in ("bf16", "fp16"):
        for slot in range(3):
            low, full = runs[precision].results[slot].final, runs["float32"].results[slot].final
            assert abs(low["val_loss"] - full["val_loss"]) < 0.05, (precision, slot, low, full)
    assert runs["float32"].array.flat.dtype == runs["bf16"].array.flat.dtype == torch.float32  # float32 master weights
    import pytest

    with pytest.raises(hfta_nas.HftaNasError, match="precision must be one of float32, bf16, fp16"):
        hfta_nas.train(conv_bn_model, dataset=tiny_data, seeds=[0], epochs=1, precision="fp8")


def test_precision_is_a_setting_of_spaces_and_configs(tmp_path):
    from hfta_nas.search_spaces import ResolvedConfig
    from tests.test_search import search, space_text

    summary = search(
        tmp_path,
        space_text(
            budget={"n_trials": 2},
            training={"epochs": 1, "precision": "bf16", "optimizer": {"name": "adam", "lr": 1e-3}},
        ),
    )
    assert summary.trials == {"COMPLETE": 2}
    exported = ResolvedConfig.from_file(tmp_path / "out" / "best_config.yaml")
    assert exported.precision == "bf16" and exported.train_kwargs()["precision"] == "bf16"
    plain = ResolvedConfig.from_yaml("model: mlp\ndataset: digits\n")
    assert plain.precision == "float32" and "precision" not in plain.to_yaml()  # written only where set


# ------------------------------------------------ a skipped first step leaves no optimizer state
# Optimizers whose update reads the parameters through weight decay write state even from a
# zero gradient, so a slot that kept the state of a step torch skipped would train differently.
SKIP_OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {"lr": 0.01}),
    "adamw": (torch.optim.AdamW, {"lr": 0.01}),
    "rmsprop": (torch.optim.RMSprop, {"lr": 0.01, "momentum": 0.5}),
    "adagrad": (torch.optim.Adagrad, {"lr": 0.1, "initial_accumulator_value": 0.1}),
}
SKIP_SEEDS, SKIP_STEPS = [0, 1, 2], 5


def skip_model():
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))


def skip_batches():
    g = torch.Generator().manual_seed(0)
    count = len(SKIP_SEEDS)
    return [
        (torch.randn(count, 8, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (count, 8), generator=g))
        for _ in range(SKIP_STEPS)
    ]


def overflow(skipping, step):
    """Per-slot loss multipliers: inf (the scaled gradient overflows) where a slot skips this step."""
    return [float("inf") if step == 0 and slot in skipping else 1.0 for slot in range(len(SKIP_SEEDS))]


@pytest.mark.parametrize("skipping", [{0, 2}, {0, 1, 2}], ids=["some-slots", "all-slots"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1], ids=["no-decay", "decay"])
@pytest.mark.parametrize("name", sorted(SKIP_OPTIMIZERS))
def test_a_skipped_first_step_leaves_the_optimizer_as_torch_does(name, weight_decay, skipping):
    torch_class, kwargs = SKIP_OPTIMIZERS[name]
    kwargs = {**kwargs, "weight_decay": weight_decay}
    arr = ModelArray.from_factory(skip_model, seeds=SKIP_SEEDS, dtype=torch.float64)
    opt = hfta_nas.optim.OPTIMIZERS[name](arr, **kwargs)
    scaler = SlotGradScaler(opt, init_scale=4.0)
    for step, (x, y) in enumerate(skip_batches()):
        logits = arr(x)
        losses = torch.stack([F.cross_entropy(logits[b], y[b]) for b in range(len(arr))])
        opt.zero_grad()
        (scaler.scale(losses) * torch.tensor(overflow(skipping, step), dtype=losses.dtype)).sum().backward()
        scaler.step()
        assert scaler.found_inf.tolist() == [slot in skipping and step == 0 for slot in range(len(arr))]
        scaler.update()

    for slot, seed in enumerate(SKIP_SEEDS):
        torch.manual_seed(seed)
        model = skip_model().double()
        alone = torch_class(model.parameters(), **kwargs)
        reference = torch.amp.GradScaler("cpu", init_scale=4.0)
        for step, (x, y) in enumerate(skip_batches()):
            alone.zero_grad()
            loss = F.cross_entropy(model(x[slot]), y[slot]) * overflow(skipping, step)[slot]
            reference.scale(loss).backward()
            reference.step(alone)
            reference.update()
        assert scaler.scales[slot].item() == reference.get_scale()
        for key, value in model.state_dict().items():
            torch.testing.assert_close(arr.slot_state_dict(slot)[key], value, rtol=1e-10, atol=1e-12)
