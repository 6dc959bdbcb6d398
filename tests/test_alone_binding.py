"""An array of one binds its template's tensor places once (hfta_nas/array/_alone.py) instead of calling
`functional_call` on every forward: it must compute exactly what its model alone computes, step by step
in float64 against torch.optim.Adam, for every kind of state a forward keeps (reassigned buffers, Python
counters, hooks, tied weights, parametrizations, BatchNorm), and keep doing so through what replaces the
tensors it bound (slot surgery, a gradient set to None, a create_graph backward)."""

import copy

import pytest
import torch
from test_forward_state import (
    BATCH,
    IN,
    Counted,
    EMANorm,
    FreshHiddenState,
    Hooked,
    Tied,
    trained_side_by_side,
)
from torch import nn
from torch.nn import functional as F

import hfta_nas
from hfta_nas import ModelArray
from hfta_nas.array import _slot_loop


def parametrized():
    return nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Linear(IN, IN)), nn.Tanh(), nn.Linear(IN, 3))


def batch_normed():
    return nn.Sequential(nn.Linear(IN, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))


@pytest.mark.parametrize(
    "make",
    [EMANorm, Counted, Hooked, Tied, parametrized],
    ids=["reassigned buffers", "python counter", "hooks", "tied weights", "parametrization"],
)
def test_an_array_of_one_trains_exactly_as_its_model_alone_with_its_places_bound_once(make, monkeypatch):
    torch.manual_seed(0)
    model = make()
    real_functional_call = _slot_loop.functional_call
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return real_functional_call(*args, **kwargs)

    monkeypatch.setattr(_slot_loop, "functional_call", counting)
    arr, (alone,) = trained_side_by_side([model])
    assert len(calls) == 1  # the first call of the training mode; every later one is bound
    assert arr._places is not None
    if make is Counted:
        assert alone.steps == arr._template.steps


def test_the_template_keeps_its_own_tensors_between_calls():
    """The places are filled only during a call: the template's tensors are its own again after it,
    also when the forward raised."""
    torch.manual_seed(0)
    arr = ModelArray([nn.Linear(IN, 3)])
    own = dict(arr._template.named_parameters())
    x = torch.randn(1, BATCH, IN)
    arr(x), arr(x)
    assert all(arr._template.get_parameter(name) is tensor for name, tensor in own.items())
    with pytest.raises(RuntimeError):
        arr(torch.randn(1, BATCH, IN + 1))
    assert all(arr._template.get_parameter(name) is tensor for name, tensor in own.items())


def test_a_recurrent_model_and_eval_mode_are_exact_bound():
    torch.manual_seed(0)
    make_x = lambda step, g: torch.randn(1, BATCH, 5, IN, generator=g, dtype=torch.float64)  # noqa: E731
    arr, (model,) = trained_side_by_side([FreshHiddenState(6)], make_x=make_x)
    arr.eval()
    with torch.no_grad():
        for seed in range(3):  # eval's first call (watched), then bound ones
            x = make_x(0, torch.Generator().manual_seed(seed))
            torch.testing.assert_close(arr(x)[0], model.eval()(x[0]), rtol=1e-10, atol=1e-10)


def step_pair(arr, opt, model, model_opt, x, y, clear=None):
    """One step of the array and of the model alone; then the array's gradient is cleared by `clear(arr)`
    (default: its optimizer's zero_grad), the model's by torch.optim's zero_grad."""
    F.cross_entropy(arr(x)[0], y).backward()
    opt.step()
    (clear or (lambda _: opt.zero_grad()))(arr)
    F.cross_entropy(model(x[0]), y).backward()
    model_opt.step()
    model_opt.zero_grad()


def assert_same(arr, model):
    state = arr.slot_state_dict(0)
    for key, expected in model.state_dict().items():
        torch.testing.assert_close(state[key], expected, rtol=1e-10, atol=1e-12, msg=key)


