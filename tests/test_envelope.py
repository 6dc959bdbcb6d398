"""Arrays of one structure and different sizes (envelopes) against plain PyTorch, slot by slot.

What this file proves:

1. Training a mixed-size array equals training each slot's own model alone
   with torch.optim and torch.optim.lr_scheduler, to 1e-10 (relative to each
   tensor's largest magnitude) in float64, for every array optimizer with
   per-slot hyper-parameters and per-slot LR schedules, on: MLPs of different
   widths and depths; 1-d CNNs of different channels and kernels 3/5/7;
   Conv -> BatchNorm of different channel counts (running stats and
   num_batches_tracked included); GroupNorm / LayerNorm over padded features
   followed by f(0) != 0 activations; GRU / LSTM of different hidden sizes and
   layers; per-slot activations and dropout rates; Embedding +
   TransformerEncoder of different widths and depths; a user module class
   whose constructor takes sizes.
2. Padded entries of `arr.flat` stay bit-exactly +0.0, and so does the
   optimizer state there, with every optimizer.
3. `slot_state_dict` / `to_module` / `load_slot` use each slot's own shapes;
   `replace_slot` with a smaller model trains like that model alone;
   `drop_slots` keeps the survivors exact.
4. Combinations that cannot be embedded exactly are refused with FusionError
   naming the layer: at construction (kernels, geometry, layer types,
   settings, bidirectional GRU, heads, grouped conv, shape-changing depth) or
   at the first call (user forwards that padding breaks).
5. The first-call verification runs once per slot, and again for a replaced slot.
6. `padding_cost()` counts equal torch.utils.flop_counter on the own models.
"""

import copy
from collections import OrderedDict

import pytest
import torch
from test_trainer import OPTIMIZERS, SCHEDULE, torch_schedule
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

import hfta_nas
import hfta_nas.array._model_array
from hfta_nas import FusionError, ModelArray
from hfta_nas.optim import LRSchedule

RTOL = 1e-10
CLASSES = 3
IN_SHAPE = (2, 12)  # 2 channels x 12 steps; 24 features once flattened
VOCAB, SEQ, NHEAD = 20, 6, 2
BATCH = 8
STEPS_PER_EPOCH = 3
EPOCHS = 3  # the schedule steps once per epoch
INIT_SEED = 100  # slot b is built after torch.manual_seed(INIT_SEED + b)


# ---------------------------------------------------------------- the models
def mlp(width, depth, act=nn.Tanh):
    layers = [nn.Flatten(), nn.Linear(24, width), act()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), act()]
    return nn.Sequential(*layers, nn.Linear(width, CLASSES))


def cnn1d(channels, kernel):
    c1, c2 = channels
    return nn.Sequential(
        nn.Conv1d(2, c1, kernel, padding=kernel // 2),
        nn.ReLU(),
        nn.MaxPool1d(2),
        nn.Conv1d(c1, c2, kernel, padding=kernel // 2),
        nn.ReLU(),
        nn.MaxPool1d(2),
        nn.Flatten(),
        nn.Linear(c2 * 3, CLASSES),
    )


def bn_cnn(channels):
    # No conv bias before BatchNorm: its true gradient is zero (see conv_bn_model in test_trainer.py).
    return nn.Sequential(
        nn.Conv1d(2, channels, 3, padding=1, bias=False),
        nn.BatchNorm1d(channels),
        nn.ReLU(),
        nn.MaxPool1d(2),
        nn.Flatten(),
        nn.Linear(channels * 6, CLASSES),
    )


def norm_net(channels, hidden):
    # Softplus(0) and Sigmoid(0) are not 0: padded channels / features are non-zero after them.
    return nn.Sequential(
        nn.Conv1d(2, channels, 3, padding=1),
        nn.GroupNorm(2, channels),
        nn.Softplus(),
        nn.Flatten(),
        nn.Linear(channels * 12, hidden),
        nn.LayerNorm(hidden),
        nn.Sigmoid(),
        nn.Linear(hidden, CLASSES),
    )


def act_drop_mlp(width, act, p):
    return nn.Sequential(nn.Flatten(), nn.Linear(24, width), act, nn.Dropout(p), nn.Linear(width, CLASSES))


class RecurrentNet(nn.Module):
    def __init__(self, kind, hidden, layers):
        super().__init__()
        self.rnn = kind(2, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, CLASSES)

    def forward(self, x):  # x [N, 2, 12]: 12 time steps of 2 features
        out, _ = self.rnn(x.transpose(1, 2))
        return self.head(out[:, -1])


class TinyTransformer(nn.Module):
    def __init__(self, d_model, ff, layers, bias=True):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model)
        layer = nn.TransformerEncoderLayer(d_model, NHEAD, ff, dropout=0.0, batch_first=True, bias=bias)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, CLASSES)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(1))


class Residual(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(width, width), nn.ReLU())

    def forward(self, x):
        return x + self.body(x)


class Net(nn.Module):
    """A user factory class: sizes in the constructor, kept as attributes."""

    def __init__(self, width, depth):
        super().__init__()
        self.width, self.depth = width, depth
        self.stem = nn.Linear(24, width)
        self.blocks = nn.ModuleList([Residual(width) for _ in range(depth)])
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x):
        h = torch.relu(self.stem(x.flatten(1)))
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def float_inputs(slots, n, generator):
    return torch.randn(slots, n, *IN_SHAPE, generator=generator, dtype=torch.float64)


def token_inputs(slots, n, generator):
    return torch.randint(0, VOCAB, (slots, n, SEQ), generator=generator)


