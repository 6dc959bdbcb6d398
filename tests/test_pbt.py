"""Population-based training in one array: exploit is exact (float64 against plain PyTorch loaded
from the source's state), explore touches only the target, other slots are never touched, the
records (schedule, lineage) say what happened, a stopped run resumes bit-identically, and bad
settings are refused in one line."""

import copy

import pytest
import torch
from conftest import synthetic_dataset
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import hfta_nas
from hfta_nas import ArrayTrainer, HftaNasError, ModelArray
from hfta_nas.data import Augmentation

INIT_SEEDS, DATA_SEEDS, BATCH = [3, 1, 4], [10, 11, 12], 16


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(24, 16), nn.Tanh(), nn.Linear(16, 3))


def mlp_with_dropout():
    return nn.Sequential(nn.Flatten(), nn.Linear(24, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))


def array_trainer(data, factory=mlp, lrs=(1e-2, 3e-3, 2e-2), schedule=False, augmentation=None):
    arr = ModelArray.from_factory(factory, seeds=INIT_SEEDS, dtype=torch.float64)
    opt = hfta_nas.optim.Adam(arr, lr=list(lrs), weight_decay=[0.0, 1e-3, 1e-2])
    sched = hfta_nas.optim.LRSchedule(opt, "cosine", t_max=6) if schedule else None
    return ArrayTrainer(
        arr, opt, data, batch_size=BATCH, data_seeds=DATA_SEEDS, schedule=sched, augmentation=augmentation
    )


class PlainRun:
    """One model alone: torch.optim.Adam and a shuffling DataLoader, as a user trains it."""

    def __init__(self, slot, data, lr, weight_decay):
        torch.manual_seed(INIT_SEEDS[slot])
        self.model = mlp().double()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=lr, weight_decay=weight_decay)
        self.generator = torch.Generator().manual_seed(DATA_SEEDS[slot])
        self.data = data

    def train(self, epochs):
        loader = DataLoader(
            TensorDataset(self.data.x_train, self.data.y_train),
            batch_size=BATCH,
            shuffle=True,
            generator=self.generator,
        )
        for _ in range(epochs):
            for x, y in loader:
                self.opt.zero_grad()
                F.cross_entropy(self.model(x), y).backward()
                self.opt.step()

    def loaded_copy(self):
        """A fresh plain model and optimizer loaded from this one's state dicts, reading on in its data order."""
        twin = copy.copy(self)
        twin.model = mlp().double()
        twin.model.load_state_dict(self.model.state_dict())
        twin.opt = torch.optim.Adam(twin.model.parameters())
        twin.opt.load_state_dict(copy.deepcopy(self.opt.state_dict()))  # load_state_dict keeps the tensors it is given
        twin.generator = torch.Generator().set_state(self.generator.get_state())
        return twin


def assert_slot_equals(arr, slot, model, rtol=1e-10):
    state = arr.slot_state_dict(slot)
    for key, expected in model.state_dict().items():
        torch.testing.assert_close(state[key], expected, rtol=rtol, atol=rtol * expected.abs().max().item())


def assert_same_slot(arr_a, slot_a, arr_b, slot_b, rtol):
    """Two slots' weights and buffers agree to rounding: the fused CPU optimizer kernels update runs of
    slots with equal hyper-parameters as one block, and where a slot's row falls in that block moves an
    element between the vectorised body and the scalar tail (1 ulp), so slots are equal only to rounding."""
    a, b = arr_a.slot_state_dict(slot_a), arr_b.slot_state_dict(slot_b)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=rtol, atol=rtol * max(a[key].abs().max().item(), 1.0))


def train_epochs(trainer, epochs, at_epoch=None, action=None):
    for report in trainer.epochs(epochs):
        if report.epoch == at_epoch:
            action(trainer)


