"""An envelope whose remaining slots share their shapes drops its padding (hfta_nas/array/_unpad.py):
the survivors train on as an array of their own shapes, exactly as their models alone (float64,
torch.optim as the reference), with dropout masks, BatchNorm statistics and optimizer state carried
over, and a checkpoint taken after the change resumes bit-identical."""

import copy

import pytest
import torch
from test_checkpoint import Killed
from test_checkpoint import model as conv_model
from test_envelope import (
    OPTIMIZERS,
    STEPS_PER_EPOCH,
    act_drop_mlp,
    array_optimizer,
    assert_slot_equals,
    build,
    float_inputs,
    make_batches,
    mlp,
    per_slot,
    run_array,
    run_plain,
    slot_batches,
)
from test_forward_state import Counted
from torch import nn

from hfta_nas import ArrayTrainer, ModelArray
from hfta_nas.optim import Adam
from hfta_nas.training._checkpoint import Checkpointer

EPOCHS = 3


@pytest.mark.parametrize("opt_name", ["SGD", "Adam", "RMSprop"])
@pytest.mark.parametrize("dropped", [[1], [1, 2]], ids=["two of one shape", "one alone"])
def test_survivors_of_one_shape_train_on_as_their_models_alone(opt_name, dropped):
    models = build([lambda: mlp(16, 1), lambda: mlp(24, 2), lambda: mlp(16, 1)])
    batches = make_batches(float_inputs, len(models), EPOCHS * STEPS_PER_EPOCH)
    arr = ModelArray([copy.deepcopy(m) for m in models], dtype=torch.float64)
    opt, sched = array_optimizer(arr, opt_name)
    run_array(arr, opt, sched, batches[:STEPS_PER_EPOCH])
    keep = arr.drop_slots(dropped)
    assert arr._slots is None and arr.flat.shape[1] == sum(p.numel() for p in models[0].parameters())
    later = [(x[keep], y[keep]) for x, y in batches[STEPS_PER_EPOCH:]]
    run_array(arr, opt, sched, later, first_step=STEPS_PER_EPOCH)
    hp = per_slot(OPTIMIZERS[opt_name], len(models))
    for new, old in enumerate(keep):
        kwargs = {k: v[old] for k, v in hp.items()}
        assert_slot_equals(arr, new, run_plain(models[old], opt_name, kwargs, old, slot_batches(batches, old)))


def test_survivors_of_different_shapes_keep_their_envelope():
    models = build([lambda: mlp(16, 1), lambda: mlp(24, 2), lambda: mlp(32, 1)])
    arr = ModelArray(models, dtype=torch.float64)
    arr.drop_slots([1])
    assert arr._slots is not None


class DropoutGRU(nn.Module):
    """Two GRU layers with dropout between them (a layer of the array's own, with no module in the user's
    model) and a dropout before the head."""

    def __init__(self, hidden):
        super().__init__()
        self.rnn = nn.GRU(2, hidden, num_layers=2, dropout=0.3, batch_first=True)
        self.drop, self.head = nn.Dropout(0.2), nn.Linear(hidden, 3)

    def forward(self, x):  # x [N, 2, 12]: 12 time steps of 2 features
        out, _ = self.rnn(x.transpose(1, 2))
        return self.head(self.drop(out[:, -1]))


DROPOUT_PAIRS = {
    "mlp": [lambda: act_drop_mlp(16, nn.Tanh(), 0.3), lambda: act_drop_mlp(24, nn.ReLU(), 0.1)],
    "gru": [lambda: DropoutGRU(6), lambda: DropoutGRU(9)],
}


def trained_with_dropout(unpad, monkeypatch, kind="mlp"):
    """A model with dropout and a wider one (another activation for the MLP): the wide one leaves after an
    epoch."""
    models = build(DROPOUT_PAIRS[kind])
    batches = make_batches(float_inputs, len(models), EPOCHS * STEPS_PER_EPOCH)
    arr = ModelArray([copy.deepcopy(m) for m in models], dtype=torch.float64, dropout_seeds=[3, 4])
    opt, sched = array_optimizer(arr, "Adam")
    run_array(arr, opt, sched, batches[:STEPS_PER_EPOCH])
    if not unpad:
        monkeypatch.setattr(ModelArray, "_drop_padding_if_one_shape", lambda self: None)
    arr.drop_slots([1])
    run_array(arr, opt, sched, [(x[:1], y[:1]) for x, y in batches[STEPS_PER_EPOCH:]], first_step=STEPS_PER_EPOCH)
    return arr


