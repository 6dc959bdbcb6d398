"""Models with several inputs: keyword arguments, tuples and dicts of tensors, flags, through
ModelArray.__call__, each slot equal to its own model (float64)."""

import pytest
import torch
from torch import nn

from hfta_nas import FusionError, HftaNasError, ModelArray


class MaskedEncoder(nn.Module):
    """Token ids with a padding mask given as a keyword, and a flag."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, tokens, pad_mask=None, mean_pool=True):
        h = self.layer(self.embed(tokens), src_key_padding_mask=pad_mask)
        if mean_pool:
            keep = (~pad_mask).unsqueeze(-1).to(h.dtype) if pad_mask is not None else torch.ones_like(h[..., :1])
            return self.head((h * keep).sum(1) / keep.sum(1))
        return self.head(h[:, 0])


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(5, 4), nn.Linear(3, 4)

    def forward(self, batch):
        return self.a(batch["image"]) * self.b(batch["meta"][0]) + batch["meta"][1]


def models(factory, seeds):
    out = []
    for seed in seeds:
        torch.manual_seed(seed)
        out.append(factory().double().eval())
    return out


def test_keyword_inputs_and_flags_reach_every_slot():
    alone = models(MaskedEncoder, [0, 1, 2])
    arr = ModelArray(alone, dtype=torch.float64).eval()
    tokens = torch.randint(0, 20, (3, 4, 6))
    mask = torch.zeros(3, 4, 6, dtype=torch.bool)
    mask[:, :, 4:] = True  # the last two tokens are padding
    mask[1, 2, 2:] = True
    out = arr(tokens, pad_mask=mask, mean_pool=False)
    for slot, model in enumerate(alone):
        torch.testing.assert_close(
            out[slot], model(tokens[slot], pad_mask=mask[slot], mean_pool=False), rtol=1e-12, atol=1e-12
        )
    shared = arr(tokens[0], pad_mask=mask[0], shared_input=True)
    for slot, model in enumerate(alone):
        torch.testing.assert_close(shared[slot], model(tokens[0], pad_mask=mask[0]), rtol=1e-12, atol=1e-12)


def test_dict_and_tuple_inputs_are_split_by_slot():
    alone = models(TwoInputs, [3, 4])
    arr = ModelArray(alone, dtype=torch.float64)
    batch = {
        "image": torch.randn(2, 7, 5, dtype=torch.float64),
        "meta": (torch.randn(2, 7, 3, dtype=torch.float64), torch.randn(2, 7, 4, dtype=torch.float64)),
    }
    out = arr(batch)
    for slot, model in enumerate(alone):
        own = {"image": batch["image"][slot], "meta": (batch["meta"][0][slot], batch["meta"][1][slot])}
        torch.testing.assert_close(out[slot], model(own), rtol=1e-12, atol=1e-12)


def test_a_keyword_tensor_of_the_wrong_shape_is_a_clear_error():
    arr = ModelArray(models(MaskedEncoder, [0, 1]), dtype=torch.float64)
    with pytest.raises(HftaNasError, match=r"input 1 has shape \[4, 6\]; an array of 2 slots expects"):
        arr(torch.randint(0, 20, (2, 4, 6)), pad_mask=torch.zeros(4, 6, dtype=torch.bool))


class SizedTwoInputs(nn.Module):
    """A dict input to models of different widths: an array of them pads into an envelope."""

    def __init__(self, width):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(5, width), nn.Linear(3, width), nn.Linear(width, 4)

    def forward(self, batch):
        return self.head(torch.tanh(self.a(batch["image"]) * self.b(batch["meta"][0]))) + batch["meta"][1]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dict_inputs_reach_an_array_of_different_sizes(dtype):
    """The first call's check splits the dict by slot and casts every tensor in it to float64."""
    alone = [
        model.to(dtype) for model in models(lambda: SizedTwoInputs(6), [3]) + models(lambda: SizedTwoInputs(9), [4])
    ]
    arr = ModelArray(alone, dtype=dtype)
    assert arr._slots is not None  # an envelope, not an array of equal shapes
    g = torch.Generator().manual_seed(0)
    batch = {
        "image": torch.randn(2, 7, 5, generator=g, dtype=dtype),
        "meta": (torch.randn(2, 7, 3, generator=g, dtype=dtype), torch.randn(2, 7, 4, generator=g, dtype=dtype)),
    }
    out = arr(batch)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    for slot, model in enumerate(alone):
        own = {"image": batch["image"][slot], "meta": (batch["meta"][0][slot], batch["meta"][1][slot])}
        torch.testing.assert_close(out[slot], model(own), rtol=tolerance, atol=tolerance)
    assert arr.padding_cost().per_slot[0][0] == 5 * 6 + 3 * 6 + 6 * 4  # multiply-adds per sample, not per batch


class PackedEncoder(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.rnn = nn.GRU(3, hidden, batch_first=True)

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        return self.rnn(packed)[1][-1]


class PackedClassifier(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.encoder, self.head = PackedEncoder(hidden), nn.Linear(hidden, 2)

    def forward(self, x, lengths):
        return self.head(self.encoder(x, lengths))


@pytest.mark.parametrize("hidden", [(8, 8), (8, 12)], ids=["equal-shapes", "different-sizes"])
def test_packed_sequences_are_refused_in_one_line_naming_the_layer(hidden):
    arr = ModelArray(
        models(lambda: PackedClassifier(hidden[0]), [0]) + models(lambda: PackedClassifier(hidden[1]), [1])
    )
    x = torch.randn(2, 4, 5, 3, dtype=torch.float64)
    lengths = torch.tensor([[5, 3, 2, 4], [1, 5, 5, 2]])
    with pytest.raises(FusionError) as refused:
        arr(x, lengths)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("layer 'encoder' (PackedEncoder) packs sequences")