# ------------------------------------------------------------------ exploit and explore
def test_an_exploited_slot_continues_as_plain_pytorch_loaded_from_the_source_float64():
    data = synthetic_dataset()
    trainer = array_trainer(data)

    def exploit_and_explore(t):
        t.copy_slot(0, 2)
        t.optimizer.set_hparams(2, lr=5e-3)  # explore: the copy goes on with another learning rate

    train_epochs(trainer, 4, at_epoch=2, action=exploit_and_explore)
    source = PlainRun(0, data, lr=1e-2, weight_decay=0.0)
    source.train(2)
    target = source.loaded_copy()  # a plain model loaded from the source's state dicts
    for group in target.opt.param_groups:
        group["lr"] = 5e-3
    source.train(2)
    target.train(2)
    assert_slot_equals(trainer.array, 0, source.model)
    assert_slot_equals(trainer.array, 2, target.model)


@pytest.mark.parametrize(
    "factory,augmentation,schedule",
    [(mlp_with_dropout, None, True), (mlp, Augmentation(noise=0.1, mixup=0.2), False)],
    ids=["dropout+cosine", "noise+mixup"],
)
def test_a_copy_without_explore_trains_as_its_source(factory, augmentation, schedule):
    """Dropout counters, the schedule's position and the augmentation streams are copied too."""
    trainer = array_trainer(synthetic_dataset(), factory, schedule=schedule, augmentation=augmentation)
    train_epochs(trainer, 5, at_epoch=2, action=lambda t: t.copy_slot(1, 0))
    assert_same_slot(trainer.array, 0, trainer.array, 1, rtol=1e-12)
    assert trainer.results[0].history[-1]["val_loss"] == pytest.approx(trainer.results[1].history[-1]["val_loss"])


def test_exploit_and_explore_never_touch_the_other_slots():
    data = synthetic_dataset()
    alone, surgery = array_trainer(data, schedule=True), array_trainer(data, schedule=True)

    def exploit_and_explore(t):
        before = {k: v.clone() for k, v in t.optimizer.hparams.items()}
        t.copy_slot(0, 2)
        t.optimizer.set_hparams(2, lr=5e-3, weight_decay=0.1)
        for name, values in t.optimizer.hparams.items():  # explore changed the target's values only
            assert torch.equal(values[:2], before[name][:2]), name

    train_epochs(alone, 4)
    train_epochs(surgery, 4, at_epoch=2, action=exploit_and_explore)
    for slot in (0, 1):  # to rounding: see assert_same_slot
        assert_same_slot(alone.array, slot, surgery.array, slot, rtol=1e-12)
        for row_a, row_b in zip(alone.results[slot].history, surgery.results[slot].history):
            assert row_a == pytest.approx(row_b, rel=1e-10)


def test_copy_slot_refuses_envelopes_and_ended_slots(tiny_data):
    widths = [8, 16]
    arr = ModelArray([nn.Sequential(nn.Flatten(), nn.Linear(24, w), nn.ReLU(), nn.Linear(w, 3)) for w in widths])
    with pytest.raises(hfta_nas.FusionError, match="copy_slot needs an array of equal shapes"):
        arr.copy_slot(0, 1)
    trainer = array_trainer(tiny_data)
    trainer.stop([1])  # a slot that left the array
    with pytest.raises(HftaNasError, match="no slot with id 1"):
        trainer.copy_slot(1, 0)
    trainer.results[2].status = "failed"  # as a diverged slot: frozen in place
    with pytest.raises(HftaNasError, match="only running slots"):
        trainer.copy_slot(0, 2)