@pytest.mark.parametrize("kind", sorted(DROPOUT_PAIRS))
def test_dropout_masks_go_on_as_the_envelope_would_draw_them(monkeypatch, kind):
    """The survivor draws, step after step, the masks it drew in the envelope (a recurrent layer's
    inter-layer dropout too): its weights end where the envelope, kept padded, takes them (to float
    noise; float64)."""
    unpadded = trained_with_dropout(True, monkeypatch, kind)
    padded = trained_with_dropout(False, monkeypatch, kind)
    assert unpadded._slots is None and padded._slots is not None
    calls = [value for name, value in unpadded._slot_random.items() if name.endswith("calls")]
    assert calls and all(int(c[0]) == EPOCHS * STEPS_PER_EPOCH for c in calls)  # counted through the change
    for key, value in padded.slot_state_dict(0).items():
        torch.testing.assert_close(unpadded.slot_state_dict(0)[key], value, rtol=1e-12, atol=1e-14, msg=key)


WIDTHS = {0: 4, 1: 6, 2: 4}  # slot 1 leaves after the first epoch; 0 and 2 share their shapes


def make_trainer(data):
    ids = [0, 1, 2]
    arr = ModelArray([conv_model(WIDTHS[i], i) for i in ids], dropout_seeds=[7, 8, 9], dtype=torch.float64)
    opt = Adam(arr, lr=[1e-2, 3e-3, 2e-2])
    return ArrayTrainer(arr, opt, data, batch_size=16, data_seeds=[1, 2, 3], slot_ids=ids)


def stop_the_wide_one(report, trainer):
    if report.epoch == 1 and 1 in trainer.slot_ids:
        trainer.stop([1], reason="pruned")


def test_a_checkpoint_after_the_change_resumes_bit_identical(tiny_data, tmp_path):
    reference = make_trainer(tiny_data)
    reference.fit(EPOCHS + 1, on_epoch=stop_the_wide_one)
    assert reference.array._slots is None  # the envelope dropped its padding

    checkpointer = Checkpointer(tmp_path / "array.pt")

    def save_then_kill(trainer):
        checkpointer(trainer)
        if trainer.epoch == 2:
            raise Killed

    with pytest.raises(Killed):
        make_trainer(tiny_data).fit(EPOCHS + 1, on_epoch=stop_the_wide_one, checkpoint=save_then_kill)
    resumed = Checkpointer(tmp_path / "array.pt")
    trainer = resumed.resume(lambda: make_trainer(tiny_data), lambda sid: None)
    trainer.fit(EPOCHS + 1, on_epoch=stop_the_wide_one, checkpoint=resumed)
    assert trainer.results == reference.results  # every epoch's metrics, to the bit
    for slot in range(len(trainer.slot_ids)):
        for key, value in reference.array.slot_state_dict(slot).items():
            assert torch.equal(trainer.array.slot_state_dict(slot)[key], value), key


class Unsaved(nn.Module):
    """A buffer its state_dict leaves out (persistent=False), counted up by the forward."""

    def __init__(self, width):
        super().__init__()
        self.fc, self.out = nn.Linear(8, width), nn.Linear(width, 3)
        self.register_buffer("seen", torch.zeros(()), persistent=False)

    def forward(self, x):
        self.seen += 1
        return self.out(torch.tanh(self.fc(x))) * (1 + self.seen / 100)


@pytest.mark.parametrize("make", [Counted, Unsaved], ids=["python counter", "unsaved buffer"])
def test_state_outside_the_state_dict_goes_on_exactly(make):
    """Step by step against each model alone with torch.optim.Adam (float64): a Python step counter that
    halves the output after a warm-up (test_forward_state's) is set on the new template; an unsaved
    buffer keeps the envelope (its value cannot move)."""
    models = build([lambda: make(16), lambda: make(24), lambda: make(16)])
    arr = ModelArray([copy.deepcopy(m) for m in models], dtype=torch.float64)
    opt = Adam(arr, lr=[1e-2] * 3)
    alone = {slot: torch.optim.Adam(m.parameters(), lr=1e-2) for slot, m in enumerate(models)}
    g = torch.Generator().manual_seed(0)
    slots = [0, 1, 2]
    for step in range(6):
        if step == 2:
            slots = [slots[b] for b in arr.drop_slots([1])]
            assert (arr._slots is None) is (make is Counted)
        x = torch.randn(len(slots), 5, 8, generator=g, dtype=torch.float64)
        out = arr(x)
        out.square().mean(dim=(1, 2)).sum().backward()
        opt.step()
        opt.zero_grad()
        for b, slot in enumerate(slots):
            expected = models[slot](x[b])
            torch.testing.assert_close(out[b], expected, rtol=1e-10, atol=1e-10, msg=f"step {step} slot {slot}")
            expected.square().mean().backward()
            alone[slot].step()
            alone[slot].zero_grad()
