"""Dropout that belongs to the slot: a slot draws the same masks in any array as alone.

A slot's masks are a pure function of its dropout seed, the layer (its path in the slot's own
model), the step and the entry's coordinates in the slot's own tensor: not of the array's size,
the slot's position, its neighbours, or the envelope it is padded into. Checked for every
envelope kind that has a dropout site (wider layers, more channels with channel dropout, larger
kernels, deeper stacks whose extra blocks the slot skips, even where they shift the slot's later
layers, skipped residual blocks, per-slot rates, recurrent hidden sizes and depths, attention
widths and depths), in float64 to rounding (the contract's 1e-10; another mask differs by O(1)),
forward and through training steps (gradients), over several steps; the vmap and vmap-free paths
draw the same masks; and the masks are Bernoulli(1 - p) without dependence between slots, steps or
neighbouring entries.
"""

import copy
import math

import pytest
import torch
from torch import nn

from hfta_nas import ModelArray
from hfta_nas.layers._slot_random import coordinate_bits, dropout_multiplier, keep_mask, slot_keys

CLASSES, STEPS, N = 5, 3, 16
VOCAB, SEQ = 20, 6


def mlp(width, depth=1, p=0.3):
    layers = [nn.Flatten(), nn.Linear(24, width), nn.ReLU(), nn.Dropout(p)]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU(), nn.Dropout(p)]
    return nn.Sequential(*layers, nn.Linear(width, CLASSES))


def mlp_dropout_last(hidden_layers):
    """Hidden layers, then one dropout before the head: a deeper envelope shifts the dropout's index."""
    layers = [nn.Flatten(), nn.Linear(24, 16), nn.ReLU()]
    for _ in range(hidden_layers):
        layers += [nn.Linear(16, 16), nn.ReLU()]
    return nn.Sequential(*layers, nn.Dropout(0.3), nn.Linear(16, CLASSES))


def issue_repro(width):  # Sequential(Linear(64,16), ReLU, Dropout(0.3), Linear(16,10)), padded to width 48
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Dropout(0.3), nn.Linear(width, 10))


def cnn(channels, kind=nn.Dropout1d, kernel=3):
    return nn.Sequential(
        nn.Conv1d(2, channels, kernel, padding=kernel // 2),
        nn.ReLU(),
        kind(0.4),
        nn.Flatten(),
        nn.Linear(channels * 12, CLASSES),
    )


def cnn2d(channels):
    return nn.Sequential(
        nn.Conv2d(2, channels, 3, padding=1),
        nn.ReLU(),
        nn.Dropout2d(0.4),
        nn.Flatten(),
        nn.Linear(channels * 16, CLASSES),
    )


def cnn3d(channels):
    return nn.Sequential(
        nn.Conv3d(1, channels, 3, padding=1),
        nn.ReLU(),
        nn.Dropout3d(0.4),
        nn.Flatten(),
        nn.Linear(channels * 2 * 3 * 4, CLASSES),
    )


class Recurrent(nn.Module):
    def __init__(self, hidden, layers, kind=nn.GRU):
        super().__init__()
        self.rnn = kind(2, hidden, num_layers=layers, dropout=0.3, batch_first=True)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(hidden, CLASSES)

    def forward(self, x):  # x [N, 2, 12]: 12 time steps of 2 features
        out, _ = self.rnn(x.transpose(1, 2))
        return self.head(self.drop(out[:, -1]))


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.3))

    def forward(self, x):
        return x + self.body(x)


class ResidualNet(nn.Module):
    """Residual blocks with dropout inside: a slot of fewer blocks skips the envelope's extra ones."""

    def __init__(self, width, depth):
        super().__init__()
        self.stem = nn.Linear(24, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x):
        h = torch.relu(self.stem(x.flatten(1)))
        for block in self.blocks:
            h = block(h)
        return self.head(self.drop(h))


