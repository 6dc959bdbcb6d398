"""The array's fast paths (hfta_nas/layers/_slot_ops.py) compute what separate models do:
the batched Linear, the per-slot convolution loop, and the vmap-free forward of
Sequential models, in every combination with the vmap path."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import hfta_nas
from hfta_nas import ModelArray
from hfta_nas.layers import _slot_ops
from tests.test_array import LAYERS, SEEDS, N, per_model


def assert_matches_separate_models(factory, x, training=True, shared_input=False):
    arr = ModelArray.from_factory(factory, seeds=SEEDS, dtype=torch.float64).train(training)
    out = arr(x, shared_input=shared_input)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    for slot, model in enumerate(per_model(factory)):
        model.train(training)
        expected = model(x if shared_input else x[slot])
        (expected * weights[slot]).sum().backward()
        torch.testing.assert_close(out[slot], expected, rtol=1e-10, atol=1e-12)
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        torch.testing.assert_close(arr.flat.grad[slot], grads, rtol=1e-10, atol=1e-12)
    return arr


@pytest.fixture
def conv_loop_everywhere(monkeypatch):
    """Every convolution, however small, runs as one call per slot."""
    monkeypatch.setattr(_slot_ops, "_LOOP_MIN_MACS", 0)


@pytest.mark.parametrize("name", [n for n in sorted(LAYERS) if "conv" in n or "norm" in n])
def test_per_slot_convolution_loop_equals_separate_models(name, conv_loop_everywhere):
    factory, shape = LAYERS[name]
    assert_matches_separate_models(factory, torch.randn(len(SEEDS), N, *shape, dtype=torch.float64))


class ConvNet(nn.Module):
    """Not a Sequential: runs under vmap, where convolutions reach the loop through _physical_call."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 4, 3, padding="same", padding_mode="reflect", bias=False)
        self.conv2 = nn.Conv2d(4, 2, (1, 3), stride=(1, 2), dilation=(1, 2))
        self.head = nn.Linear(12, 2, bias=False)

    def forward(self, x):
        h = torch.tanh(self.conv(x)).unsqueeze(2)
        return self.head(self.conv2(h).flatten(1))


def test_convolution_loop_and_bias_free_linear_under_vmap(conv_loop_everywhere):
    arr = assert_matches_separate_models(ConvNet, torch.randn(len(SEEDS), N, 3, 16, dtype=torch.float64))
    assert arr._native is None


def test_unbatched_per_slot_inputs(conv_loop_everywhere):
    # one sample per slot without a batch dim: [C, L] and [F]
    factory = lambda: nn.Sequential(nn.Conv1d(2, 3, 3), nn.Flatten(0), nn.Linear(12, 2))
    assert_matches_separate_models(factory, torch.randn(len(SEEDS), 2, 6, dtype=torch.float64))
    assert_matches_separate_models(lambda: nn.Linear(5, 2), torch.randn(len(SEEDS), 5, dtype=torch.float64))


def test_shared_input_through_the_batched_linear():
    factory, shape = LAYERS["linear+activations"]
    assert_matches_separate_models(factory, torch.randn(N, *shape, dtype=torch.float64), shared_input=True)


def test_linear_on_inputs_with_extra_dims_and_tied_weights():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    assert_matches_separate_models(Tied, torch.randn(len(SEEDS), N, 2, 4, dtype=torch.float64))
    seq = lambda: nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 4))
    assert_matches_separate_models(seq, torch.randn(len(SEEDS), N, 2, 5, 4, dtype=torch.float64))


def test_sequential_models_skip_vmap_with_the_same_results():
    factory = lambda: nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.GELU(), nn.Dropout(0.0), nn.Linear(8, 3))
    x = torch.randn(len(SEEDS), N, 3, 4, dtype=torch.float64)
    arr = assert_matches_separate_models(factory, x)
    assert arr._native is not None and not arr._native_refused
    vmapped = ModelArray.from_factory(factory, seeds=SEEDS, dtype=torch.float64)
    vmapped._native = None
    assert torch.equal(arr(x), vmapped(x))  # bit for bit: the same kernels


DROPOUTS = {
    "dropout": (lambda: nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.5), nn.Linear(8, 2), nn.Dropout(0.1)), (6,)),
    "channel-dropout": (
        lambda: nn.Sequential(
            nn.Conv1d(2, 4, 3), nn.ReLU(), nn.Dropout1d(0.3), nn.Flatten(), nn.Dropout(1.0), nn.Linear(4 * 5, 2)
        ),
        (2, 7),
    ),
}