# name -> (one builder per slot, input maker); every slot differs in size from the others
WORKLOADS = {
    "mlp": ([lambda: mlp(16, 1), lambda: mlp(24, 2), lambda: mlp(32, 3), lambda: mlp(24, 3)], float_inputs),
    "cnn1d": (
        [
            lambda: cnn1d((16, 16), 3),
            lambda: cnn1d((32, 32), 5),
            lambda: cnn1d((16, 32), 7),
            lambda: cnn1d((32, 16), 3),
        ],
        float_inputs,
    ),
    "bn_cnn": ([lambda: bn_cnn(4), lambda: bn_cnn(8), lambda: bn_cnn(6)], float_inputs),
    "norms": ([lambda: norm_net(4, 8), lambda: norm_net(8, 12), lambda: norm_net(6, 16)], float_inputs),
    "gru": (
        [lambda: RecurrentNet(nn.GRU, 8, 1), lambda: RecurrentNet(nn.GRU, 12, 2), lambda: RecurrentNet(nn.GRU, 10, 1)],
        float_inputs,
    ),
    "lstm": (
        [
            lambda: RecurrentNet(nn.LSTM, 8, 2),
            lambda: RecurrentNet(nn.LSTM, 12, 1),
            lambda: RecurrentNet(nn.LSTM, 10, 2),
        ],
        float_inputs,
    ),
    "transformer": (
        [lambda: TinyTransformer(8, 16, 1), lambda: TinyTransformer(12, 24, 2), lambda: TinyTransformer(16, 20, 2)],
        token_inputs,
    ),
    "transformer_nobias": (
        [
            lambda: TinyTransformer(8, 16, 1, bias=False),
            lambda: TinyTransformer(12, 24, 2, bias=False),
            lambda: TinyTransformer(16, 20, 2, bias=False),
        ],
        token_inputs,
    ),
    "net": ([lambda: Net(16, 1), lambda: Net(24, 3), lambda: Net(32, 2)], float_inputs),
    # hidden layers narrower than the 24 inputs (as an MLP on images would have)
    "mlp_narrow": ([lambda: mlp(8, 1), lambda: mlp(12, 2), lambda: mlp(16, 3)], float_inputs),
    # the widest slot is the shallowest: the layers it skips are sized to its width too
    "wide_shallow": ([lambda: mlp(32, 1), lambda: mlp(8, 3), lambda: mlp(16, 2)], float_inputs),
    "wide_shallow_transformer": ([lambda: TinyTransformer(16, 20, 1), lambda: TinyTransformer(8, 16, 3)], token_inputs),
    "inplace_relu": (
        [
            lambda: mlp(16, 2, lambda: nn.ReLU(inplace=True)),
            lambda: mlp(24, 2, lambda: nn.ReLU(inplace=True)),
            lambda: mlp(16, 2, nn.Tanh),
        ],
        float_inputs,
    ),
}


# ---------------------------------------------------------------- helpers
@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The tensors here are tiny: a second OpenMP thread only spins, and on a busy 2-core
    machine it made this file 30x slower. Restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build(builders, first_seed=INIT_SEED):
    """One float64 model per builder, slot b built after torch.manual_seed(first_seed + b)."""
    models = []
    for slot, builder in enumerate(builders):
        torch.manual_seed(first_seed + slot)
        models.append(builder().double())
    return models


def make_batches(make_x, slots, steps, seed=0):
    """`steps` batches ([slots, BATCH, ...] inputs, [slots, BATCH] labels): each slot its own data."""
    g = torch.Generator().manual_seed(seed)
    return [(make_x(slots, BATCH, g), torch.randint(0, CLASSES, (slots, BATCH), generator=g)) for _ in range(steps)]


def per_slot(values, slots):
    return {name: list(v[:slots]) for name, v in values.items()}


def array_optimizer(arr, opt_name, hparams=None, schedule=True):
    hp = per_slot(hparams or OPTIMIZERS[opt_name], len(arr))
    opt = getattr(hfta_nas.optim, opt_name)(arr, **hp)
    return opt, (LRSchedule(opt, **per_slot(SCHEDULE, len(arr))) if schedule else None)