class Attention(nn.Module):
    """Embedding -> dropout -> transformer encoder (attention without its own dropout, which arrays
    refuse) -> dropout -> head: dropout sites on [N, L, d_model] activations of different widths."""

    def __init__(self, d_model, ff, layers):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model)
        self.embed_drop = nn.Dropout(0.1)
        layer = nn.TransformerEncoderLayer(d_model, 2, ff, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(d_model, CLASSES)

    def forward(self, tokens):
        return self.head(self.drop(self.encoder(self.embed_drop(self.embed(tokens)))).mean(1))


def floats(*sample):
    return lambda generator: torch.randn(N, *sample, dtype=torch.float64, generator=generator)


def tokens(generator):
    return torch.randint(0, VOCAB, (N, SEQ), generator=generator)


# (the slot under test, the models it shares an array with, one batch of inputs)
ENVELOPES = {
    "issue-width": (lambda: issue_repro(16), [lambda: issue_repro(48)], floats(64)),
    "mlp-width": (lambda: mlp(8), [lambda: mlp(32), lambda: mlp(16)], floats(2, 12)),
    "mlp-depth": (lambda: mlp(16, depth=1), [lambda: mlp(16, depth=3)], floats(2, 12)),
    "mlp-depth-shifts-the-dropout": (lambda: mlp_dropout_last(1), [lambda: mlp_dropout_last(3)], floats(2, 12)),
    "mlp-width-and-depth": (
        lambda: mlp(8, depth=2),
        [lambda: mlp(32, depth=3), lambda: mlp(8, depth=1)],
        floats(2, 12),
    ),
    "residual-blocks-skipped": (lambda: ResidualNet(8, 1), [lambda: ResidualNet(16, 3)], floats(2, 12)),
    "per-slot-rate": (lambda: mlp(16, p=0.2), [lambda: mlp(16, p=0.5), lambda: mlp(24, p=0.0)], floats(2, 12)),
    "conv-channels-dropout1d": (lambda: cnn(4), [lambda: cnn(12)], floats(2, 12)),
    "conv-channels-dropout": (lambda: cnn(4, nn.Dropout), [lambda: cnn(12, nn.Dropout)], floats(2, 12)),
    "conv-kernels-and-channels": (lambda: cnn(4, kernel=3), [lambda: cnn(8, kernel=5)], floats(2, 12)),
    "conv2d-channels-dropout2d": (lambda: cnn2d(3), [lambda: cnn2d(8)], floats(2, 4, 4)),
    "conv3d-channels-dropout3d": (lambda: cnn3d(2), [lambda: cnn3d(5)], floats(1, 2, 3, 4)),
    "gru-hidden": (lambda: Recurrent(6, 2), [lambda: Recurrent(10, 2)], floats(2, 12)),
    "gru-depth": (lambda: Recurrent(6, 2), [lambda: Recurrent(6, 3)], floats(2, 12)),
    "lstm-hidden-and-depth": (lambda: Recurrent(6, 2, nn.LSTM), [lambda: Recurrent(10, 3, nn.LSTM)], floats(2, 12)),
    "attention-width-and-depth": (lambda: Attention(8, 16, 1), [lambda: Attention(16, 24, 2)], tokens),
}


def seeded(factory, seed):
    torch.manual_seed(seed)
    return factory().double()


def arrays(case, position):
    """The slot's model alone (dropout seed 7) and in an array with its neighbours, at `position`."""
    own, others, inputs = ENVELOPES[case]
    model = seeded(own, 1)
    neighbours = [seeded(f, 2 + i) for i, f in enumerate(others)]
    models = [copy.deepcopy(model), *neighbours] if position == 0 else [*neighbours, copy.deepcopy(model)]
    seeds = [7 if m is models[position] else 100 + i for i, m in enumerate(models)]
    together = ModelArray(models, dropout_seeds=seeds, dtype=torch.float64)
    alone = ModelArray([copy.deepcopy(model)], dropout_seeds=[7], dtype=torch.float64)
    return together, alone, inputs


def train_mode_outputs(array, x, steps=STEPS):
    """The array's train-mode outputs of `steps` calls (each call draws fresh masks)."""
    array.train()
    with torch.no_grad():
        return [array(x, shared_input=True) for _ in range(steps)]


@pytest.mark.parametrize("case", sorted(ENVELOPES))
@pytest.mark.parametrize("position", [0, -1])
def test_a_padded_slot_draws_the_masks_it_draws_alone(case, position):
    together, alone, inputs = arrays(case, position)
    assert together._slots is not None  # the slot is padded
    x = inputs(torch.Generator().manual_seed(3))
    for step, (padded, own_out) in enumerate(zip(train_mode_outputs(together, x), train_mode_outputs(alone, x))):
        # equal to float64 rounding (a padded matmul sums in another order); a different mask differs by O(1)
        torch.testing.assert_close(padded[position], own_out[0], rtol=1e-10, atol=1e-12, msg=f"step {step}")
    # and the masks did something: train mode differs from eval mode
    with torch.no_grad():
        assert not torch.equal(alone.eval()(x, shared_input=True)[0], own_out[0])


@pytest.mark.parametrize("case", sorted(ENVELOPES))
def test_a_padded_slot_trains_through_its_masks_as_alone(case):
    """Forward and backward through the masks: after each SGD step the slot's weights alone and padded
    are equal (so are its gradients, weights' steps divided by the learning rate)."""
    from hfta_nas.optim import OPTIMIZERS

    together, alone, inputs = arrays(case, -1)
    generator = torch.Generator().manual_seed(0)
    batches = [inputs(generator) for _ in range(STEPS)]
    states = {}
    for name, array in (("alone", alone), ("padded", together)):
        optimizer = OPTIMIZERS["sgd"](array, lr=0.1)
        array.train()
        slot = len(array) - 1
        states[name] = []
        for x in batches:
            out = array(x, shared_input=True)
            optimizer.zero_grad()
            (out**2).flatten(1).mean(1).sum().backward()  # each slot's own loss, summed
            optimizer.step()
            states[name].append(array.slot_state_dict(slot))
    for step, (own, padded) in enumerate(zip(states["alone"], states["padded"])):
        assert own.keys() == padded.keys()
        for key in own:
            torch.testing.assert_close(padded[key], own[key], rtol=1e-10, atol=1e-12, msg=f"step {step}: {key}")


def test_a_slot_trains_to_the_same_weights_alone_and_padded():
    """Forward and backward through the masks: SGD steps of the slot alone and padded end equal."""
    model = seeded(lambda: mlp(8, depth=2), 1)
    arrays_ = {
        "alone": ModelArray([copy.deepcopy(model)], dropout_seeds=[7], dtype=torch.float64),
        "padded": ModelArray(
            [seeded(lambda: mlp(32, depth=3), 2), copy.deepcopy(model)], dropout_seeds=[5, 7], dtype=torch.float64
        ),
    }
    generator = torch.Generator().manual_seed(0)
    batches = [
        (
            torch.randn(N, 2, 12, dtype=torch.float64, generator=generator),
            torch.randint(CLASSES, (N,), generator=generator),
        )
        for _ in range(STEPS)
    ]
    from hfta_nas.optim import OPTIMIZERS

    for array in arrays_.values():
        optimizer = OPTIMIZERS["sgd"](array, lr=0.1)
        array.train()
        for x, y in batches:
            logits = array(x, shared_input=True)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), y.repeat(len(array)), reduction="none")
            optimizer.zero_grad()
            loss.view(len(array), -1).mean(1).sum().backward()
            optimizer.step()
    alone, padded = arrays_["alone"].slot_state_dict(0), arrays_["padded"].slot_state_dict(1)
    assert alone.keys() == padded.keys()
    for key in alone:
        torch.testing.assert_close(alone[key], padded[key], rtol=1e-10, atol=1e-12, msg=key)