@pytest.mark.parametrize("name", sorted(DROPOUTS))
def test_dropout_in_the_vmap_free_path_draws_the_masks_of_the_vmap_path(name, conv_loop_everywhere):
    factory, shape = DROPOUTS[name]
    arr = ModelArray.from_factory(factory, seeds=SEEDS, dtype=torch.float64)
    vmapped = ModelArray.from_factory(factory, seeds=SEEDS, dtype=torch.float64)
    vmapped._native = None
    for _ in range(2):  # a fresh mask every step
        x = torch.randn(len(SEEDS), N, *shape, dtype=torch.float64)
        outs = []
        for array in (arr, vmapped):
            array.zero_grad()
            out = array(x)
            out.pow(2).sum().backward()
            outs.append(out)
        assert torch.equal(outs[0], outs[1])
        assert torch.equal(arr.gradient(), vmapped.gradient())
    assert arr._native is not None and not arr._native_refused
    assert all(torch.equal(arr._slot_random[k], vmapped._slot_random[k]) for k in arr._slot_random)
    arr.eval()
    vmapped.eval()
    assert torch.equal(arr(x), vmapped(x))


def test_hooks_take_the_vmap_path():
    factory = DROPOUTS["dropout"][0]
    x = torch.randn(len(SEEDS), N, 6, dtype=torch.float64)
    arr = ModelArray.from_factory(factory, seeds=SEEDS, dtype=torch.float64)
    calls = []
    handle = nn.modules.module.register_module_forward_hook(lambda module, args, out: calls.append(type(module)))
    try:
        arr(x)
    finally:
        handle.remove()
    assert nn.Linear in {c.__mro__[1] for c in calls}


def assert_double_backward_matches(factory, per_slot_shape, loss=lambda out: out.sum()):
    """A gradient penalty (grad of the input gradient) through the array equals per-model autograd."""
    x = torch.randn(len(SEEDS), N, *per_slot_shape, dtype=torch.float64, requires_grad=True)
    arr = ModelArray.from_factory(factory, seeds=SEEDS, dtype=torch.float64)
    (grad_x,) = torch.autograd.grad(loss(arr(x)), x, create_graph=True)
    grad_x.pow(2).sum().backward()
    for slot, model in enumerate(per_model(factory)):
        xs = x[slot].detach().requires_grad_()
        (expected,) = torch.autograd.grad(loss(model(xs)), xs, create_graph=True)
        torch.testing.assert_close(grad_x[slot], expected)
        expected.pow(2).sum().backward()
        grads = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in model.parameters()]
        )
        torch.testing.assert_close(arr.gradient()[slot], grads)


def test_double_backward_through_the_batched_linear():
    assert_double_backward_matches(lambda: nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1)), (3,))


CONV_RELU = {
    # Linear/Conv -> ReLU pairs run fused in the vmap-free path (_ConvLoop, _BatchedLinear with relu)
    "conv1d-relu-linear-relu": (
        lambda: nn.Sequential(
            nn.Conv1d(2, 4, 5, padding=2),
            nn.ReLU(),
            nn.Conv1d(4, 4, 3, padding="same", dilation=2),
            nn.ReLU(inplace=True),
            nn.Flatten(),
            nn.Linear(4 * 9, 6),
            nn.ReLU(),
            nn.Linear(6, 3),
        ),
        (2, 9),
    ),
    # torch pads the input itself: asymmetric 'same' (even kernel) and a non-zero padding mode
    "conv1d-same-even-circular": (
        lambda: nn.Sequential(
            nn.Conv1d(2, 3, 4, padding="same"),
            nn.ReLU(),
            nn.Conv1d(3, 3, 3, padding=1, padding_mode="circular"),
            nn.ReLU(),
        ),
        (2, 8),
    ),
    "conv2d-stride-groups-relu": (
        lambda: nn.Sequential(
            nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2),
            nn.ReLU(),
            nn.Conv2d(6, 2, (2, 1), bias=False),
            nn.ReLU(),
            nn.Flatten(),
        ),
        (4, 7, 6),
    ),
}


