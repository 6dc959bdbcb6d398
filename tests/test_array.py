"""ModelArray: every supported layer fuses exactly (forward and backward), dropout
is per-slot and reproducible, state round-trips, and bad models are refused."""

import pytest
import torch
from torch import nn

from hfta_nas import FusionError, HftaNasError, ModelArray

SEEDS = [5, 6, 7]
N = 4


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        out, _ = self.attn(x, x, x)
        return self.norm(out + x)


class Recurrent(nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(5, 6, num_layers=2, batch_first=True, bidirectional=True)

    def forward(self, x):
        out, state = self.rnn(x)
        h = state[0] if isinstance(state, tuple) else state
        return out.sum(1) + h.sum(0).repeat(1, 2)


class EmbeddingBag(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 6, padding_idx=0)
        self.out = nn.Linear(6, 3)

    def forward(self, tokens):
        return self.out(self.emb(tokens).mean(1))


LAYERS = {
    "linear+activations": (
        lambda: nn.Sequential(
            nn.Linear(6, 7), nn.ReLU(), nn.Linear(7, 7), nn.GELU(), nn.Linear(7, 5), nn.Tanh(), nn.SiLU(), nn.Softplus()
        ),
        (6,),
    ),
    "conv1d-stride-padding-groups": (
        lambda: nn.Sequential(
            nn.Conv1d(4, 8, 3, stride=2, padding=2, groups=2), nn.LeakyReLU(), nn.MaxPool1d(2), nn.AvgPool1d(2)
        ),
        (4, 20),
    ),
    "conv2d-groups+pooling": (
        lambda: nn.Sequential(
            nn.Conv2d(4, 6, 3, padding=1, groups=2),
            nn.ELU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 6, 2, stride=2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        ),
        (4, 8, 8),
    ),
    "conv-transpose1d": (lambda: nn.Sequential(nn.ConvTranspose1d(3, 4, 3, stride=2), nn.Sigmoid()), (3, 9)),
    "conv-transpose2d": (lambda: nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1), (3, 5, 5)),
    "batchnorm1d": (lambda: nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5)), (6,)),
    "batchnorm2d": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)), (3, 6, 6)),
    "layernorm": (lambda: nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8)), (6,)),
    "groupnorm": (lambda: nn.Sequential(nn.Conv1d(4, 6, 3), nn.GroupNorm(3, 6)), (4, 10)),
    "multihead-attention": (Attention, (5, 8)),
    "gru": (lambda: Recurrent(nn.GRU), (7, 5)),
    "lstm": (lambda: Recurrent(nn.LSTM), (7, 5)),
    "transformer-encoder-layer": (lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), (5, 8)),
}


def per_model(factory):
    models = []
    for seed in SEEDS:
        torch.manual_seed(seed)
        models.append(factory().double())
    return models


@pytest.mark.parametrize("name", sorted(LAYERS))
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_layer_forward_and_backward_equal_separate_models(name, training):
    factory, shape = LAYERS[name]
    x = torch.randn(len(SEEDS), N, *shape, dtype=torch.float64)
    arr = ModelArray.from_factory(factory, seeds=SEEDS, dtype=torch.float64).train(training)
    out = arr(x)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    for slot, model in enumerate(per_model(factory)):
        model.train(training)
        expected = model(x[slot])
        (expected * weights[slot]).sum().backward()
        torch.testing.assert_close(out[slot], expected, rtol=1e-10, atol=1e-12)
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        torch.testing.assert_close(arr.flat.grad[slot], grads, rtol=1e-10, atol=1e-12)
        state = arr.slot_state_dict(slot)  # running stats updated the same way
        for key, value in model.state_dict().items():
            if key in state and not key.endswith("num_batches_tracked"):
                torch.testing.assert_close(state[key], value.detach(), rtol=1e-10, atol=1e-12)