def no_dropout():
    return nn.Sequential(nn.Linear(IN, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


@pytest.mark.parametrize(
    "replace",
    ["grads set to None", "flat.grad set to None", "load_slot", "copy of the state", "resumed numeric state"],
)
def test_what_replaces_a_bound_tensor_is_followed_exactly(replace):
    """Between two bound steps something replaces a tensor the binding holds: the next steps still
    train the model alone's trajectory (float64, BatchNorm's running stats included)."""
    torch.manual_seed(0)
    model = no_dropout().double()
    arr = ModelArray([copy.deepcopy(model)], dtype=torch.float64)
    opt, model_opt = hfta_nas.optim.Adam(arr, lr=[1e-2]), torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for step in range(6):
        x, y = torch.randn(1, BATCH, IN, generator=g, dtype=torch.float64), torch.randint(3, (BATCH,), generator=g)
        clear = None
        if step == 2 and replace == "grads set to None":  # instead of zero_grad, as torch.optim's does
            clear = lambda arr: [setattr(p, "grad", None) for p in arr.parameters().values()]  # noqa: E731
        if step == 3:
            if replace == "flat.grad set to None":
                arr.flat.grad = None
            elif replace == "load_slot":
                arr.load_slot(0, model.state_dict())
            elif replace == "copy of the state":
                arr.buffers = {name: value.clone() for name, value in arr.buffers.items()}
            else:
                arr.load_numeric_state(copy.deepcopy(arr.numeric_state()))
        step_pair(arr, opt, model, model_opt, x, y, clear)
    assert_same(arr, model)


def test_a_create_graph_backward_leaves_the_gradient_in_flat_grad():
    """backward(create_graph=True) rebuilds a leaf's .grad out of place; the array's gradient still
    holds it (the gradient penalty idiom)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    arr = ModelArray([copy.deepcopy(model)], dtype=torch.float64)
    x = torch.randn(1, BATCH, IN, dtype=torch.float64)
    arr(x).sum().backward()  # the first call, watched
    arr.zero_grad()
    arr(x).square().sum().backward(create_graph=True)
    model(x[0]).square().sum().backward(create_graph=True)
    gradient = arr.gradient()
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(arr._layout.views(gradient)[name][0], parameter.grad, rtol=1e-12, atol=1e-12)
    arr.zero_grad()  # then a plain backward: its gradient alone, nothing left of the create_graph one
    model.zero_grad()
    arr(x).sum().backward()
    model(x[0]).sum().backward()
    gradient = arr.gradient()
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(arr._layout.views(gradient)[name][0], parameter.grad, rtol=1e-12, atol=1e-12)


def test_autograd_grad_reaches_the_arrays_parameters_on_every_call():
    """`torch.autograd.grad` with respect to `arr.parameters()` (a gradient penalty's idiom) works on
    bound calls as on the first: the slot's tensors are views of those leaves."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    arr = ModelArray([copy.deepcopy(model)], dtype=torch.float64)
    x = torch.randn(1, BATCH, IN, dtype=torch.float64)
    leaves = list(arr.parameters().values())
    for _ in range(3):
        grads = torch.autograd.grad(arr(x).sum(), leaves)
        expected = torch.autograd.grad(model(x[0]).sum(), list(model.parameters()))
        for got, want in zip(grads, expected):
            torch.testing.assert_close(got[0], want, rtol=1e-12, atol=1e-12)


def test_keyword_and_shared_inputs_reach_the_bound_forward():
    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(IN, 3)

        def forward(self, x, mask=None):
            return self.fc(x) * (1.0 if mask is None else mask)

    torch.manual_seed(0)
    model = Masked().double()
    arr = ModelArray([copy.deepcopy(model)], dtype=torch.float64)
    x, mask = torch.randn(1, BATCH, IN, dtype=torch.float64), torch.rand(1, BATCH, 1, dtype=torch.float64)
    for _ in range(2):
        torch.testing.assert_close(arr(x, mask=mask)[0], model(x[0], mask=mask[0]), rtol=0, atol=0)
        torch.testing.assert_close(arr(x[0], shared_input=True)[0], model(x[0]), rtol=0, atol=0)


def test_bound_dropout_draws_the_masks_of_the_watched_path(monkeypatch):
    """Dropout counters are bound views of the array's: the bound calls draw what the unbound loop
    (every call through functional_call) draws, call after call."""
    x = torch.randn(1, BATCH, IN, dtype=torch.float64)
    outputs = {}
    for bound in (True, False):
        torch.manual_seed(0)
        arr = ModelArray([batch_normed().double()], dtype=torch.float64, dropout_seeds=[3])
        if not bound:
            never_looped = property(lambda self: set(), lambda self, value: None)  # every call watched, unbound
            monkeypatch.setattr(ModelArray, "_looped_modes", never_looped, raising=False)
        outputs[bound] = [arr(x) for _ in range(4)]
        monkeypatch.undo()
    for with_binding, without in zip(outputs[True], outputs[False]):
        assert torch.equal(with_binding, without)
    assert not torch.equal(outputs[True][1], outputs[True][2])  # the counter advanced