@pytest.mark.parametrize("name", sorted(CONV_RELU))
@pytest.mark.parametrize("loop", [True, False], ids=["loop", "grouped"])
def test_fused_relu_layers_equal_separate_models(name, loop, monkeypatch):
    monkeypatch.setattr(_slot_ops, "_LOOP_MIN_MACS", 0 if loop else 10**18)
    factory, shape = CONV_RELU[name]
    x = torch.randn(len(SEEDS), N, *shape, dtype=torch.float64)
    x[:, :, 0] = 0.0  # exact zeros reach the ReLUs: their gradient there is 0, as in torch
    arr = assert_matches_separate_models(factory, x)
    assert arr._native_refused == (set() if loop else {(tuple(x.shape), x.dtype, True, "auto")})


def test_double_backward_through_the_convolution_loop(conv_loop_everywhere):
    factory = lambda: nn.Sequential(nn.Conv1d(2, 3, 3, padding=1), nn.ReLU(), nn.Conv1d(3, 1, 3), nn.Tanh())
    assert_double_backward_matches(factory, (2, 7))


BATCH_NORMS = {
    # BatchNorm runs one native_batch_norm per slot in the vmap-free path (_BatchNormLoop)
    "conv2d-bn-relu": (
        lambda: nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.Conv2d(4, 4, 3),
            nn.BatchNorm2d(4, momentum=0.3),
            nn.Flatten(),
            nn.Linear(4 * 4 * 4, 3),
        ),
        (3, 6, 6),
    ),
    "linear-bn1d-relu": (lambda: nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 2)), (6,)),
    "conv1d-bn1d-no-affine": (
        lambda: nn.Sequential(nn.Conv1d(2, 3, 3), nn.BatchNorm1d(3, affine=False), nn.Tanh()),
        (2, 7),
    ),
    "bn3d": (lambda: nn.Sequential(nn.Conv3d(2, 3, 2), nn.BatchNorm3d(3), nn.ReLU()), (2, 3, 4, 4)),
    "bn-no-running-stats": (lambda: nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3, track_running_stats=False)), (4,)),
}


def _assert_buffers_match(arr, models):
    for slot, model in enumerate(models):
        state = arr.slot_state_dict(slot)
        for key, value in model.state_dict().items():
            torch.testing.assert_close(state[key], value.detach(), rtol=1e-10, atol=1e-12, msg=key)


@pytest.mark.parametrize("name", sorted(BATCH_NORMS))
def test_batch_norm_loop_equals_separate_models_over_train_and_eval_steps(name, conv_loop_everywhere):
    factory, shape = BATCH_NORMS[name]
    arr = ModelArray.from_factory(factory, seeds=SEEDS, dtype=torch.float64)
    models = per_model(factory)
    for training in (True, True, False):  # two training steps move the running stats, then eval reads them
        arr.train(training)
        x = torch.randn(len(SEEDS), N, *shape, dtype=torch.float64)
        arr.zero_grad()
        out = arr(x)
        weights = torch.randn_like(out)
        (out * weights).sum().backward()
        for slot, model in enumerate(models):
            model.train(training).zero_grad()
            expected = model(x[slot])
            (expected * weights[slot]).sum().backward()
            torch.testing.assert_close(out[slot], expected, rtol=1e-10, atol=1e-12)
            grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            torch.testing.assert_close(arr.gradient()[slot], grads, rtol=1e-10, atol=1e-12)
        _assert_buffers_match(arr, models)  # running stats and num_batches_tracked
    assert arr._native is not None and not arr._native_refused


def test_batch_norm_with_cumulative_average_trains_like_torch():
    """momentum=None: torch reads 1 / num_batches_tracked on the host, which vmap cannot; the array
    keeps the factor a per-slot tensor (vmap path) and ends with torch's parameters and running stats."""
    factory = lambda: nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3, momentum=None), nn.Tanh())
    arr = ModelArray.from_factory(factory, seeds=SEEDS, dtype=torch.float64)
    assert arr._native is None
    models = [m.double() for m in per_model(factory)]
    array_opt = hfta_nas.optim.SGD(arr, lr=0.1)
    torch_opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        x = torch.randn(len(SEEDS), 6, 4, dtype=torch.float64, generator=generator)
        arr(x).square().sum().backward()
        array_opt.step()
        array_opt.zero_grad()
        for slot, (model, opt) in enumerate(zip(models, torch_opts)):
            model(x[slot]).square().sum().backward()
            opt.step()
            opt.zero_grad()
    _assert_buffers_match(arr, models)
    for slot, model in enumerate(models):
        for key, value in model.state_dict().items():
            torch.testing.assert_close(arr.slot_state_dict(slot)[key], value, rtol=1e-10, atol=1e-12)