def test_embedding_with_padding_idx():
    tokens = torch.randint(0, 11, (len(SEEDS), N, 6))
    tokens[:, :, 0] = 0
    arr = ModelArray.from_factory(EmbeddingBag, seeds=SEEDS, dtype=torch.float64)
    out = arr(tokens)
    out.sum().backward()
    for slot, model in enumerate(per_model(EmbeddingBag)):
        expected = model(tokens[slot])
        expected.sum().backward()
        torch.testing.assert_close(out[slot], expected)
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        torch.testing.assert_close(arr.flat.grad[slot], grads)
    assert torch.all(arr.flat.grad[:, :6] == 0)  # padding row gets no gradient


def test_shared_input_equals_per_slot_copies():
    factory, shape = LAYERS["conv2d-groups+pooling"]
    arr = ModelArray.from_factory(factory, seeds=SEEDS, dtype=torch.float64)
    x = torch.randn(N, *shape, dtype=torch.float64)
    torch.testing.assert_close(arr(x, shared_input=True), arr(x.expand(len(SEEDS), *x.shape)))


def test_wrong_input_shape_names_both_forms():
    arr = ModelArray.from_factory(LAYERS["layernorm"][0], seeds=SEEDS)
    with pytest.raises(HftaNasError, match=r"expects \[3, N, \.\.\.\].*shared_input=True"):
        arr(torch.randn(5, 6))


# ------------------------------------------------------------------ dropout
class DropoutOnly(nn.Module):
    """Multiplies by a learnable scalar, then drops: output / scale shows the mask."""

    def __init__(self, p=0.3):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return self.drop(x * self.scale)


def dropout_masks(seed, x, calls=1, slots_before=0):
    """The masks slot `slots_before` draws in an array whose seeds end with `seed`."""
    seeds = list(range(100, 100 + slots_before)) + [seed]
    arr = ModelArray([DropoutOnly() for _ in seeds], dropout_seeds=seeds)
    out = None
    for _ in range(calls):
        out = arr(x.expand(len(seeds), *x.shape))
    return out[-1] != 0


def test_dropout_masks_differ_across_slots_and_have_the_right_rate():
    arr = ModelArray([DropoutOnly(0.3) for _ in range(4)], dropout_seeds=[0, 1, 2, 3])
    masks = arr(torch.ones(4, 20000)) != 0
    rates = 1 - masks.double().mean(1)
    assert torch.allclose(rates, torch.full_like(rates, 0.3), atol=0.015), rates
    for a in range(4):
        for b in range(a + 1, 4):
            assert (masks[a] != masks[b]).double().mean() > 0.3  # independent masks disagree on 2p(1-p) = 42%


def test_dropout_is_reproducible_from_its_seed_and_independent_of_the_array():
    x = torch.ones(5000)
    alone = dropout_masks(7, x)
    assert torch.equal(alone, dropout_masks(7, x))  # same seed, same masks
    assert torch.equal(alone, dropout_masks(7, x, slots_before=3))  # other slots do not matter
    assert not torch.equal(alone, dropout_masks(8, x))
    assert not torch.equal(dropout_masks(7, x, calls=2), alone)  # every step draws a fresh mask


def test_dropout_scales_kept_units_and_is_off_in_eval():
    arr = ModelArray([DropoutOnly(0.25) for _ in range(2)])
    out = arr(torch.ones(2, 1000))
    kept = out[out != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / 0.75))
    arr.eval()
    assert torch.equal(arr(torch.ones(2, 1000)), torch.ones(2, 1000))


def test_channel_dropout_drops_whole_channels():
    model = lambda: nn.Sequential(nn.Conv1d(8, 8, 1), nn.Dropout1d(0.5))
    arr = ModelArray.from_factory(model, seeds=[0, 1])
    out = arr(torch.randn(2, 3, 8, 30))
    zero_channels = (out == 0).all(-1)
    assert zero_channels.any() and ((out == 0).any(-1) == zero_channels).all()


def test_random_ops_in_forward_are_refused_clearly():
    class Noisy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return nn.functional.dropout(self.lin(x), 0.5, self.training)

    arr = ModelArray.from_factory(Noisy, seeds=[0, 1])
    with pytest.raises(FusionError, match="random operation.*nn.Dropout modules"):
        arr(torch.randn(2, 4, 3))