# ------------------------------------------------------------ dropout and augmentation per slot
def dropout_mlp(rate):
    return lambda: nn.Sequential(
        nn.Flatten(),
        nn.Linear(24, 16),
        nn.ReLU(),
        nn.Dropout(rate),
        nn.Linear(16, 8),
        nn.Dropout(rate),
        nn.Linear(8, 3),
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_a_slot_given_a_dropout_rate_trains_as_if_built_with_it(dtype):
    data = synthetic_dataset(dtype=dtype)

    def trained(arr):
        trainer = ArrayTrainer(arr, hfta_nas.optim.SGD(arr, lr=0.1), data, batch_size=BATCH, data_seeds=DATA_SEEDS)
        trainer.fit(3)
        return arr

    built = trained(ModelArray.from_factory(dropout_mlp(0.3), seeds=INIT_SEEDS, dtype=dtype))
    given = ModelArray.from_factory(dropout_mlp(0.1), seeds=INIT_SEEDS, dtype=dtype)
    given.use_slot_dropout_rates()
    given.set_dropout_rate(1, 0.3)
    trained(given)
    a, b = built.slot_state_dict(1), given.slot_state_dict(1)
    assert all(torch.equal(a[k], b[k]) for k in a)  # the same masks, bit for bit
    assert given.dropout_rate(1) == 0.3 and given.dropout_rate(0) == 0.1
    with pytest.raises(HftaNasError, match=r"in \[0, 1\)"):
        given.set_dropout_rate(0, 1.0)


def test_a_slot_given_a_noise_std_or_mixup_alpha_augments_as_if_built_with_it():
    from hfta_nas.data import SlotAugmenter

    x, y = torch.randn(3, 8, 2, 12, dtype=torch.float64), torch.randint(0, 3, (3, 8))
    own = SlotAugmenter(Augmentation(noise=0.1, mixup=0.4), [5, 6, 7])
    own.set_strength(1, "noise", 0.3)
    own.set_strength(1, "mixup", 0.9)
    built = SlotAugmenter(Augmentation(noise=0.3, mixup=0.9), [5, 6, 7])
    ours, theirs = own(x, y), built(x, y)
    assert torch.equal(ours.x[1], theirs.x[1]) and ours.strength[1] == theirs.strength[1]
    assert not torch.equal(ours.x[0], theirs.x[0])  # slot 0 kept its own
    with pytest.raises(HftaNasError, match="cutmix is off"):
        own.set_strength(0, "cutmix", 1.0)


def test_a_copy_carries_batch_norm_statistics_momentum_and_the_fp16_loss_scale():
    from test_trainer import conv_bn_model

    data = synthetic_dataset(dtype=torch.float32)
    arr = ModelArray.from_factory(conv_bn_model, seeds=INIT_SEEDS)
    opt = hfta_nas.optim.SGD(arr, lr=[0.1, 0.05, 0.2], momentum=0.9)
    trainer = ArrayTrainer(
        arr, opt, data, batch_size=BATCH, data_seeds=DATA_SEEDS, augmentation=Augmentation(cutmix=1.0), precision="fp16"
    )
    trainer.scaler.scales[1] = 2.0**10  # the source's scale differs from the target's
    train_epochs(trainer, 4, at_epoch=2, action=lambda t: t.copy_slot(1, 0))
    assert_same_slot(arr, 0, arr, 1, rtol=1e-5)  # running mean / var and num_batches_tracked too (float32)
    assert trainer.scaler.scales[0] == trainer.scaler.scales[1]
    momentum = opt.state["momentum_buffer"]
    torch.testing.assert_close(momentum[0], momentum[1], rtol=1e-5, atol=1e-6)


def test_put_back_rates_decide_which_dropout_layers_draw_masks():
    """A layer built with rate 0 skips its masks; a slot given a rate above 0 must make it draw them,
    also in an array that gets the rates back from a checkpoint."""
    data = synthetic_dataset()
    given = ModelArray.from_factory(dropout_mlp(0.0), seeds=INIT_SEEDS, dtype=torch.float64)
    given.use_slot_dropout_rates()
    given.set_dropout_rate(2, 0.4)
    restored = ModelArray.from_factory(dropout_mlp(0.0), seeds=INIT_SEEDS, dtype=torch.float64)
    restored.use_slot_dropout_rates()
    restored.load_numeric_state(given.numeric_state())
    x = data.x_train[:16].expand(3, *data.x_train[:16].shape)
    assert torch.equal(given(x), restored(x))
    assert not torch.equal(given(x)[2], given.eval()(x)[2])  # slot 2 does drop in training mode


def test_one_augmented_batch_for_all_slots_has_no_per_slot_strength():
    with pytest.raises(HftaNasError, match="every slot shares one augmented batch"):
        hfta_nas.train(
            mlp,
            dataset=synthetic_dataset(),
            seeds=[0, 1],
            epochs=2,
            shared_order=True,
            augmentation=Augmentation(noise=0.1),
            hparam_schedule={"augment.noise": [0.1, 0.2]},
        )
