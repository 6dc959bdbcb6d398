"""What a user's forward keeps or decides per call, inside an array: exact against plain PyTorch, or refused
in one line that names the layer and the construct.

1. State a forward keeps: buffers it reassigns (`self.ema = ...`), Python attributes it advances (a step
   counter), with equal shapes and in an envelope. The first-call and running checks run on copies, so
   the user's forward runs once per call, as it would alone.
2. The running check reads the whole re-checked batch, also in eval-mode training; `recheck_every`.
3. Forwards vmap cannot fuse: branches on tensor values, `.item()`, data-dependent shapes run slot by slot
   (exact); activation checkpointing, legacy spectral_norm and parametrizations in an envelope are refused.
4. Hooks, weight tying, parametrizations and norms over padded features: exact or cleanly refused.

Every test compares in float64 with torch.optim.Adam on each model alone, step by step.
"""

import copy
import warnings

import pytest
import torch
import torch.utils.checkpoint as checkpoint
from torch import nn

import hfta_nas
from hfta_nas import FusionError, FusionFallbackWarning, HftaNasError, ModelArray

IN, BATCH, STEPS, LR = 8, 12, 8, 1e-2


def trained_side_by_side(models, steps=STEPS, batch=BATCH, recheck_every=None, make_x=None):
    """An array of copies of `models` and the models themselves, trained step by step with Adam on the
    same per-slot batches; every step's outputs and the final state dicts must agree to 1e-10."""
    models = [m.double() for m in models]
    arr = ModelArray([copy.deepcopy(m) for m in models], dtype=torch.float64)
    if recheck_every is not None:
        arr.recheck_every = recheck_every
    opt = hfta_nas.optim.Adam(arr, lr=[LR] * len(models))
    plain = [torch.optim.Adam(m.parameters(), lr=LR) for m in models]
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        x = make_x(step, g) if make_x else torch.randn(len(models), batch, IN, generator=g, dtype=torch.float64)
        out = arr(x)
        out.square().mean(dim=tuple(range(1, out.dim()))).sum().backward()
        opt.step()
        opt.zero_grad()
        for slot, (model, model_opt) in enumerate(zip(models, plain)):
            alone = model(x[slot])
            torch.testing.assert_close(out[slot], alone, rtol=1e-10, atol=1e-10, msg=f"step {step} slot {slot}")
            alone.square().mean().backward()
            model_opt.step()
            model_opt.zero_grad()
    for slot, model in enumerate(models):
        state = arr.slot_state_dict(slot)
        for key, expected in model.state_dict().items():
            torch.testing.assert_close(state[key], expected, rtol=1e-10, atol=1e-10, msg=f"slot {slot} {key}")
    return arr, models


def seeded(make, *args, seeds=(0, 1)):
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(make(*args))
    return models


def assert_one_line_refusal(error, *words):
    message = str(error)
    assert "\n" not in message and len(message) <= 220, message
    for word in words:
        assert word in message, message


# ------------------------------------------------------------------ 1. state a forward keeps
class EMANorm(nn.Module):
    """Running statistics by reassignment, the idiom of custom norm layers and EMA teachers."""

    def __init__(self, width=16):
        super().__init__()
        self.fc, self.out = nn.Linear(IN, width), nn.Linear(width, 3)
        self.register_buffer("ema", torch.zeros(width))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        h = self.fc(x)
        if self.training:
            self.ema = 0.9 * self.ema + 0.1 * h.detach().mean(0)
            self.count = self.count + 1
        return self.out(torch.tanh(h - self.ema))


@pytest.mark.parametrize("widths", [(16, 16), (16, 12)], ids=["equal shapes", "envelope"])
def test_buffers_a_forward_reassigns_are_carried_exactly(widths):
    models = [seeded(EMANorm, width, seeds=(slot,))[0] for slot, width in enumerate(widths)]
    arr, models = trained_side_by_side(models, recheck_every=1)
    for slot, model in enumerate(models):
        assert int(model.count) == STEPS and model.ema.abs().max() > 0  # the models alone did update them
        assert int(arr.slot_state_dict(slot)["count"]) == STEPS