# ------------------------------------------------------------------ state and errors
def test_slot_state_dict_round_trips_into_plain_models():
    factory, shape = LAYERS["batchnorm2d"]
    arr = ModelArray.from_factory(factory, seeds=SEEDS, dtype=torch.float64)
    arr(torch.randn(len(SEEDS), N, *shape, dtype=torch.float64))  # update running stats
    for slot in range(len(SEEDS)):
        model = factory().double()
        model.load_state_dict(arr.slot_state_dict(slot))
        for key, value in model.state_dict().items():
            assert torch.equal(value, arr.slot_state_dict(slot)[key])
    model = factory().double()
    arr.load_slot(1, model.state_dict())
    for key, value in model.state_dict().items():
        assert torch.equal(arr.slot_state_dict(1)[key], value)


def test_tied_weights_share_one_parameter():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(5, 4)
            self.out = nn.Linear(4, 5, bias=False)
            self.out.weight = self.emb.weight

        def forward(self, tokens):
            return self.out(self.emb(tokens))

    arr = ModelArray.from_factory(Tied, seeds=[0, 1])
    assert arr.num_parameters == 20
    state = arr.slot_state_dict(1)
    assert torch.equal(state["emb.weight"], state["out.weight"])
    Tied().load_state_dict(state)


def test_outputs_of_different_shapes_are_refused_on_the_first_call():
    # Different widths pad into one envelope, but the slots' outputs must agree in shape.
    arr = ModelArray([nn.Sequential(nn.Linear(6, 8)), nn.Sequential(nn.Linear(6, 9))])
    with pytest.raises(FusionError, match=r"slot 0 .*output shapes \(\[4, 8\] alone, \[4, 9\] padded"):
        arr(torch.randn(2, 4, 6))


def test_different_layer_types_are_refused_by_name():
    with pytest.raises(FusionError, match="layer 1 of '<root>' is BatchNorm1d in one slot but ReLU in another"):
        ModelArray([nn.Sequential(nn.Linear(3, 3), nn.ReLU()), nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))])


@pytest.mark.parametrize(
    "layer,match",
    [
        (lambda: nn.MultiheadAttention(4, 2, dropout=0.1), "attention dropout=0.1"),
        (lambda: nn.RNN(3, 3), "nn.RNN is not supported"),
        (lambda: nn.AlphaDropout(0.2), "AlphaDropout"),
    ],
)
def test_unfusable_layers_are_refused_by_name(layer, match):
    with pytest.raises(FusionError, match=match):
        ModelArray([nn.Sequential(nn.Linear(4, 4), layer()) for _ in range(2)])


def test_other_bad_arguments():
    with pytest.raises(HftaNasError, match="at least one model"):
        ModelArray([])
    with pytest.raises(HftaNasError, match="not a torch.nn.Module"):
        ModelArray([nn.Linear(2, 2), "model"])
    with pytest.raises(HftaNasError, match="factory returned a str"):
        ModelArray.from_factory(lambda: "model", seeds=[0])
    with pytest.raises(HftaNasError, match="dropout_seeds has 1 entries but the array has 2 slots"):
        ModelArray([nn.Linear(2, 2), nn.Linear(2, 2)], dropout_seeds=[1])
    with pytest.raises(HftaNasError, match="out of range"):
        ModelArray([nn.Linear(2, 2)]).slot_state_dict(3)


def test_from_factory_restores_the_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    ModelArray.from_factory(lambda: nn.Linear(3, 3), seeds=[0, 1])
    assert torch.equal(torch.rand(3), expected)


def test_float32_array_matches_float32_models():
    factory, shape = LAYERS["conv1d-stride-padding-groups"]
    x = torch.randn(len(SEEDS), N, *shape)
    arr = ModelArray.from_factory(factory, seeds=SEEDS)
    out = arr(x)
    assert out.dtype == torch.float32
    for slot, seed in enumerate(SEEDS):
        torch.manual_seed(seed)
        torch.testing.assert_close(out[slot], factory()(x[slot]), rtol=1e-5, atol=1e-6)
