"""Dropout that belongs to the slot: a slot draws the same masks in any array as alone.

A slot's masks are a pure function of its dropout seed, the layer, the step and the entry's
coordinates in the slot's own tensor: not of the array's size, the slot's position, its
neighbours, or the envelope it is padded into. Checked for every envelope kind that has a
dropout site (wider layers, more channels with channel dropout, deeper stacks whose extra
blocks the slot skips, per-slot rates, recurrent hidden sizes and depths), in float64 to
rounding (the contract's 1e-10; another mask differs by O(1)), over several steps; and the masks are Bernoulli(1 - p) without correlation between
slots, steps or neighbouring entries.
"""

import copy

import pytest
import torch
from torch import nn

from hfta_nas import ModelArray
from hfta_nas._slot_random import keep_mask, slot_keys

CLASSES, STEPS, N = 5, 3, 16


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


def cnn(channels, kind=nn.Dropout1d):
    return nn.Sequential(nn.Conv1d(2, channels, 3, padding=1), nn.ReLU(), kind(0.4), nn.Flatten(),
                         nn.Linear(channels * 12, CLASSES))


def cnn2d(channels):
    return nn.Sequential(nn.Conv2d(2, channels, 3, padding=1), nn.ReLU(), nn.Dropout2d(0.4), nn.Flatten(),
                         nn.Linear(channels * 16, CLASSES))


class Recurrent(nn.Module):
    def __init__(self, hidden, layers):
        super().__init__()
        self.rnn = nn.GRU(2, hidden, num_layers=layers, dropout=0.3, batch_first=True)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(hidden, CLASSES)

    def forward(self, x):  # x [N, 2, 12]: 12 time steps of 2 features
        out, _ = self.rnn(x.transpose(1, 2))
        return self.head(self.drop(out[:, -1]))


# (the slot under test, the models it shares an array with, the input of one sample)
ENVELOPES = {
    "issue-width": (lambda: issue_repro(16), [lambda: issue_repro(48)], (64,)),
    "mlp-width": (lambda: mlp(8), [lambda: mlp(32), lambda: mlp(16)], (2, 12)),
    "mlp-depth": (lambda: mlp(16, depth=1), [lambda: mlp(16, depth=3)], (2, 12)),
    "mlp-depth-shifts-the-dropout": (lambda: mlp_dropout_last(1), [lambda: mlp_dropout_last(3)], (2, 12)),
    "mlp-width-and-depth": (lambda: mlp(8, depth=2), [lambda: mlp(32, depth=3), lambda: mlp(8, depth=1)], (2, 12)),
    "per-slot-rate": (lambda: mlp(16, p=0.2), [lambda: mlp(16, p=0.5), lambda: mlp(24, p=0.0)], (2, 12)),
    "conv-channels-dropout1d": (lambda: cnn(4), [lambda: cnn(12)], (2, 12)),
    "conv-channels-dropout": (lambda: cnn(4, nn.Dropout), [lambda: cnn(12, nn.Dropout)], (2, 12)),
    "conv2d-channels-dropout2d": (lambda: cnn2d(3), [lambda: cnn2d(8)], (2, 4, 4)),
    "gru-hidden": (lambda: Recurrent(6, 2), [lambda: Recurrent(10, 2)], (2, 12)),
    "gru-depth": (lambda: Recurrent(6, 2), [lambda: Recurrent(6, 3)], (2, 12)),
}


def seeded(factory, seed):
    torch.manual_seed(seed)
    return factory().double()


def train_mode_outputs(array, x, steps=STEPS):
    """The array's train-mode outputs of `steps` calls (each call draws fresh masks)."""
    array.train()
    with torch.no_grad():
        return [array(x, shared_input=True) for _ in range(steps)]


@pytest.mark.parametrize("case", sorted(ENVELOPES))
@pytest.mark.parametrize("position", [0, -1])
def test_a_padded_slot_draws_the_masks_it_draws_alone(case, position):
    own, others, sample = ENVELOPES[case]
    model = seeded(own, 1)
    neighbours = [seeded(f, 2 + i) for i, f in enumerate(others)]
    models = [copy.deepcopy(model), *neighbours] if position == 0 else [*neighbours, copy.deepcopy(model)]
    seeds = [7 if m is models[position] else 100 + i for i, m in enumerate(models)]
    together = ModelArray(models, dropout_seeds=seeds, dtype=torch.float64)
    alone = ModelArray([copy.deepcopy(model)], dropout_seeds=[7], dtype=torch.float64)
    x = torch.randn(N, *sample, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    for step, (padded, own_out) in enumerate(zip(train_mode_outputs(together, x), train_mode_outputs(alone, x))):
        # equal to float64 rounding (a padded matmul sums in another order); a different mask differs by O(1)
        torch.testing.assert_close(padded[position], own_out[0], rtol=1e-10, atol=1e-12, msg=f"step {step}")
    # and the masks did something: train mode differs from eval mode
    with torch.no_grad():
        assert not torch.equal(alone.eval()(x, shared_input=True)[0], own_out[0])


def test_a_slot_trains_to_the_same_weights_alone_and_padded():
    """Forward and backward through the masks: SGD steps of the slot alone and padded end equal."""
    model = seeded(lambda: mlp(8, depth=2), 1)
    arrays = {"alone": ModelArray([copy.deepcopy(model)], dropout_seeds=[7], dtype=torch.float64),
              "padded": ModelArray([seeded(lambda: mlp(32, depth=3), 2), copy.deepcopy(model)], dropout_seeds=[5, 7],
                                   dtype=torch.float64)}
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(N, 2, 12, dtype=torch.float64, generator=generator),
                torch.randint(CLASSES, (N,), generator=generator)) for _ in range(STEPS)]
    from hfta_nas.optim import OPTIMIZERS

    for name, array in arrays.items():
        optimizer = OPTIMIZERS["sgd"](array, lr=0.1)
        array.train()
        for x, y in batches:
            logits = array(x, shared_input=True)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), y.repeat(len(array)), reduction="none")
            optimizer.zero_grad()
            loss.view(len(array), -1).mean(1).sum().backward()
            optimizer.step()
    alone, padded = arrays["alone"].slot_state_dict(0), arrays["padded"].slot_state_dict(1)
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


def _ops_of_one_dropout(slots):
    """The aten operations one array dropout layer runs (forward) for `slots` slots."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from hfta_nas._slot_layers import SlotDropout

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
    with Count() as counted:
        layer.native_forward(x, keys, calls)
    return counted.ops


def test_a_dropout_layer_runs_as_many_operations_for_32_slots_as_for_1():
    """All slots' masks in one pass of each operation (one kernel each on a GPU), never a loop over slots."""
    assert _ops_of_one_dropout(1) == _ops_of_one_dropout(32)


def test_the_dropout_benchmark_runs_and_reports_ratios(tmp_path):
    from benchmarks.dropout import main

    out = tmp_path / "dropout.json"
    assert main(["--shapes", "mlp-64", "--slots", "1,2", "--repeats", "1", "--inner", "1", "--out", str(out)]) == 0
    import json

    rows = json.loads(out.read_text())["rows"]
    assert [r["slots"] for r in rows] == [1, 2] and all(r["ratio"] > 0 for r in rows)