def run_array(arr, opt, sched, batches, first_step=0):
    """Train the array on `batches` ([len(arr), ...] each); the schedule steps every STEPS_PER_EPOCH steps."""
    arr.train()
    for step, (x, y) in enumerate(batches, start=first_step):
        logits = arr(x)
        loss = sum(F.cross_entropy(logits[b], y[b]) for b in range(len(arr)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if sched is not None and (step + 1) % STEPS_PER_EPOCH == 0:
            sched.step()


def run_plain(model, opt_name, kwargs, schedule_slot, batches):
    """One model alone: torch.optim with `kwargs`, torch_schedule(slot) from test_trainer.py."""
    model.train()
    opt = getattr(torch.optim, opt_name)(model.parameters(), **kwargs)
    sched = torch_schedule(opt, schedule_slot) if schedule_slot is not None else None
    for step, (x, y) in enumerate(batches):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if sched is not None and (step + 1) % STEPS_PER_EPOCH == 0:
            sched.step()
    return model


def slot_batches(batches, slot):
    return [(x[slot], y[slot]) for x, y in batches]


def train_both(workload, opt_name, hparams=None, schedule=True):
    """The workload's mixed array and each slot's own model, trained on the same per-slot data."""
    builders, make_x = WORKLOADS[workload]
    models = build(builders)
    batches = make_batches(make_x, len(models), EPOCHS * STEPS_PER_EPOCH)
    arr = ModelArray([copy.deepcopy(m) for m in models], dtype=torch.float64)
    assert arr._slots is not None  # a mixed array, not one of equal shapes
    opt, sched = array_optimizer(arr, opt_name, hparams, schedule)
    run_array(arr, opt, sched, batches)
    hp = per_slot(hparams or OPTIMIZERS[opt_name], len(models))
    refs = [
        run_plain(model, opt_name, {k: v[b] for k, v in hp.items()}, b if schedule else None, slot_batches(batches, b))
        for b, model in enumerate(models)
    ]
    return arr, opt, refs


_TRAINED = {}


def trained(workload, opt_name):
    """`train_both` with the default hyper-parameters and schedules, cached: several tests read one run."""
    if (workload, opt_name) not in _TRAINED:
        _TRAINED[workload, opt_name] = train_both(workload, opt_name)
    return _TRAINED[workload, opt_name]


def assert_slot_equals(arr, slot, model, rtol=RTOL):
    """Every tensor of the slot's own state_dict (parameters and buffers) within rtol of `model`'s,
    relative to the tensor's largest magnitude (as assert_equivalent in test_trainer.py)."""
    state = arr.slot_state_dict(slot)
    assert list(state) == list(model.state_dict())
    for key, expected in model.state_dict().items():
        scale = expected.abs().max().item() if expected.is_floating_point() else 0.0
        torch.testing.assert_close(
            state[key],
            expected,
            rtol=rtol,
            atol=rtol * scale,
            msg=lambda m, slot=slot, key=key: f"slot {slot} {key}: {m}",
        )


def assert_eval_outputs_equal(arr, models, slots, make_x, rtol=RTOL):
    """Eval-mode outputs of the array's slots equal each own model's on one shared batch."""
    x = make_x(1, 16, torch.Generator().manual_seed(123))[0]
    arr.eval()
    with torch.no_grad():
        out = arr(x, shared_input=True)
        for slot in slots:
            expected = models[slot].eval()(x)
            scale = expected.abs().max().item()
            torch.testing.assert_close(
                out[slot], expected, rtol=rtol, atol=rtol * scale, msg=lambda m, slot=slot: f"slot {slot}: {m}"
            )
    arr.train()


def macs_per_sample(model, x):
    """torch's flop counter on one forward of `model`: multiply-adds (flops / 2) per sample."""
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    return round(counter.get_total_flops() / 2 / x.shape[0])


def named(**layers):
    return nn.Sequential(OrderedDict(layers))


# ------------------------------------------- 1. equal to plain PyTorch per slot
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("workload", ["mlp", "cnn1d", "norms"])
def test_mixed_sizes_train_like_plain_pytorch_with_every_optimizer(workload, opt_name):
    """Widths and depths (mlp), channels and kernels 3/5/7 (cnn1d), GroupNorm / LayerNorm over
    padding (norms); every optimizer and every schedule kind (step, cosine, exponential,
    constant, with and without warm-up)."""
    arr, _, refs = trained(workload, opt_name)
    for slot, ref in enumerate(refs):
        assert_slot_equals(arr, slot, ref)
    assert_eval_outputs_equal(arr, refs, range(len(refs)), WORKLOADS[workload][1])


@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
def test_batchnorm_of_different_channels_trains_like_plain_pytorch(opt_name):
    arr, _, refs = trained("bn_cnn", opt_name)
    for slot, ref in enumerate(refs):
        assert_slot_equals(arr, slot, ref)  # running_mean / running_var / num_batches_tracked included
        assert int(arr.slot_state_dict(slot)["1.num_batches_tracked"]) == EPOCHS * STEPS_PER_EPOCH
    assert_eval_outputs_equal(arr, refs, range(len(refs)), float_inputs)  # eval uses the running stats


@pytest.mark.parametrize("workload,opt_name", [("gru", "Adam"), ("gru", "SGD"), ("lstm", "RMSprop"), ("lstm", "AdamW")])
def test_recurrent_hidden_sizes_and_layers_train_like_plain_pytorch(workload, opt_name):
    arr, _, refs = trained(workload, opt_name)
    for slot, ref in enumerate(refs):
        assert_slot_equals(arr, slot, ref)
    assert_eval_outputs_equal(arr, refs, range(len(refs)), float_inputs)


@pytest.mark.parametrize("workload,opt_name", [("transformer", "SGD"), ("transformer_nobias", "Adam")])
def test_transformer_widths_and_depths_train_like_plain_pytorch(workload, opt_name):
    """SGD with attention biases; Adam without (the key bias has an exactly-zero true gradient,
    whose float noise Adam would amplify)."""
    arr, _, refs = trained(workload, opt_name)
    for slot, ref in enumerate(refs):
        assert_slot_equals(arr, slot, ref)
    assert_eval_outputs_equal(arr, refs, range(len(refs)), token_inputs)


def test_user_module_class_with_sizes_trains_like_plain_pytorch():
    arr, _, refs = trained("net", "RMSprop")
    for slot, ref in enumerate(refs):
        assert_slot_equals(arr, slot, ref)
    assert_eval_outputs_equal(arr, refs, range(len(refs)), float_inputs)


def test_depths_differ_where_hidden_layers_are_narrower_than_the_input():
    arr, _, refs = train_both("mlp_narrow", "SGD")
    for slot, ref in enumerate(refs):
        assert_slot_equals(arr, slot, ref)


@pytest.mark.parametrize("workload,opt_name", [("wide_shallow", "Adam"), ("wide_shallow_transformer", "SGD")])
def test_widest_slot_may_be_the_shallowest(workload, opt_name):
    arr, _, refs = train_both(workload, opt_name)
    for slot, ref in enumerate(refs):
        assert_slot_equals(arr, slot, ref)


def test_inplace_activations_train_like_plain_pytorch():
    arr, _, refs = train_both("inplace_relu", "SGD")
    for slot, ref in enumerate(refs):
        assert_slot_equals(arr, slot, ref)


ACT_DROP = [
    lambda: act_drop_mlp(16, nn.ReLU(), 0.0),
    lambda: act_drop_mlp(24, nn.GELU(), 0.0),
    lambda: act_drop_mlp(16, nn.Tanh(), 0.3),
    lambda: act_drop_mlp(32, nn.Softplus(), 0.0),
]


def test_per_slot_activation_and_dropout_rate_train_like_plain_pytorch():
    """Slots with p=0 train exactly like torch (whatever the others' rates); the p=0.3 slot's
    masks differ from torch's by design, so it is compared in eval mode with its own trained weights."""
    models = build(ACT_DROP)
    batches = make_batches(float_inputs, len(models), EPOCHS * STEPS_PER_EPOCH)
    arr = ModelArray([copy.deepcopy(m) for m in models], dtype=torch.float64)
    opt, sched = array_optimizer(arr, "SGD")
    run_array(arr, opt, sched, batches)
    hp = per_slot(OPTIMIZERS["SGD"], len(models))
    for slot in (0, 1, 3):
        ref = run_plain(models[slot], "SGD", {k: v[slot] for k, v in hp.items()}, slot, slot_batches(batches, slot))
        assert_slot_equals(arr, slot, ref)
    own_dropping = arr.to_module(2, ACT_DROP[2]().double())
    assert not torch.equal(own_dropping[1].weight, models[2][1].weight)  # it trained
    models[2] = own_dropping
    assert_eval_outputs_equal(arr, models, range(len(models)), float_inputs)


def test_per_slot_dropout_rate_drops_its_share_of_units():
    """A unit is dropped (0) or kept and scaled by 1/(1-p): p=0.5 drops about half, p=0 none, each slot its own."""
    rates, hidden, units = [0.5, 0.0, 0.2], [4, 8, 6], 512
    models = [
        nn.Sequential(nn.Linear(1, h), nn.Linear(h, units), nn.Dropout(p)).double() for h, p in zip(hidden, rates)
    ]
    for model in models:
        nn.init.zeros_(model[1].weight)
        nn.init.ones_(model[1].bias)  # every unit is 1 before dropout
    arr = ModelArray(models, dtype=torch.float64)
    x = torch.ones(64, 1, dtype=torch.float64)
    with torch.no_grad():
        out = arr.train()(x, shared_input=True)
        for slot, p in enumerate(rates):
            kept = out[slot] != 0
            assert torch.equal(out[slot][kept], torch.full_like(out[slot][kept], 1.0 / (1.0 - p)))
            assert kept.double().mean().item() == pytest.approx(1.0 - p, abs=0.02)
        assert out[1].eq(1.0).all()  # p=0: nothing dropped, nothing scaled
        assert not torch.equal(out[0], arr(x, shared_input=True)[0])  # a fresh mask every call
        assert torch.equal(arr.eval()(x, shared_input=True), torch.ones(len(rates), 64, units, dtype=torch.float64))


# ------------------------------------------------ 2. padding stays exactly zero
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("workload", ["mlp", "cnn1d", "norms"])
def test_padded_entries_and_their_optimizer_state_stay_exactly_zero(workload, opt_name):
    arr, opt, _ = trained(workload, opt_name)
    padded = arr._slots.padded
    assert padded.shape == arr.flat.shape and padded.any() and not padded.all(dim=1).any()
    values = arr.flat.detach()[padded]
    assert (values == 0).all() and not torch.signbit(values).any()  # +0.0, bit-exactly
    assert arr.flat.detach()[~padded].ne(0).any()  # the real entries trained
    assert opt.state, "the optimizer keeps state"
    for name, state in opt.state.items():
        assert state.shape == arr.flat.shape
        assert (state[padded] == 0).all(), f"optimizer state '{name}' is non-zero at padded entries"


# ----------------------------------------------------- 3. slot access, surgery
def test_slot_state_dict_loads_into_own_model_and_to_module_works():
    arr, _, refs = trained("bn_cnn", "SGD")
    for slot, builder in enumerate(WORKLOADS["bn_cnn"][0]):
        own = builder().double()
        state = arr.slot_state_dict(slot)
        assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in own.state_dict().items()}
        own.load_state_dict(state)  # strict
        made = arr.to_module(slot, builder().double())
        for key, value in own.state_dict().items():
            assert torch.equal(made.state_dict()[key], value), key
    assert_eval_outputs_equal(
        arr,
        [arr.to_module(b, f().double()) for b, f in enumerate(WORKLOADS["bn_cnn"][0])],
        range(len(arr)),
        float_inputs,
        rtol=1e-12,
    )


def test_load_slot_round_trips_and_touches_no_other_slot():
    builders, _ = WORKLOADS["bn_cnn"]
    arr = ModelArray(build(builders), dtype=torch.float64)
    before = [arr.slot_state_dict(b) for b in range(len(arr))]
    padded_before = arr._slots.padded.clone()
    other = build([builders[1]], first_seed=7)[0]
    with torch.no_grad():
        other[1].running_mean.uniform_(-1, 1)
        other[1].num_batches_tracked.fill_(5)
    arr.load_slot(1, other.state_dict())
    for key, value in other.state_dict().items():
        assert torch.equal(arr.slot_state_dict(1)[key], value), key
    for slot in (0, 2):
        for key, value in before[slot].items():
            assert torch.equal(arr.slot_state_dict(slot)[key], value), key
    assert torch.equal(arr._slots.padded, padded_before) and (arr.flat.detach()[arr._slots.padded] == 0).all()
    arr.load_slot(1, before[1])
    for key, value in before[1].items():
        assert torch.equal(arr.slot_state_dict(1)[key], value), key


def test_fits_accepts_smaller_models_and_refuses_larger_ones():
    arr = ModelArray(build(WORKLOADS["mlp"][0]), dtype=torch.float64)
    assert arr.fits(mlp(16, 2)) and arr.fits(mlp(32, 1))
    assert not arr.fits(mlp(40, 2)) and not arr.fits(mlp(16, 4))
    with pytest.raises(FusionError, match=r"'1\.weight' has shape \[40, 24\], larger than the array's envelope"):
        arr.replace_slot(0, mlp(40, 1))


def test_replace_slot_with_smaller_model_trains_like_it_alone():
    """After one epoch slot 2 (width 32, depth 3) gets a width-16 depth-2 model and a new lr: it
    trains as that model alone would, fresh optimizer state and schedule; the others are unchanged."""
    builders, make_x = WORKLOADS["mlp"]
    models = build(builders)
    steps = EPOCHS * STEPS_PER_EPOCH
    batches = make_batches(make_x, len(models), steps)
    arr = ModelArray([copy.deepcopy(m) for m in models], dtype=torch.float64)
    opt, sched = array_optimizer(arr, "Adam")
    run_array(arr, opt, sched, batches[:STEPS_PER_EPOCH])
    newcomer = build([lambda: mlp(16, 2)], first_seed=99)[0]
    arr.replace_slot(2, copy.deepcopy(newcomer))
    opt.set_hparams(2, lr=5e-3)
    run_array(arr, opt, sched, batches[STEPS_PER_EPOCH:], first_step=STEPS_PER_EPOCH)

    hp = per_slot(OPTIMIZERS["Adam"], len(models))
    for slot in (0, 1, 3):
        ref = run_plain(models[slot], "Adam", {k: v[slot] for k, v in hp.items()}, slot, slot_batches(batches, slot))
        assert_slot_equals(arr, slot, ref)
    ref = run_plain(
        newcomer,
        "Adam",
        {**{k: v[2] for k, v in hp.items()}, "lr": 5e-3},
        2,
        slot_batches(batches[STEPS_PER_EPOCH:], 2),
    )
    assert_slot_equals(arr, 2, ref)
    values = arr.flat.detach()[arr._slots.padded]
    assert (values == 0).all() and not torch.signbit(values).any()
    assert all((state[arr._slots.padded] == 0).all() for state in opt.state.values())


@pytest.mark.parametrize("opt_name", ["Adam", "SGD"])
def test_large_convolutions_run_each_slot_at_its_own_size(monkeypatch, opt_name):
    """Convolutions that take the per-slot loop convolve a smaller slot at its own channels and
    kernel (no padded arithmetic): still each slot's own training, padding still exactly zero."""
    from hfta_nas.layers import _slot_ops

    monkeypatch.setattr(_slot_ops, "_LOOP_MIN_MACS", 0)  # every convolution takes the loop
    arr, _, refs = train_both("cnn1d", opt_name)
    boxed = [m for m in arr._template.modules() if getattr(m, "_hfta_slot_boxes", None)]
    assert len(boxed) == 2 and all(box is not None for box in boxed[0]._hfta_slot_boxes)  # no slot fills (32, k7)
    for slot, ref in enumerate(refs):
        assert_slot_equals(arr, slot, ref)
    assert not arr.flat.detach()[arr._slots.padded].any()


def test_drop_slots_keeps_survivors_exact(monkeypatch):
    """Dropping the slot with 32 channels in both convs mid-training changes no survivor
    (convolutions in the per-slot loop, whose per-slot sizes must follow the drop)."""
    from hfta_nas.layers import _slot_ops

    monkeypatch.setattr(_slot_ops, "_LOOP_MIN_MACS", 0)
    builders, make_x = WORKLOADS["cnn1d"]
    models = build(builders)
    batches = make_batches(make_x, len(models), EPOCHS * STEPS_PER_EPOCH)
    arr = ModelArray([copy.deepcopy(m) for m in models], dtype=torch.float64)
    opt, sched = array_optimizer(arr, "RMSprop")
    run_array(arr, opt, sched, batches[:STEPS_PER_EPOCH])
    keep = arr.drop_slots([1])
    assert keep == [0, 2, 3] and len(arr) == 3 and arr._slots.padded.shape == arr.flat.shape
    run_array(arr, opt, sched, [(x[keep], y[keep]) for x, y in batches[STEPS_PER_EPOCH:]], first_step=STEPS_PER_EPOCH)
    hp = per_slot(OPTIMIZERS["RMSprop"], len(models))
    for new, old in enumerate(keep):
        ref = run_plain(models[old], "RMSprop", {k: v[old] for k, v in hp.items()}, old, slot_batches(batches, old))
        assert_slot_equals(arr, new, ref)


# ------------------------------------------ 4. what cannot be embedded is refused
class NormBlock(nn.Module):
    def __init__(self, width, norm, inputs=4):
        super().__init__()
        self.fc = nn.Linear(inputs, width)
        self.norm = norm

    def forward(self, x):
        return self.norm(self.fc(x))


class Clipped(nn.Module):
    """A user module whose int `bound` is a setting, not a size: it must be equal across slots."""

    def __init__(self, width, bound):
        super().__init__()
        self.bound = bound
        self.fc, self.head = nn.Linear(4, width), nn.Linear(width, CLASSES)

    def forward(self, x):
        return self.head(self.fc(x).clamp(-self.bound, self.bound))


class Tempered(nn.Module):
    """A float setting repr does not show: equal shapes, different behaviour."""

    def __init__(self, temperature):
        super().__init__()
        self.temperature = temperature
        self.fc = nn.Linear(4, CLASSES)

    def forward(self, x):
        return self.fc(x) / self.temperature


CONSTRUCTION_REFUSALS = {
    "user_int_that_is_no_size": (lambda: [Clipped(8, 1), Clipped(16, 100)], ["'<root>'", "'bound'"]),
    "hidden_setting_at_equal_shapes": (lambda: [Tempered(1.0), Tempered(0.1)], ["'temperature'"]),
    "pool_kernels": (
        lambda: [
            named(fc=nn.Conv1d(2, 4, 3, padding=1), pool=nn.MaxPool1d(2, stride=1)),
            named(fc=nn.Conv1d(2, 8, 3, padding=1), pool=nn.MaxPool1d(3, stride=1)),
        ],
        ["'pool'", "kernel_size"],
    ),
    "frozen_parameter": (
        lambda: [named(fc=nn.Linear(4, 8).requires_grad_(False)), named(fc=nn.Linear(4, 12))],
        ["'fc.weight'", "requires_grad=False"],
    ),
    "even_kernel_difference": (
        lambda: [named(conv=nn.Conv1d(2, 4, 3, padding=1)), named(conv=nn.Conv1d(2, 4, 4, padding=2))],
        ["'conv'", "odd"],
    ),
    "padding_changes_geometry": (
        lambda: [named(conv=nn.Conv1d(2, 4, 3)), named(conv=nn.Conv1d(2, 4, 5))],
        ["'conv'", "geometry"],
    ),
    "different_layer_types": (
        lambda: [NormBlock(8, nn.BatchNorm1d(8)), NormBlock(12, nn.LayerNorm(12))],
        ["'norm'", "BatchNorm1d", "LayerNorm"],
    ),
    "batchnorm_eps": (
        lambda: [
            named(fc=nn.Linear(4, 8), bn=nn.BatchNorm1d(8)),
            named(fc=nn.Linear(4, 12), bn=nn.BatchNorm1d(12, eps=1e-3)),
        ],
        ["'bn'", "eps"],
    ),
    "linear_bias": (lambda: [named(fc=nn.Linear(4, 8)), named(fc=nn.Linear(4, 12, bias=False))], ["fc.bias"]),
    "bidirectional_gru_hidden": (
        lambda: [named(rnn=nn.GRU(2, 8, bidirectional=True)), named(rnn=nn.GRU(2, 12, bidirectional=True))],
        ["'rnn'", "bidirectional"],
    ),
    "attention_heads": (
        lambda: [named(attn=nn.MultiheadAttention(16, 2)), named(attn=nn.MultiheadAttention(24, 4))],
        ["'attn'", "num_heads"],
    ),
    "grouped_conv_channels": (
        lambda: [
            named(conv=nn.Conv1d(4, 8, 3, padding=1, groups=2)),
            named(conv=nn.Conv1d(4, 16, 3, padding=1, groups=2)),
        ],
        ["'conv'", "grouped"],
    ),
    "extra_conv_pool_block": (
        lambda: [
            named(
                features=nn.Sequential(
                    nn.Conv1d(2, 4, 3, padding=1),
                    nn.ReLU(),
                    nn.MaxPool1d(2),
                    nn.Conv1d(4, 4, 3, padding=1),
                    nn.ReLU(),
                    nn.MaxPool1d(2),
                ),
                flat=nn.Flatten(),
                head=nn.Linear(12, CLASSES),
            ),
            named(
                features=nn.Sequential(nn.Conv1d(2, 8, 3, padding=1), nn.ReLU(), nn.MaxPool1d(2)),
                flat=nn.Flatten(),
                head=nn.Linear(48, CLASSES),
            ),
        ],
        ["'features'", "depth"],
    ),
}


@pytest.mark.parametrize("case", sorted(CONSTRUCTION_REFUSALS))
def test_unembeddable_combinations_are_refused_at_construction(case):
    make_models, expected = CONSTRUCTION_REFUSALS[case]
    with pytest.raises(FusionError) as refused:
        ModelArray(make_models())
    for part in expected:
        assert part in str(refused.value)


def test_bad_arguments_to_slot_access_are_clear_errors():
    arr = ModelArray([named(fc=nn.Linear(4, 8)), named(fc=nn.Linear(4, 12))])
    with pytest.raises(hfta_nas.HftaNasError, match="fits needs a torch.nn.Module, got int"):
        arr.fits(3)
    state = arr.slot_state_dict(0)
    state["fc.bias"] = "zeros"
    with pytest.raises(hfta_nas.HftaNasError, match="'fc.bias' is a str, not a tensor"):
        arr.load_slot(0, state)


@pytest.mark.filterwarnings("ignore:dropout option adds dropout after all but last recurrent layer")
def test_single_layer_recurrent_ignores_dropout_like_torch():
    """torch applies GRU dropout between layers only: a 1-layer GRU's dropout setting does not matter."""
    models = [
        named(rnn=nn.GRU(2, 8, num_layers=1, dropout=0.0, batch_first=True)),
        named(rnn=nn.GRU(2, 12, num_layers=3, dropout=0.3, batch_first=True)),
    ]
    assert ModelArray(models).fits(named(rnn=nn.GRU(2, 6, num_layers=1, dropout=0.5, batch_first=True)))


class KeywordLayers(nn.Module):
    """A skippable block called with a keyword argument, as some forwards do."""

    def __init__(self, depth):
        super().__init__()
        self.inp, self.out = nn.Linear(4, 8), nn.Linear(8, CLASSES)
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(depth)])

    def forward(self, x):
        h = self.inp(x)
        for layer in self.layers:
            h = layer(input=h)
        return self.out(h)