def test_batch_norm_refuses_one_value_per_channel_as_torch_does():
    factory, shape = BATCH_NORMS["linear-bn1d-relu"]
    arr = ModelArray.from_factory(factory, seeds=SEEDS, dtype=torch.float64)
    models = per_model(factory)
    x = torch.randn(len(SEEDS), 1, *shape, dtype=torch.float64)
    for _ in range(2):  # the second call too (the vmap-free path remembers the refusal)
        with pytest.raises(ValueError, match="more than 1 value per channel"):
            arr(x)
        for slot, model in enumerate(models):
            with pytest.raises(ValueError, match="more than 1 value per channel"):
                model(x[slot])
        _assert_buffers_match(arr, models)  # torch counts the batch before refusing it; so does the array


def test_double_backward_through_the_batch_norm_loop():
    factory, shape = BATCH_NORMS["linear-bn1d-relu"]
    assert_double_backward_matches(factory, shape, loss=lambda out: out.pow(2).sum())


POOLING = {
    "conv1d-relu-maxpool": (
        lambda: nn.Sequential(
            nn.Conv1d(1, 4, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool1d(2),
            nn.Conv1d(4, 4, 3),
            nn.ReLU(),
            nn.AvgPool1d(2, ceil_mode=True),
            nn.AdaptiveMaxPool1d(3),
            nn.Flatten(),
            nn.Linear(12, 3),
        ),
        (1, 20),
    ),
    "conv2d-pools": (
        lambda: nn.Sequential(
            nn.Conv2d(2, 3, 3, padding=1),
            nn.MaxPool2d(2, stride=1, padding=1, dilation=2),
            nn.AvgPool2d(2, count_include_pad=False, padding=1),
            nn.AdaptiveAvgPool2d((2, 1)),
            nn.Flatten(),
        ),
        (2, 7, 6),
    ),
    "conv3d-pools": (
        lambda: nn.Sequential(nn.Conv3d(2, 2, 2), nn.MaxPool3d(2), nn.AvgPool3d(1), nn.AdaptiveAvgPool3d(1)),
        (2, 5, 5, 5),
    ),
}


@pytest.mark.parametrize("name", sorted(POOLING))
def test_pooling_runs_in_the_vmap_free_path_with_the_same_results(name, conv_loop_everywhere):
    factory, shape = POOLING[name]
    x = torch.randn(len(SEEDS), N, *shape, dtype=torch.float64)
    arr = assert_matches_separate_models(factory, x)
    assert arr._native is not None and not arr._native_refused


def test_pooling_of_unbatched_per_slot_inputs(conv_loop_everywhere):
    factory, shape = POOLING["conv3d-pools"]
    assert_matches_separate_models(
        factory, torch.randn(len(SEEDS), *shape, dtype=torch.float64)
    )  # [C, D, H, W] per slot


@pytest.mark.parametrize("kernel,length", [(2, 20), (3, 20), (4, 4)])
def test_tiled_max_pooling_equals_max_pool1d_ties_included(kernel, length):
    """MaxPool1d with kernel = stride runs as a max over windows (`_windows_max`): the same values,
    and the gradient at the first maximum of each window, as max_pool1d's, however many tie."""
    x = torch.randint(-2, 3, (6, 4, length), dtype=torch.float64).relu().requires_grad_()  # many ties (zeros)
    weights = torch.randn(6, 4, length // kernel, dtype=torch.float64)
    expected = F.max_pool1d(x, kernel)
    ours = _slot_ops._windows_max(kernel, x)
    assert torch.equal(ours, expected)
    assert torch.equal(*(torch.autograd.grad(out, x, weights)[0] for out in (ours, expected)))
    assert _slot_ops._tiles(nn.MaxPool1d(kernel)) and not _slot_ops._tiles(nn.MaxPool1d(kernel, stride=1))


def test_max_pooling_with_indices_takes_the_vmap_path():
    factory = lambda: nn.Sequential(nn.Conv1d(1, 2, 3), nn.MaxPool1d(2, return_indices=True))
    assert ModelArray.from_factory(factory, seeds=SEEDS)._native is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("p", [0.1, 0.5, 1 / 3, 1e-7, 0.999999])
def test_keep_mask_equals_thresholding_the_slot_uniforms(dtype, p):
    # keep_mask's shortcuts (in-place mixes, integer threshold) draw exactly the masks of the slot's own
    # 24-bit uniforms >= p (p rounded to the dtype, as torch rounds a rate); in float32 and float64 those
    # uniforms are uniform_like's exactly
    from hfta_nas.layers._slot_random import keep_mask, slot_keys, uniform_like

    keys = slot_keys(torch.arange(4), stream=3)
    counters = torch.tensor([1, 2, 7, 1000])
    rounded = torch.tensor(p, dtype=dtype).item()
    uniforms = [uniform_like(torch.empty(3, 50, 7, dtype=torch.float64), k, c) for k, c in zip(keys, counters)]
    expected = torch.stack([u >= rounded for u in uniforms])
    got = keep_mask((3, 50, 7), keys.view(4, 1, 1, 1), counters.view(4, 1, 1, 1), p, dtype, torch.device("cpu"))
    assert got.shape == (4, 3, 50, 7) and torch.equal(got, expected)
    if dtype != torch.float16:
        in_dtype = [uniform_like(torch.empty(3, 50, 7, dtype=dtype), k, c) >= p for k, c in zip(keys, counters)]
        assert torch.equal(got, torch.stack(in_dtype))


def test_a_refusal_midway_leaves_no_trace_of_the_layers_that_ran(monkeypatch):
    # conv0 is looped (large), conv1 is not (small): the vmap-free path refuses at conv1, after
    # BatchNorm and dropout have run; their running stats and counters must not move twice.
    monkeypatch.setattr(_slot_ops, "_LOOP_MIN_MACS", 4000)
    factory = lambda: nn.Sequential(
        nn.Conv1d(1, 8, 3), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Conv1d(8, 2, 1), nn.Flatten()
    )
    arr = ModelArray.from_factory(factory, seeds=SEEDS, dtype=torch.float64)
    vmapped = ModelArray.from_factory(factory, seeds=SEEDS, dtype=torch.float64)
    vmapped._native = None
    for _ in range(2):
        x = torch.randn(len(SEEDS), 10, 1, 20, dtype=torch.float64)
        assert torch.equal(arr(x), vmapped(x))
    assert arr._native_refused
    for slot in range(len(SEEDS)):
        for key, value in vmapped.slot_state_dict(slot).items():
            assert torch.equal(arr.slot_state_dict(slot)[key], value), key
    assert all(torch.equal(arr._slot_random[k], vmapped._slot_random[k]) for k in arr._slot_random)


def test_reused_buffers_never_overwrite_a_tensor_still_in_use(conv_loop_everywhere):
    # Two forwards before one backward: the first graph still holds its outputs, so the
    # second may not reuse their memory; after backward the memory is reused.
    factory = lambda: nn.Sequential(
        nn.Conv1d(2, 4, 3), nn.ReLU(), nn.BatchNorm1d(4), nn.Flatten(), nn.Linear(4 * 5, 6), nn.ReLU(), nn.Linear(6, 3)
    )
    arr = ModelArray.from_factory(factory, seeds=SEEDS, dtype=torch.float64)
    x1, x2 = (torch.randn(len(SEEDS), N, 2, 7, dtype=torch.float64) for _ in range(2))
    out1 = arr(x1)
    kept = out1.clone()
    out2 = arr(x2)
    assert torch.equal(out1, kept)
    (out1.pow(2).sum() + out2.sum()).backward()
    models = per_model(factory)
    for slot, model in enumerate(models):
        expected1, expected2 = model(x1[slot]), model(x2[slot])
        torch.testing.assert_close(out1[slot], expected1, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(out2[slot], expected2, rtol=1e-10, atol=1e-12)
        (expected1.pow(2).sum() + expected2.sum()).backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        torch.testing.assert_close(arr.gradient()[slot], grads, rtol=1e-10, atol=1e-12)
    conv = arr._template[0]
    before = conv._hfta_reused_buffers["out"]._tensor.data_ptr()
    del out1, out2, kept
    arr(x1).sum().backward()
    assert conv._hfta_reused_buffers["out"]._tensor.data_ptr() == before  # nothing holds it now: reused
