"""What real users' code does that the array must take without riddles: a forward that
makes tensors on a fixed device, `isinstance` checks for the layers the array swaps,
and the functorch failures that must come out as a FusionError naming the layer."""

import functools

import optuna
import pytest
import torch
from torch import nn

import hfta_nas
from hfta_nas.data import load_dataset
from hfta_nas.errors import FusionError, HftaNasError
from tests.test_slot_ops import assert_matches_separate_models

DEVICE = torch.device("cpu")  # what optuna-examples' objectives write at the top of the file
optuna.logging.set_verbosity(optuna.logging.WARNING)


class FixedDeviceLSTM(nn.Module):
    """optuna-examples' pytorch_simple_lstm style: the initial states are made with .to(DEVICE)."""

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.hidden = hidden
        self.lstm = nn.LSTM(1, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, 10)

    def forward(self, x):
        x = x.transpose(1, 2)
        h0 = torch.zeros(1, x.size(0), self.hidden).to(DEVICE)
        c0 = torch.zeros(1, x.size(0), self.hidden).to(DEVICE)
        out, _ = self.lstm(x, (h0, c0))
        return self.fc(out[:, -1])


def test_a_forward_that_makes_tensors_on_a_fixed_device_is_sized_and_searched():
    def build(trial):
        hidden = trial.suggest_categorical("hidden", [4, 8])
        return hfta_nas.Candidate(model=functools.partial(FixedDeviceLSTM, hidden), epochs=1, batch_size=50)

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    data = load_dataset("mnist1d", num_samples=200)
    hfta_nas.optimize(study, build, data, n_trials=4, array_size=4, metrics=["val_acc"])
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 4


class OnAnotherDevice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(40, 10)

    def forward(self, x):
        return self.fc(x.flatten(1)) + torch.zeros(10, device="cuda:999")  # no such device here


def test_a_forward_that_cannot_be_sized_anywhere_says_what_to_change():
    def build(trial):
        trial.suggest_int("unused", 0, 1)
        return hfta_nas.Candidate(model=OnAnotherDevice, epochs=1)

    study = optuna.create_study(direction="maximize")
    with pytest.raises(HftaNasError) as caught:
        hfta_nas.optimize(study, build, load_dataset("mnist1d", num_samples=200), n_trials=2, metrics=["val_acc"])
    message = str(caught.value)
    assert "could not be sized" in message and "meta device" in message and "device=x.device" in message


class ChecksItsLayers(nn.Module):
    """Finds its recurrent layer by class at run time, as weight-init and logging code does."""

    def __init__(self, rnn: type[nn.RNNBase]) -> None:
        super().__init__()
        self.rnn = rnn(5, 6, batch_first=True, dtype=torch.float64)
        self.head = nn.Linear(6, 2, dtype=torch.float64)

    def forward(self, x):
        [rnn] = [m for m in self.modules() if isinstance(m, (nn.LSTM, nn.GRU))]
        out = rnn(x)[0]
        return self.head(out[:, -1, : rnn.hidden_size])


@pytest.mark.parametrize("rnn", [nn.LSTM, nn.GRU])
def test_the_arrays_recurrent_layers_are_what_they_replace(rnn):
    assert_matches_separate_models(
        functools.partial(ChecksItsLayers, rnn), torch.randn(3, 4, 7, 5, dtype=torch.float64)
    )


class _Block(nn.Module):
    def __init__(self, misuse: str) -> None:
        super().__init__()
        self.fc, self.misuse = nn.Linear(4, 4), misuse

    def forward(self, x):
        if self.misuse == "requires_grad_":
            x = x.clone().requires_grad_()
        weight = self.fc.weight.data if self.misuse == "data" else self.fc.weight
        return nn.functional.linear(x, weight, self.fc.bias)


class Misusing(nn.Module):
    def __init__(self, misuse: str) -> None:
        super().__init__()
        self.block, self.head, self.misuse = _Block(misuse), nn.Linear(4, 2), misuse

    def forward(self, x):
        out = self.head(torch.tanh(self.block(x)))
        return (out, None) if self.misuse == "none_output" else out


@pytest.mark.parametrize(
    "misuse, words",
    [
        ("requires_grad_", "layer 'block' (_Block) calls requires_grad_() on a tensor the slots compute; an array"),
        ("data", "layer 'block' (_Block) reads a tensor's .data; use the tensor itself, or .detach()"),
        ("none_output", "the model's forward (Misusing) returns something other than tensors (None in a tuple"),
    ],
)
def test_what_a_fused_forward_cannot_do_is_a_fusion_error_naming_the_layer(misuse, words):
    arr = hfta_nas.ModelArray.from_factory(functools.partial(Misusing, misuse), seeds=[0, 1])
    with pytest.raises(FusionError) as caught:
        arr(torch.randn(2, 3, 4))
    assert words in str(caught.value)