def test_skipped_block_called_with_a_keyword_is_exact():
    torch.manual_seed(0)
    models = [KeywordLayers(1).double(), KeywordLayers(3).double()]
    arr = ModelArray(copy.deepcopy(models))
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    out = arr(x)
    for slot, model in enumerate(models):
        torch.testing.assert_close(out[slot], model(x[slot]), rtol=RTOL, atol=RTOL)


def test_replacement_needing_a_missing_stand_in_is_refused():
    """Every slot had the full LayerNorm: a smaller one would need a padded LayerNorm the template lacks."""
    arr = ModelArray([NormBlock(8, nn.LayerNorm(8)), NormBlock(8, nn.LayerNorm(8), inputs=6)])
    assert not arr.fits(NormBlock(4, nn.LayerNorm(4)))
    with pytest.raises(FusionError, match="'norm'"):
        arr.replace_slot(0, NormBlock(4, nn.LayerNorm(4)))


class Centred(nn.Module):
    """Subtracts the mean over the hidden units: padded units change the mean."""

    def __init__(self, width):
        super().__init__()
        self.fc, self.head = nn.Linear(24, width), nn.Linear(width, CLASSES)

    def forward(self, x):
        h = self.fc(x.flatten(1))
        return self.head(h - h.mean(-1, keepdim=True))