class Counted(nn.Module):
    """Python state: a step counter that switches the forward after a warm-up (as schedules inside
    models do). Any extra forward of the user's module (a check's) would switch it early."""

    def __init__(self, width=16, warmup=3):
        super().__init__()
        self.fc, self.out = nn.Linear(IN, width), nn.Linear(width, 3)
        self.steps, self.warmup = 0, warmup
        self.seen = []

    def forward(self, x):
        if self.training:
            self.steps += 1
            self.seen.append(self.steps)
        scale = 1.0 if self.steps <= self.warmup else 0.5
        return self.out(torch.relu(self.fc(x)) * scale)


@pytest.mark.parametrize("widths", [(16, 16), (16, 12)], ids=["equal shapes", "envelope"])
def test_python_state_in_forward_advances_once_per_call_through_every_check(widths):
    """The first-call check (six probe forwards per slot in an envelope) and the running check at every
    call run on copies: the template's counter advances exactly as each model's own."""
    models = [seeded(Counted, width, seeds=(slot,))[0] for slot, width in enumerate(widths)]
    arr, models = trained_side_by_side(models, recheck_every=1)
    assert [m.steps for m in models] == [STEPS, STEPS]
    assert arr._template.steps == STEPS and arr._template.seen == list(range(1, STEPS + 1))


def test_a_buffer_reassigned_with_a_gradient_history_is_refused_by_name():
    class Leaky(EMANorm):
        def forward(self, x):
            h = self.fc(x)
            self.ema = 0.9 * self.ema + 0.1 * h.mean(0)  # no detach: the next backward fails alone too
            return self.out(h - self.ema)

    arr = ModelArray.from_factory(Leaky, seeds=[0, 1])
    with pytest.raises(FusionError) as refused:
        arr(torch.randn(2, 4, IN))
    assert_one_line_refusal(refused.value, "'ema'", "gradient history", ".detach()")


def test_a_buffer_reassigned_with_another_shape_or_to_none_is_refused_by_name():
    class Grows(EMANorm):
        def forward(self, x):
            self.ema = torch.cat([self.ema, self.ema])
            return self.out(self.fc(x))

    class Cleared(EMANorm):
        def forward(self, x):
            self.ema = None
            return self.out(self.fc(x))

    for make, words in ((Grows, ("'ema'", "shape")), (Cleared, ("'ema'", "NoneType"))):
        with pytest.raises(FusionError) as refused:
            ModelArray.from_factory(make, seeds=[0, 1])(torch.randn(2, 4, IN))
        assert_one_line_refusal(refused.value, *words)


# --------------------------------------------------------------- 2. the running check
class MaxOfTwo(nn.Module):
    """h - max(h) over its units: padded to a wider envelope, the padding's zeros win the max only for a
    sample whose real units are all negative, so the error shows on some samples of some batches."""

    def __init__(self, width):
        super().__init__()
        self.fc, self.head = nn.Linear(IN, width), nn.Linear(width, 3)

    def forward(self, x):
        h = self.fc(x)
        return self.head(h - h.amax(-1, keepdim=True))


def an_array_whose_error_shows_only_at_sample_40():
    wide, narrow = MaxOfTwo(6).double(), MaxOfTwo(2).double()
    with torch.no_grad():  # the narrow slot's units are the first two inputs
        narrow.fc.weight.zero_()
        narrow.fc.bias.zero_()
        narrow.fc.weight[0, 0] = narrow.fc.weight[1, 1] = 1.0
    arr = ModelArray([wide, narrow], dtype=torch.float64)
    arr.recheck_every = 1  # call k checks slot (k - 1) % 2: slot 1 at calls 2, 4, ...
    clean = torch.zeros(2, 64, IN, dtype=torch.float64)
    clean[:, :, 0], clean[:, :, 1] = 1.0, -1.0  # one real unit positive in every sample, signs flipped too
    late = clean.clone()
    late[1, 40, :2] = -1.0  # both real units negative, at sample 40 only
    return arr, clean, late


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_the_running_check_reads_the_whole_batch_in_training_and_in_eval_mode_training(mode):
    arr, clean, late = an_array_whose_error_shows_only_at_sample_40()
    arr.train(mode == "train")
    arr(clean)  # the first call: verified on the first 32 samples and their copies, and slot 0 re-checked
    with pytest.raises(FusionError) as refused:
        arr(late)  # slot 1 re-checked on this batch: the error sits at sample 40
    assert_one_line_refusal(refused.value, "slot 1", "training call 2", "'head'")


