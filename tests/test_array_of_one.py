"""An array of one slot trains as its model alone (issue 43): it runs the user's module without vmap,
and ends where torch.optim and a shuffling DataLoader take the same model (float64), also when it
became an array of one by dropping slots mid-training."""

import pytest
import torch
from conftest import synthetic_dataset
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import hfta_nas
from hfta_nas import ArrayTrainer, ModelArray

INIT_SEED, DATA_SEED = 3, 10
EPOCHS, BATCH = 3, 16  # 60 samples: the last batch of every epoch is partial
HPARAMS = {"SGD": {"lr": 0.1, "momentum": 0.9}, "AdamW": {"lr": 1e-2, "weight_decay": 1e-1}}


class Residual(nn.Module):
    """A user's own module (not a Sequential): stem, a residual block with BatchNorm, pooling, head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv1d(2, 4, 3, padding=1)
        self.block = nn.Sequential(nn.Conv1d(4, 4, 3, padding=1, bias=False), nn.BatchNorm1d(4), nn.ReLU())
        self.head = nn.Linear(4 * 6, 3)

    def forward(self, x):
        x = self.stem(x).relu()
        x = F.max_pool1d(x + self.block(x), 2)
        return self.head(x.flatten(1))


def plain(data, opt_name):
    """The model alone: torch.optim and a shuffling DataLoader from the same seeds."""
    torch.manual_seed(INIT_SEED)
    model = Residual().double()
    optimizer = getattr(torch.optim, opt_name)(model.parameters(), **HPARAMS[opt_name])
    loader = DataLoader(
        TensorDataset(data.x_train, data.y_train),
        batch_size=BATCH,
        shuffle=True,
        generator=torch.Generator().manual_seed(DATA_SEED),
    )
    for _ in range(EPOCHS):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    return model


def assert_slot_is(array, slot, model):
    state = array.slot_state_dict(slot)
    for key, expected in model.state_dict().items():
        torch.testing.assert_close(state[key], expected, rtol=1e-10, atol=1e-12, msg=lambda m, key=key: f"{key}: {m}")


def test_an_array_of_ones_forward_and_backward_are_the_models_own_bit_for_bit():
    """Without vmap the slot computes with torch's own layers: in float32 its output, every gradient
    and BatchNorm's running stats equal those of the model alone exactly, not only to rounding."""
    torch.manual_seed(INIT_SEED)
    model = Residual()
    array = ModelArray([Residual()])
    array.load_slot(0, model.state_dict())
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(BATCH, 2, 12, generator=generator), torch.randint(3, (BATCH,), generator=generator)
    out = array(x.unsqueeze(0))
    expected = model(x)
    F.cross_entropy(out[0], y).backward()
    F.cross_entropy(expected, y).backward()
    assert torch.equal(out[0], expected)
    gradients = array.parameters()
    for name, parameter in model.named_parameters():
        assert torch.equal(gradients[name].grad[0], parameter.grad), name
    for name, buffer in model.named_buffers():
        assert torch.equal(array.buffers[name][0], buffer), name


@pytest.mark.parametrize("opt_name", sorted(HPARAMS))
def test_an_array_of_one_trains_as_the_model_alone(opt_name, monkeypatch):
    data = synthetic_dataset()
    array = ModelArray.from_factory(Residual, seeds=[INIT_SEED], dtype=torch.float64)
    optimizer = getattr(hfta_nas.optim, opt_name)(array, **HPARAMS[opt_name])
    trainer = ArrayTrainer(array, optimizer, data, batch_size=BATCH, data_seeds=[DATA_SEED])

    def no_vmap(*args, **kwargs):
        raise AssertionError("an array of one ran its forward through vmap")

    monkeypatch.setattr(ModelArray, "_fused", no_vmap)
    trainer.fit(EPOCHS)
    assert_slot_is(array, 0, plain(data, opt_name))  # parameters and BatchNorm's running stats


def test_an_array_shrunk_to_one_trains_on_as_the_model_alone():
    """Epoch 1 fused (two slots, vmap), epochs 2 and 3 alone: the kept slot ends as its model alone."""
    data = synthetic_dataset()
    array = ModelArray.from_factory(Residual, seeds=[INIT_SEED, 7], dtype=torch.float64)
    optimizer = hfta_nas.optim.AdamW(array, **HPARAMS["AdamW"])
    trainer = ArrayTrainer(array, optimizer, data, batch_size=BATCH, data_seeds=[DATA_SEED, 11])

    def drop_the_second(report, trainer):
        if report.epoch == 1:
            trainer.stop([1])

    trainer.fit(EPOCHS, on_epoch=drop_the_second)
    assert len(array) == 1 and trainer.results[0].epochs == EPOCHS
    assert_slot_is(array, 0, plain(data, "AdamW"))