class SoftmaxHidden(Centred):
    """A softmax over the hidden units: each padded unit adds exp(0) to the denominator."""

    def forward(self, x):
        return self.head(self.fc(x.flatten(1)).softmax(-1))


class ByWidth(Centred):
    """Divides by its stored width, which the envelope holds as the largest slot's."""

    def __init__(self, width):
        super().__init__(width)
        self.width = width

    def forward(self, x):
        return self.head(self.fc(x.flatten(1)) / self.width)


class OuterResidual(nn.Module):
    """The residual in the user's forward, around a block a shallower slot skips: a skipped
    block is the identity, so the envelope adds h + h where the own model adds nothing."""

    def __init__(self, width, depth):
        super().__init__()
        self.stem, self.head = nn.Linear(24, width), nn.Linear(width, CLASSES)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)])

    def forward(self, x):
        h = torch.relu(self.stem(x.flatten(1)))
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


FIRST_CALL_REFUSALS = {
    "mean_over_padded_features": lambda: [Centred(16), Centred(8)],
    "softmax_over_padded_units": lambda: [SoftmaxHidden(16), SoftmaxHidden(8)],
    "divide_by_stored_width": lambda: [ByWidth(16), ByWidth(8)],
    "residual_around_skipped_block": lambda: [OuterResidual(16, 2), OuterResidual(8, 1)],
}