def test_recheck_every_is_validated_and_zero_turns_the_running_check_off():
    arr, clean, late = an_array_whose_error_shows_only_at_sample_40()
    for bad in (-1, 1.5, True, "100", None):
        with pytest.raises(HftaNasError, match="recheck_every must be a whole number"):
            arr.recheck_every = bad
    arr.recheck_every = 0
    arr(clean)
    arr(late)  # not re-checked: the documented price of turning it off
    assert arr.recheck_every == 0


# ------------------------------------------------- 3. what one fused call cannot do
class Branches(nn.Module):
    """Per-slot control flow: a branch on a tensor's value, .item(), and a boolean-mask shape."""

    def __init__(self, kind, width=16):
        super().__init__()
        self.kind = kind
        self.fc, self.out = nn.Linear(IN, width), nn.Linear(width, 3)
        self.register_buffer("taken", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        h = torch.tanh(self.fc(x))
        if self.kind == "branch":
            if x.mean() > 0:  # noqa: SIM108 - the construct under test
                h = h * 2
                self.taken += 1
            else:
                h = -h
        elif self.kind == "item":
            h = h / (1.0 + h.abs().max().item())
        else:  # data-dependent shapes: the positive inputs, however many there are
            h = h + x[x > 0].sum() / x.numel()
        return self.out(h)


@pytest.mark.parametrize("kind", ["branch", "item", "mask"])
@pytest.mark.parametrize("widths", [(16, 16), (16, 12)], ids=["equal shapes", "envelope"])
def test_per_slot_control_flow_runs_slot_by_slot_exactly(kind, widths):
    models = [seeded(Branches, kind, width, seeds=(slot,))[0] for slot, width in enumerate(widths)]
    with pytest.warns(FusionFallbackWarning, match="one by one") as warned:
        arr, models = trained_side_by_side(models)
    assert "the model's own forward (Branches)" in str(warned[0].message)
    assert arr._one_by_one is not None
    if kind == "branch":  # the slots took different branches: one fused call could not have
        assert {int(m.taken) for m in models} != {0} and sum(int(m.taken) for m in models) > 0


class DropoutThenMaybeBranch(nn.Module):
    def __init__(self, branch):
        super().__init__()
        self.branch = branch
        self.fc, self.drop, self.out = nn.Linear(IN, 32), nn.Dropout(0.5), nn.Linear(32, 3)

    def forward(self, x):
        if self.branch and x.sum() > float("-inf"):  # always true, but vmap cannot know
            x = x + 0.0
        return self.out(self.drop(self.fc(x)))


def test_slot_by_slot_draws_the_same_dropout_masks_as_the_fused_call():
    x = torch.randn(3, 5, IN, dtype=torch.float64)
    outputs = []
    for branch in (False, True):
        arr = ModelArray.from_factory(lambda b=branch: DropoutThenMaybeBranch(b), seeds=[0, 1, 2], dtype=torch.float64)
        with pytest.warns(FusionFallbackWarning) if branch else _nothing():
            outputs.append([arr(x), arr(x)])
        assert (arr._one_by_one is not None) == branch
    for fused, looped in zip(*outputs):  # equal masks; the matmuls round differently one slot at a time
        torch.testing.assert_close(looped, fused, rtol=1e-12, atol=1e-12)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_random_operation_in_a_forward_run_slot_by_slot_is_refused_by_name():
    class NoisyBranch(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(IN, 3)

        def forward(self, x):
            if x.mean() > -1e9:
                x = x + torch.randn_like(x)  # torch's global generator, shared by every slot
            return self.fc(x)

    arr = ModelArray.from_factory(NoisyBranch, seeds=[0, 1])
    with pytest.warns(FusionFallbackWarning), pytest.raises(FusionError) as refused:
        arr(torch.randn(2, 4, IN))
    assert_one_line_refusal(refused.value, "random operation", "randn_like", "nn.Dropout")


class Checkpointed(nn.Module):
    def __init__(self, reentrant, width=16):
        super().__init__()
        self.reentrant = reentrant
        self.block = nn.Sequential(nn.Linear(IN, width), nn.Tanh())
        self.out = nn.Linear(width, 3)

    def forward(self, x):
        return self.out(checkpoint.checkpoint(self.block, x, use_reentrant=self.reentrant))


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("widths", [(16, 16), (16, 12)], ids=["equal shapes", "envelope"])
def test_activation_checkpointing_is_refused_by_name(reentrant, widths):
    """Its backward re-runs the block after the array took its per-slot tensors out of the template:
    a loop over slots would train silently wrong, so nothing runs it."""
    models = [seeded(Checkpointed, reentrant, width, seeds=(slot,))[0] for slot, width in enumerate(widths)]
    arr = ModelArray(models)
    with pytest.raises(FusionError) as refused:
        arr(torch.randn(2, 4, IN)).sum().backward()
    assert_one_line_refusal(refused.value, "torch.utils.checkpoint", "(Checkpointed)")


@pytest.mark.parametrize("build", ["list", "factory"])
def test_legacy_spectral_norm_is_refused_in_one_line_without_tensors(build):
    def make():
        return nn.Sequential(nn.utils.spectral_norm(nn.Linear(IN, 4)), nn.ReLU(), nn.Linear(4, 3))

    with pytest.raises(FusionError) as refused:
        if build == "list":
            ModelArray(seeded(make))
        else:
            ModelArray.from_factory(make, seeds=[0, 1])
    assert_one_line_refusal(refused.value, "layer '0' (Linear)", "spectral_norm", "parametrizations.spectral_norm")
    assert "tensor(" not in str(refused.value)


class FreshHiddenState(nn.Module):
    """An LSTM whose forward makes h0 and c0 with `torch.zeros(...).requires_grad_()`, the habit of many
    published models (a no-op: the constants' gradients are never read)."""

    def __init__(self, hidden=6):
        super().__init__()
        self.hidden = hidden
        self.lstm, self.head = nn.LSTM(IN, hidden, batch_first=True), nn.Linear(hidden, 3)

    def forward(self, x):
        h0 = torch.zeros(1, x.size(0), self.hidden, dtype=x.dtype).requires_grad_()
        c0 = torch.zeros(1, x.size(0), self.hidden, dtype=x.dtype).requires_grad_()
        out, _ = self.lstm(x, (h0, c0))
        return self.head(out[:, -1])


@pytest.mark.parametrize("hidden", [(6, 6), (6, 4)], ids=["equal shapes", "envelope"])
def test_requires_grad_on_a_fresh_constant_is_accepted_and_trains_exactly_as_alone(hidden):
    models = [seeded(FreshHiddenState, width, seeds=(slot,))[0] for slot, width in enumerate(hidden)]
    make_x = lambda step, g: torch.randn(len(models), BATCH, 5, IN, generator=g, dtype=torch.float64)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error", FusionFallbackWarning)  # fused, not slot by slot
        arr, models = trained_side_by_side(models, make_x=make_x)
    assert arr._one_by_one is None
    arr.eval()  # another mode's first call, and its later ones
    with torch.no_grad():
        for _ in range(2):
            x = make_x(0, torch.Generator().manual_seed(1))
            for slot, model in enumerate(models):
                torch.testing.assert_close(arr(x)[slot], model.eval()(x[slot]), rtol=1e-10, atol=1e-10)


# ------------------------------------- 4. hooks, tying, parametrizations, padded norms
class Hooked(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.fc, self.out = nn.Linear(IN, width), nn.Linear(width, 3)
        self.fc.register_forward_hook(lambda module, args, output: output * 0.5)
        self.out.register_forward_pre_hook(lambda module, args: (torch.tanh(args[0]),))

    def forward(self, x):
        return self.out(self.fc(x))


@pytest.mark.parametrize("widths", [(16, 16), (16, 12)], ids=["equal shapes", "envelope"])
def test_module_hooks_run_in_every_slot_exactly(widths):
    trained_side_by_side([seeded(Hooked, width, seeds=(slot,))[0] for slot, width in enumerate(widths)])


class Tied(nn.Module):
    """An autoencoder whose decoder is the encoder's weight transposed, and a tied pair of layers."""

    def __init__(self, width=16):
        super().__init__()
        self.enc, self.mid, self.mid2 = nn.Linear(IN, width), nn.Linear(width, width), nn.Linear(width, width)
        self.mid2.weight = self.mid.weight

    def forward(self, x):
        h = torch.tanh(self.mid2(torch.tanh(self.mid(self.enc(x)))))
        return h @ self.enc.weight


def test_tied_weights_train_exactly_in_an_array_of_equal_shapes():
    arr, models = trained_side_by_side(seeded(Tied))
    assert arr.slot_state_dict(0)["mid2.weight"].data_ptr() != 0  # both names are in the state dict
    assert torch.equal(arr.slot_state_dict(1)["mid.weight"], arr.slot_state_dict(1)["mid2.weight"])


def test_tied_weights_in_an_envelope_are_exact_or_refused_in_one_line():
    try:
        trained_side_by_side([Tied(16), Tied(12)])
    except FusionError as error:
        assert_one_line_refusal(error)


@pytest.mark.parametrize("parametrize", ["weight_norm", "orthogonal", "spectral_norm"])
def test_parametrized_layers_train_exactly_with_equal_shapes(parametrize):
    def make():
        return nn.Sequential(
            getattr(nn.utils.parametrizations, parametrize)(nn.Linear(IN, IN)), nn.Tanh(), nn.Linear(IN, 3)
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FusionFallbackWarning)  # weight_norm's kernel runs as a loop over slots
        trained_side_by_side(seeded(make), steps=4)


def test_a_parametrized_layer_in_an_envelope_is_refused_by_name():
    def make(width):
        return nn.Sequential(
            nn.utils.parametrizations.weight_norm(nn.Linear(IN, width)), nn.ReLU(), nn.Linear(width, 3)
        )

    with pytest.raises(FusionError) as refused:
        ModelArray([make(16), make(12)])
    assert_one_line_refusal(refused.value, "layer '0' (Linear)", "parametrized 'weight'", "one array per size")
    assert "ParametrizedLinear" not in str(refused.value)


class CentredOverUnits(nn.Module):
    """A hand-written norm over the hidden units: padded, the mean also counts the padding's zeros."""

    def __init__(self, width):
        super().__init__()
        self.fc, self.out = nn.Linear(IN, width), nn.Linear(width, 3)

    def forward(self, x):
        h = self.fc(x)
        h = (h - h.mean(-1, keepdim=True)) / (h.std(-1, keepdim=True) + 1e-5)
        return self.out(h)


def test_a_norm_over_padded_features_is_refused_at_the_first_call_and_exact_with_equal_shapes():
    trained_side_by_side(seeded(CentredOverUnits, 16), steps=3)
    arr = ModelArray([CentredOverUnits(16), CentredOverUnits(12)])
    with pytest.raises(FusionError) as refused:
        arr(torch.randn(2, 4, IN))
    assert_one_line_refusal(refused.value, "slot 1", "first batch")


def test_an_output_whose_shape_depends_on_the_data_is_refused_in_one_line():
    class Positives(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(IN, 3)

        def forward(self, x):
            h = self.fc(x)
            return h[h > 0]  # as many entries as happen to be positive: slots cannot be stacked

    arr = ModelArray.from_factory(Positives, seeds=[0, 1])
    with pytest.warns(FusionFallbackWarning), pytest.raises((FusionError, RuntimeError)) as refused:
        arr(torch.randn(2, 4, IN))
    assert isinstance(refused.value, FusionError), refused.value
    assert_one_line_refusal(refused.value, "output")