class SpectralDiscriminator(nn.Module):
    """A DCGAN-style discriminator with spectral normalisation on every layer (SN-GAN)."""

    def __init__(self, spectral_norm=nn.utils.parametrizations.spectral_norm) -> None:
        super().__init__()
        self.c1 = spectral_norm(nn.Conv2d(1, 4, 4, 2, 1, dtype=torch.float64))
        self.c2 = spectral_norm(nn.Conv2d(4, 8, 4, 2, 1, dtype=torch.float64))
        self.fc = spectral_norm(nn.Linear(8 * 2 * 2, 1, dtype=torch.float64))

    def forward(self, x):
        x = nn.functional.leaky_relu(self.c1(x), 0.2)
        return self.fc(nn.functional.leaky_relu(self.c2(x), 0.2).flatten(1))


def test_spectral_norm_as_a_parametrization_trains_each_slot_as_alone():
    from tests.test_array import SEEDS, per_model

    x = torch.randn(len(SEEDS), 5, 1, 8, 8, dtype=torch.float64)
    arr = assert_matches_separate_models(SpectralDiscriminator, x)  # outputs and gradients, one power step
    for slot, model in enumerate(per_model(SpectralDiscriminator)):
        model.train()(x[slot])  # its power iteration moves u and v once, as the array's forward did
        own = {k: v for k, v in model.state_dict().items() if k.endswith(("._u", "._v"))}
        stacked = arr.slot_state_dict(slot)
        assert own and all(torch.allclose(stacked[k], v, rtol=1e-12, atol=1e-14) for k, v in own.items())


def test_the_hook_based_spectral_norm_is_refused_naming_the_layer_and_the_replacement():
    with pytest.raises(FusionError) as caught:
        hfta_nas.ModelArray.from_factory(functools.partial(SpectralDiscriminator, nn.utils.spectral_norm), seeds=[0, 1])
    message = str(caught.value)
    assert message.startswith("layer 'c1' (Conv2d) uses torch.nn.utils.spectral_norm")
    assert "use torch.nn.utils.parametrizations.spectral_norm" in message


# ----------------------------------------------------------------- real models, trained as alone
class LambdaLayer(nn.Module):
    def __init__(self, function) -> None:
        super().__init__()
        self.function = function

    def forward(self, x):
        return self.function(x)


class ResNet20Block(nn.Module):
    """akamaster's CIFAR ResNet block, option A: the shortcut subsamples and zero-pads channels."""

    def __init__(self, inputs: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or inputs != planes:
            pad = planes // 4
            self.shortcut = LambdaLayer(lambda x: nn.functional.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, pad, pad)))

    def forward(self, x):
        out = nn.functional.relu(self.bn1(self.conv1(x)))
        return nn.functional.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet20(nn.Module):
    """akamaster/pytorch_resnet_cifar10's resnet20: 3 stages of 3 blocks, 16/32/64 planes, kaiming init."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        blocks, inputs = [], 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(3):
                blocks.append(ResNet20Block(inputs, planes, stride if i == 0 else 1))
                inputs = planes
        self.blocks = nn.Sequential(*blocks)
        self.linear = nn.Linear(64, classes)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.kaiming_normal_(module.weight)

    def forward(self, x):
        out = self.blocks(nn.functional.relu(self.bn1(self.conv1(x))))
        return self.linear(nn.functional.adaptive_avg_pool2d(out, 1).flatten(1))


def test_resnet20_trains_each_slot_as_alone():
    assert_matches_separate_models(ResNet20, torch.randn(3, 4, 3, 16, 16, dtype=torch.float64))


@pytest.mark.parametrize("name", ["pointnet", "dcgan_discriminator"])
def test_the_paper_models_train_each_slot_as_alone(name):
    """PointNet and the DCGAN discriminator of the HFTA paper, forward and backward in float64, training mode."""
    from benchmarks import _paper_models

    shape, sizes = {"pointnet": ((3, 64), {}), "dcgan_discriminator": ((3, 32, 32), {"width": 16})}[name]
    factory = functools.partial(getattr(_paper_models, name), input_shape=shape, **sizes)
    assert_matches_separate_models(factory, torch.randn(3, 4, *shape, dtype=torch.float64))