@pytest.mark.parametrize("case", sorted(FIRST_CALL_REFUSALS))
def test_forward_that_padding_breaks_is_refused_on_first_call(case):
    arr = ModelArray(build([lambda m=m: m for m in FIRST_CALL_REFUSALS[case]()]), dtype=torch.float64)
    x = make_batches(float_inputs, len(arr), 1)[0][0]
    with pytest.raises(FusionError) as refused:
        arr.verify(x[0])
    message = str(refused.value)
    assert "slot 1" in message and "first at layer 'head'" in message
    with pytest.raises(FusionError, match="slot 1"):  # still refused: it never trains differently
        arr(x)


class MaxCentred(nn.Module):
    """Subtracts the max over the hidden units: the padding's zeros win the max only where all of
    a sample's real units are negative, so the error depends on the data."""

    def __init__(self, width):
        super().__init__()
        self.fc, self.head = nn.Linear(24, width), nn.Linear(width, CLASSES)

    def forward(self, x):
        h = self.fc(x.flatten(1))
        return self.head(h - h.amax(-1, keepdim=True))


class LeakyLoop(nn.Module):
    """leaky_relu in the parent's loop: where a shallower slot skips the first block, the envelope
    applies it to the input itself, which changes only the input's negative entries."""

    def __init__(self, width, depth):
        super().__init__()
        self.blocks = nn.ModuleList([*(nn.Linear(24, 24) for _ in range(depth - 1)), nn.Linear(24, width)])
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x):
        h = x.flatten(1)
        for block in self.blocks:
            h = F.leaky_relu(block(h))
        return self.head(h)


