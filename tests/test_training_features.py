"""Per-slot gradient clipping, gradient accumulation and early stopping, each against the
same model trained alone with plain PyTorch (float64)."""

import pytest
import torch
from conftest import synthetic_dataset
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import hfta_nas
from hfta_nas import ArrayTrainer, EarlyStopping, HftaNasError, ModelArray
from tests.test_trainer import BATCH, DATA_SEEDS, INIT_SEEDS, assert_equivalent, conv_bn_model

CLIP_NORMS = [0.05, float("inf"), 0.5, 0.01]  # inf: this slot does not clip
CLIP_VALUES = [0.01, 0.002, float("inf"), 0.05]


def plain(
    slot,
    data,
    opt_name,
    hparams,
    *,
    epochs=3,
    clip_norm=None,
    clip_value=None,
    accumulate=1,
    stopping=None,
    factory=conv_bn_model,
):
    """One model alone: a shuffling DataLoader, torch.optim, torch.nn.utils.clip_grad_*_; returns
    (model, epochs trained)."""
    torch.manual_seed(INIT_SEEDS[slot])
    model = factory().double()
    opt = getattr(torch.optim, opt_name)(model.parameters(), **{k: v[slot] for k, v in hparams.items()})
    loader = DataLoader(
        TensorDataset(data.x_train, data.y_train),
        batch_size=BATCH,
        shuffle=True,
        generator=torch.Generator().manual_seed(DATA_SEEDS[slot]),
    )
    best, since = None, 0
    for epoch in range(1, epochs + 1):
        model.train()
        for number, (x, y) in enumerate(loader):
            if number % accumulate == 0:
                opt.zero_grad()
            (F.cross_entropy(model(x), y) / accumulate).backward()
            if (number + 1) % accumulate == 0 or number + 1 == len(loader):
                if clip_value is not None and clip_value[slot] != float("inf"):
                    torch.nn.utils.clip_grad_value_(model.parameters(), clip_value[slot])
                if clip_norm is not None and clip_norm[slot] != float("inf"):
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm[slot])
                opt.step()
        if stopping is not None:
            model.eval()
            with torch.no_grad():
                value = F.cross_entropy(model(data.x_val), data.y_val).item()
            if best is None or value < best - stopping.min_delta:
                best, since = value, 0
            else:
                since += 1
            if since >= stopping.patience:
                return model, epoch
    return model, epochs


def array_run(data, opt_name, hparams, *, epochs=3, accumulate=1, stopping=None, factory=conv_bn_model):
    arr = ModelArray.from_factory(factory, seeds=INIT_SEEDS, dtype=torch.float64)
    opt = getattr(hfta_nas.optim, opt_name)(arr, **hparams)
    trainer = ArrayTrainer(
        arr, opt, data, batch_size=BATCH, data_seeds=DATA_SEEDS, accumulate=accumulate, early_stopping=stopping
    )
    return arr, trainer.fit(epochs)


@pytest.mark.parametrize(
    "opt_name, hparams",
    [
        ("SGD", {"lr": [0.5, 0.5, 0.2, 1.0], "momentum": [0.9, 0.0, 0.5, 0.9]}),
        ("Adam", {"lr": [1e-2, 3e-3, 3e-2, 1e-3]}),
    ],
)
def test_per_slot_clip_norm_equals_clip_grad_norm_on_each_model(tiny_data, opt_name, hparams):
    arr, _ = array_run(tiny_data, opt_name, {**hparams, "clip_norm": CLIP_NORMS})
    refs = [plain(b, tiny_data, opt_name, hparams, clip_norm=CLIP_NORMS)[0] for b in range(4)]
    assert_equivalent(arr, refs, 1e-10)
    unclipped = [plain(b, tiny_data, opt_name, hparams)[0] for b in range(4)]
    # the clipping bites: a clipping slot ends elsewhere than without it; the inf slot does not
    assert not torch.allclose(refs[0][0].weight, unclipped[0][0].weight)
    assert torch.equal(refs[1][0].weight, unclipped[1][0].weight)


def test_per_slot_clip_value_and_both_equal_torch(tiny_data):
    hparams = {"lr": [0.3, 0.5, 0.2, 1.0]}
    arr, _ = array_run(tiny_data, "SGD", {**hparams, "clip_value": CLIP_VALUES, "clip_norm": CLIP_NORMS})
    refs = [plain(b, tiny_data, "SGD", hparams, clip_value=CLIP_VALUES, clip_norm=CLIP_NORMS)[0] for b in range(4)]
    assert_equivalent(arr, refs, 1e-10)