def test_a_refilled_slot_draws_what_its_new_model_draws_alone():
    """replace_slot restarts the slot's counters and streams: the new model (shallower than the
    envelope, so its final dropout sits at another index) draws the masks it draws alone."""
    models = [seeded(lambda: mlp_dropout_last(3), 1), seeded(lambda: mlp_dropout_last(1), 2)]
    array = ModelArray(models, dropout_seeds=[5, 6], dtype=torch.float64)
    x = torch.randn(N, 2, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    train_mode_outputs(array, x)  # the slots' counters move on
    new = seeded(lambda: mlp_dropout_last(1), 4)  # into the deep slot: its dropout moves from '9' to '5'
    array.replace_slot(0, copy.deepcopy(new), dropout_seed=7)
    alone = ModelArray([copy.deepcopy(new)], dropout_seeds=[7], dtype=torch.float64)
    for step, (padded, own_out) in enumerate(zip(train_mode_outputs(array, x), train_mode_outputs(alone, x))):
        torch.testing.assert_close(padded[0], own_out[0], rtol=1e-10, atol=1e-12, msg=f"step {step}")


class DropoutOnly(nn.Module):
    """x * scale (a parameter, 1) then dropout: output / x is the multiplier exactly."""

    def __init__(self, kind=nn.Dropout, p=0.4):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.drop = kind(p)

    def forward(self, x):
        return self.drop(x * self.scale)


@pytest.mark.parametrize("kind", [nn.Dropout, nn.Dropout2d])
def test_masks_depend_on_neither_the_array_size_nor_the_slot_position(kind):
    x = torch.ones(N, 3, 5, 6, dtype=torch.float64)  # [N, C, H, W] per slot
    seen = []
    for slots, position in ((1, 0), (3, 0), (3, 2), (6, 4)):
        seeds = [100 + b for b in range(slots)]
        seeds[position] = 7
        array = ModelArray([DropoutOnly(kind) for _ in range(slots)], dropout_seeds=seeds, dtype=torch.float64)
        seen.append(torch.stack([out[position] for out in train_mode_outputs(array, x)]))
    for other in seen[1:]:
        assert torch.equal(other, seen[0])
    assert not torch.equal(seen[0][0], seen[0][1])  # a fresh mask every step


def _vmapped(array):
    array._native = None  # the generic path: the template under vmap
    return array


@pytest.mark.parametrize("case", ["mlp", "channels", "per-slot-rate"])
def test_the_vmap_and_vmap_free_paths_draw_the_same_masks(case):
    factories = {
        "mlp": [lambda: mlp(16, depth=2)] * 3,
        "channels": [lambda: nn.Sequential(nn.Conv1d(2, 6, 3, padding=1), nn.Dropout1d(0.5), nn.Flatten())] * 3,
        "per-slot-rate": [lambda: mlp(16, p=0.2), lambda: mlp(16, p=0.5), lambda: mlp(16, p=0.0)],
    }[case]
    native = ModelArray([seeded(f, i) for i, f in enumerate(factories)], dropout_seeds=[3, 4, 5], dtype=torch.float64)
    assert native._native is not None
    vmapped = _vmapped(
        ModelArray([seeded(f, i) for i, f in enumerate(factories)], dropout_seeds=[3, 4, 5], dtype=torch.float64)
    )
    x = torch.randn(N, 2, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for a, b in zip(train_mode_outputs(native, x), train_mode_outputs(vmapped, x)):
        assert torch.equal(a, b)


def test_rates_zero_and_one_and_eval_mode():
    x = torch.randn(2, N, 40, dtype=torch.float64)
    for p, expected in ((0.0, x), (1.0, torch.zeros_like(x))):
        array = ModelArray([DropoutOnly(p=p) for _ in range(2)], dropout_seeds=[1, 2], dtype=torch.float64).train()
        out = array(x)
        assert torch.equal(out, expected)
        out.sum().backward()  # d/dscale: the sum of what came through (all of x for p = 0, none for p = 1)
        torch.testing.assert_close(array.gradient()[:, 0], expected.sum((1, 2)), rtol=1e-12, atol=0)
    array = ModelArray([DropoutOnly(p=0.5) for _ in range(2)], dtype=torch.float64).eval()
    assert torch.equal(array(x), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_the_multiplier_is_the_keep_mask_times_the_scale(dtype):
    keys = slot_keys(torch.arange(4), stream=3).view(4, 1, 1)
    counters = torch.tensor([1, 2, 7, 1000]).view(4, 1, 1)
    for p in (0.1, 1 / 3, 0.9):
        got = dropout_multiplier((20, 30), keys, counters, p, dtype)
        scale = torch.tensor(1 / (1 - p), dtype=dtype)
        assert got.dtype == dtype and torch.equal(got, keep_mask((20, 30), keys, counters, p, dtype) * scale)
    rates = torch.tensor([0.0, 0.3, 1.0, 0.5], dtype=torch.float64).view(4, 1, 1)  # per-slot rates, 1 included
    got = dropout_multiplier((20, 30), keys, counters, rates, dtype)
    scales = torch.where(rates < 1, 1 / (1 - rates), 0.0).to(dtype)
    assert torch.equal(got, keep_mask((20, 30), keys, counters, rates, dtype) * scales)
    assert torch.equal(got[0], torch.ones_like(got[0])) and torch.equal(got[2], torch.zeros_like(got[2]))


def test_a_slots_bits_at_its_own_entries_do_not_depend_on_the_extents():
    """The hash of entry (i, j, k) is the same in a [4, 5, 6] tensor and in any larger one."""
    keys = slot_keys(torch.tensor([11, 12]), stream=5).view(2, 1, 1, 1)
    counters = torch.tensor([3, 9]).view(2, 1, 1, 1)
    small = coordinate_bits((4, 5, 6), keys, counters)
    for larger in ((4, 5, 9), (7, 5, 6), (4, 8, 6), (9, 9, 9)):
        assert torch.equal(coordinate_bits(larger, keys, counters)[:, :4, :5, :6], small)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_masks_keep_a_share_1_minus_p_without_correlation(p):
    slots, shape = 4, (64, 32, 20)  # 40,960 entries per slot and step
    keys = slot_keys(torch.arange(slots) * 7919, stream=11).view(slots, 1, 1, 1)
    masks = [keep_mask(shape, keys, torch.full_like(keys, step), p, torch.float32).double() for step in (1, 2)]
    n = masks[0][0].numel()
    binomial_sd = (p * (1 - p) / n) ** 0.5
    for mask in masks:
        for slot in range(slots):
            assert abs(mask[slot].mean().item() - (1 - p)) < 5 * binomial_sd

    def corr(a, b):
        a, b = a.flatten() - a.mean(), b.flatten() - b.mean()
        return (a @ b / (a.norm() * b.norm())).item()

    bound = 5 / n**0.5  # five standard errors of a correlation of independent draws
    assert abs(corr(masks[0][0], masks[0][1])) < bound  # neighbouring slots
    assert abs(corr(masks[0][0], masks[1][0])) < bound  # consecutive steps
    assert abs(corr(masks[0][0][..., 1:], masks[0][0][..., :-1])) < bound  # neighbouring entries, last dim
    assert abs(corr(masks[0][0][1:], masks[0][0][:-1])) < bound  # neighbouring rows (samples)


def _chi_square_z(first, second, bits):
    """z-score of the chi-square statistic of the joint histogram of two `bits`-bit value tensors."""
    cells = 1 << (2 * bits)
    counts = torch.bincount((first * (1 << bits) + second).flatten(), minlength=cells).double()
    expected = first.numel() / cells
    return ((((counts - expected) ** 2) / expected).sum().item() - (cells - 1)) / math.sqrt(2 * (cells - 1))


def test_neighbouring_uniforms_are_independent_by_a_chi_square_test():
    """The joint histogram of the top 4 bits of two neighbouring uniforms (along each dim, consecutive
    steps, neighbouring slots, and the xor of 2x2 squares) is flat: chi-square z-scores below 5."""
    slots, steps, shape = 8, 4, (32, 16, 64)  # 262,144 pairs per comparison, 1,024 per cell
    keys = slot_keys(torch.arange(slots) * 7919 + 3, stream=5).view(slots, 1, 1, 1)
    bits = torch.stack([coordinate_bits(shape, keys, torch.full_like(keys, 1 + s)) for s in range(steps)])
    top = bits >> 28  # [steps, slots, *shape], 16 values
    for dim in range(top.dim()):
        n = top.shape[dim]
        first, second = top.narrow(dim, 0, n - 1), top.narrow(dim, 1, n - 1)
        assert abs(_chi_square_z(first, second, 4)) < 5, f"neighbours along dim {dim}"
        if dim + 1 < top.dim():  # 2x2 squares with the next dim
            m = top.shape[dim + 1]
            a0, a1 = first.narrow(dim + 1, 0, m - 1), first.narrow(dim + 1, 1, m - 1)
            b0, b1 = second.narrow(dim + 1, 0, m - 1), second.narrow(dim + 1, 1, m - 1)
            assert abs(_chi_square_z(a0 ^ b1, a1 ^ b0, 4)) < 5, f"squares of dims {dim}, {dim + 1}"
    uniforms = (bits >> 8).double() / 2**24
    assert abs(uniforms.mean().item() - 0.5) < 5 * (1 / 12 / uniforms.numel()) ** 0.5


def test_neighbouring_entries_are_independent_at_8_bits():
    """The same at 8 bits (65,536 cells, 8.4 million pairs): consecutive steps, neighbouring slots,
    rows and columns. Hashing the raw last coordinate (as the previous algorithm did) fails this on
    the columns with z ~ 14: two mixing rounds leave inputs that differ in their low bits related."""
    slots, steps, shape = 32, 16, (64, 256)
    keys = slot_keys(torch.arange(slots) * 7919 + 3, stream=5).view(slots, 1, 1)
    top = torch.stack([coordinate_bits(shape, keys, torch.full_like(keys, 1 + s)) for s in range(steps)]) >> 24
    for dim, what in enumerate(("steps", "slots", "rows", "columns")):
        n = top.shape[dim]
        assert abs(_chi_square_z(top.narrow(dim, 0, n - 1), top.narrow(dim, 1, n - 1), 8)) < 5, what


def _ops_of_one_dropout(slots):
    """The aten operations one array dropout layer runs (forward) for `slots` slots."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from hfta_nas.layers._slot_layers import SlotDropout

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    layer = SlotDropout(0.3).train()
    x = torch.randn(slots, 16, 8, 10)
    keys, calls = slot_keys(torch.arange(slots), 0), torch.zeros(slots, dtype=torch.int64)
    layer.native_forward(x, keys, calls)  # the first call fills the caches (coordinate hashes, thresholds)
    with Count() as counted:
        layer.native_forward(x, keys, calls)
    return counted.ops


def test_a_dropout_layer_runs_as_many_operations_for_32_slots_as_for_1():
    """All slots' masks in one pass of each operation (one kernel each on a GPU), never a loop over slots."""
    ops = _ops_of_one_dropout(1)
    assert ops == _ops_of_one_dropout(32)
    assert len(ops) <= 20 and "aten.where.self" not in ops  # few passes, none of them a (slow) where


def test_the_dropout_benchmark_runs_and_reports_ratios(tmp_path):
    from benchmarks.dropout import main

    out = tmp_path / "dropout.json"
    assert main(["--shapes", "mlp-64", "--slots", "1,2", "--repeats", "1", "--inner", "1", "--out", str(out)]) == 0
    import json

    rows = json.loads(out.read_text())["rows"]
    assert [r["slots"] for r in rows] == [1, 2] and all(r["ratio"] > 0 for r in rows)
    assert all(r["previous_ratio"] > 0 and r["flat_ratio"] > 0 for r in rows)