# name -> (the models, a first batch that alone shows no error, the layer the refusal names, whether
# the first batch's adversarial copies reveal the error). A first batch of zeros has no copies that
# differ from it (0 x -1 = 0), so only the running check on training batches can see that error.
DATA_DEPENDENT = {
    "max_over_padded_features": (lambda: [MaxCentred(16), MaxCentred(2)], torch.zeros_like, "'head'", False),
    "leaky_relu_over_a_skipped_block": (
        lambda: [LeakyLoop(16, 2), LeakyLoop(8, 1)],
        torch.abs,
        "'blocks.0'",
        True,
    ),
}


@pytest.mark.parametrize("case", sorted(DATA_DEPENDENT))
def test_a_padding_error_a_lucky_first_batch_hides_stops_the_array(case):
    """The first batch alone shows no error; the array must stop with a FusionError naming the
    layer, at the first call or at a running check, and stay stopped."""
    make_models, first_batch, layer, seen_at_first = DATA_DEPENDENT[case]
    arr = ModelArray(build([lambda m=m: m for m in make_models()]), dtype=torch.float64)
    arr.recheck_every = 2  # slot 1 is checked at calls 4, 8, 12
    opt = hfta_nas.optim.SGD(arr, lr=0.1)
    batches = make_batches(float_inputs, len(arr), 12)
    with pytest.raises(FusionError) as refused:
        for step, (x, y) in enumerate(batches):
            logits = arr(first_batch(x) if step == 0 else x)
            loss = sum(F.cross_entropy(logits[b], y[b]) for b in range(len(arr)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    message = str(refused.value)
    assert "slot 1" in message and f"first at layer {layer}" in message
    assert ("signs flipped" in message) == seen_at_first and ("training call" in message) != seen_at_first
    with pytest.raises(FusionError, match="slot 1"):  # stopped: it never trains on
        arr(batches[0][0])


@pytest.mark.parametrize("workload", ["mlp", "bn_cnn"])
def test_running_checks_leave_exact_training_exact(workload):
    """A check at every training call finds nothing to refuse and changes no weight or buffer."""
    builders, make_x = WORKLOADS[workload]
    models = build(builders)
    batches = make_batches(make_x, len(models), 6)
    arr = ModelArray([copy.deepcopy(m) for m in models], dtype=torch.float64)
    arr.recheck_every = 1
    opt, _ = array_optimizer(arr, "SGD", schedule=False)
    run_array(arr, opt, None, batches)
    hp = per_slot(OPTIMIZERS["SGD"], len(models))
    for b, model in enumerate(models):
        run_plain(model, "SGD", {k: v[b] for k, v in hp.items()}, None, slot_batches(batches, b))
        assert_slot_equals(arr, b, model)


# --------------------------------------------- 5. the verification runs once
def test_verification_runs_once_per_slot_and_again_for_a_replaced_slot(monkeypatch):
    calls = []
    real = hfta_nas.array._model_array.verify_slot

    def counting(array, slot, model, inputs):
        calls.append(slot)
        return real(array, slot, model, inputs)

    monkeypatch.setattr(hfta_nas.array._model_array, "verify_slot", counting)
    arr = ModelArray(build(WORKLOADS["mlp"][0]), dtype=torch.float64)
    assert sorted(arr._slots.unverified) == [0, 1, 2, 3] and calls == []
    x, _ = make_batches(float_inputs, len(arr), 1)[0]
    arr(x)
    assert calls == [0, 1, 2, 3] and not arr._slots.unverified
    arr(x)
    arr.eval()(x[0], shared_input=True)
    assert calls == [0, 1, 2, 3]
    arr.replace_slot(2, mlp(16, 2).double())
    assert list(arr._slots.unverified) == [2]
    arr.train()(x)
    arr(x)
    assert calls == [0, 1, 2, 3, 2] and not arr._slots.unverified


# --------------------------------------------------------- 6. padding_cost()
@pytest.mark.parametrize(
    "builders",
    [
        [lambda: mlp(16, 1), lambda: mlp(24, 2), lambda: mlp(32, 3)],
        [lambda: cnn1d((16, 16), 3), lambda: cnn1d((16, 32), 5), lambda: cnn1d((32, 32), 7)],
    ],
    ids=["mlp", "cnn1d"],
)
def test_padding_cost_counts_equal_torch_flop_counter(builders):
    """The last slot is the largest in every size: what each slot executes is that model."""
    models = build(builders)
    arr = ModelArray([copy.deepcopy(m) for m in models], dtype=torch.float64)
    x = float_inputs(1, 16, torch.Generator().manual_seed(5))[0]
    cost = arr.padding_cost(x)
    envelope = macs_per_sample(models[-1], x)
    assert cost.per_slot == [(macs_per_sample(m, x), envelope) for m in models]
    assert cost.useful == sum(macs_per_sample(m, x) for m in models) < cost.executed == len(models) * envelope
    assert 0 < cost.waste < 1


def test_padding_cost_of_equal_shapes_wastes_nothing():
    models = build([lambda: mlp(24, 2)] * 3)
    arr = ModelArray(models, dtype=torch.float64)
    assert arr._slots is None
    x = float_inputs(1, 16, torch.Generator().manual_seed(5))[0]
    cost = arr.padding_cost(x)
    assert cost.useful == cost.executed == 3 * macs_per_sample(models[0], x) and cost.waste == 0


def test_padding_cost_without_an_array_equals_the_arrays_and_works_on_meta():
    """hfta_nas.padding_cost(models, x): what packing needs before it builds anything."""
    builders = [lambda: cnn1d((16, 16), 3), lambda: cnn1d((32, 32), 7), lambda: cnn1d((16, 32), 5)]
    x = float_inputs(1, 16, torch.Generator().manual_seed(6))[0]
    arr = ModelArray(build(builders), dtype=torch.float64)
    arr.verify(x)
    assert hfta_nas.padding_cost(build(builders), x) == arr.padding_cost()
    with torch.device("meta"):
        meta_models = [make() for make in builders]
    on_meta = hfta_nas.padding_cost(meta_models, torch.empty(x.shape, device="meta"))
    assert on_meta == arr.padding_cost() and on_meta.waste > 0