def test_clip_norm_of_slots_of_different_sizes_ignores_the_padding():
    """Padded into one envelope, each slot's norm is still its own model's."""
    data = synthetic_dataset(n_train=48, shape=(10,))
    widths = [4, 16, 9]
    run = hfta_nas.train(
        "mlp",
        slot_model_configs=[{"width": w, "depth": 2} for w in widths],
        dataset=data,
        seeds=[0, 1, 2],
        optimizer="sgd",
        hparams={"lr": 0.5, "clip_norm": 0.05},
        epochs=2,
        batch_size=16,
        dtype="float64",
    )
    for slot in range(len(widths)):
        torch.manual_seed(slot)
        model = run.slot_factories[slot]().double()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        loader = DataLoader(
            TensorDataset(data.x_train, data.y_train),
            batch_size=16,
            shuffle=True,
            generator=torch.Generator().manual_seed(slot),
        )
        for _ in range(2):
            for x, y in loader:
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
                opt.step()
        state = run.array.slot_state_dict(slot)
        for key, expected in model.state_dict().items():
            torch.testing.assert_close(state[key], expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("accumulate", [2, 3])
def test_gradient_accumulation_equals_the_plain_loop(tiny_data, accumulate):
    """60 samples in batches of 16: 4 micro-batches per epoch, so k=3 ends each epoch on a partial step."""
    hparams = {"lr": [1e-2, 3e-3, 3e-2, 1e-3]}
    arr, _ = array_run(tiny_data, "Adam", hparams, accumulate=accumulate)
    refs = [plain(b, tiny_data, "Adam", hparams, accumulate=accumulate)[0] for b in range(4)]
    assert_equivalent(arr, refs, 1e-10)


def test_early_stopping_stops_each_slot_where_it_would_alone(tiny_data):
    hparams = {"lr": [0.3, 0.01, 0.1, 0.03]}  # some slots overfit fast, some slowly
    stopping = EarlyStopping("val_loss", patience=2)
    arr, results = array_run(tiny_data, "SGD", hparams, epochs=12, stopping=stopping)
    stopped = []
    for slot in range(4):
        model, epochs = plain(slot, tiny_data, "SGD", hparams, epochs=12, stopping=stopping)
        assert results[slot].epochs == epochs
        assert results[slot].status == "completed"
        stopped.append(epochs < 12)
        if epochs < 12:
            assert results[slot].reason == "early stopped: val_loss did not improve for 2 epochs"
    assert any(stopped) and not all(stopped), "the case should mix stopped and full-length slots"


def test_bad_training_options_are_clear_errors(tiny_data):
    arr = ModelArray.from_factory(conv_bn_model, seeds=[0, 1], dtype=torch.float64)
    with pytest.raises(HftaNasError, match="clip_norm' must be > 0"):
        hfta_nas.optim.SGD(arr, lr=0.1, clip_norm=[1.0, 0.0])
    opt = hfta_nas.optim.SGD(arr, lr=0.1)
    with pytest.raises(HftaNasError, match="accumulate must be a positive integer"):
        ArrayTrainer(arr, opt, tiny_data, accumulate=0, data_seeds=[0, 1])
    with pytest.raises(HftaNasError, match="patience must be an integer >= 1"):
        EarlyStopping(patience=0)
    trainer = ArrayTrainer(arr, opt, tiny_data, data_seeds=[0, 1], early_stopping=EarlyStopping("val_f1"))
    with pytest.raises(HftaNasError, match="'val_f1', which is not measured"):
        trainer.fit(1)


def test_a_row_clip_equals_torch_clip_on_one_model():
    # the clipping reference itself: torch's clip on one model equals our row clip of a one-slot array
    model = nn.Linear(3, 2).double()
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    grads = torch.cat([p.grad.flatten() for p in model.parameters()]).unsqueeze(0).clone()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    from hfta_nas.optim._optimizer import clip_slot_gradients

    clip_slot_gradients(grads, None, torch.tensor([0.1], dtype=torch.float64))
    torch.testing.assert_close(grads[0], torch.cat([p.grad.flatten() for p in model.parameters()]), rtol=1e-14, atol=0)


def test_early_stopping_maximises_accuracy_and_r2_by_default():
    assert EarlyStopping("val_acc").maximize and EarlyStopping("val_r2").maximize
    assert not EarlyStopping("val_rmse").maximize and not EarlyStopping("val_loss").maximize
    assert not EarlyStopping("val_r2", mode="min").maximize
