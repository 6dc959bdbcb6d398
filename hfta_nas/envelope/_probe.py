"""The check that makes envelopes safe: each slot's own model against its embedding.

Placement rules (`_merge.py`) cover the layers torch ships; a user's module
may do anything with its sizes (a reshape, a mean over features, a scale by
1/width). So before an array of different sizes trains, every slot's own model
and the template running that slot's padded tensors are compared on the first
batch (at most `PROBE_SAMPLES` samples) and on two adversarial copies of it
(signs flipped, times 1000) in float64 on the CPU: outputs in
train and eval mode, every parameter gradient of a random linear loss, and the
buffers after the training-mode forward (BatchNorm running stats). Dropout is
off on both sides (their masks differ by design). A mismatch raises
FusionError naming the first layer whose output differs, so a combination
that cannot be embedded exactly is refused, never trained differently.

A padding error may depend on the data (a max over padded features differs only
where all of a sample's real features are negative), so no batch proves a slot
exact for all data: while the array trains, `recheck_slot` repeats the
comparison now and then on a whole training batch (every sample) with the slot's
current weights (`ModelArray.recheck_every`), and a mismatch stops the array.

Every comparison leaves the template's Python state as it found it (a forward's
step counter): the array runs the checks on a copy of its template, and each
comparison puts that copy's state back, so each starts where the user's model stands.

The same pass counts multiply-adds (torch's FlopCounterMode): what the slot's
own model needs per sample and what its place in the envelope executes.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import FlopCounterMode

from hfta_nas._python_state import put_back, python_state
from hfta_nas.envelope._merge import cut
from hfta_nas.envelope._placement import SlotEmbedding, take_from
from hfta_nas.envelope._template import Envelope
from hfta_nas.errors import FusionError, HftaNasError
from hfta_nas.layers._slot_layers import SlotDropout, no_attention_fast_path

PROBE_SAMPLES = 32
_TOLERANCE = 1e-9  # relative to each tensor's largest magnitude; float64 rounding is ~1e-15


@dataclass(frozen=True)
class PlacedSlot:
    """One slot of an array as the probe reads it (`ModelArray.placed_slot`).

    template: the envelope module every slot runs; embedding: where this slot's own
    tensors sit in it; state: this slot's view of every tensor the template reads;
    parameter_names: the template's canonical parameter names; aliases: every
    parameter name (tied ones included) to its canonical name.
    """

    template: nn.Module
    embedding: SlotEmbedding
    state: Mapping[str, torch.Tensor]
    parameter_names: tuple[str, ...]
    aliases: Mapping[str, str]


def padding_fraction(useful: float, executed: float) -> float:
    """The fraction of executed multiply-adds that is padding (0 when nothing is executed)."""
    return 1.0 - useful / executed if executed else 0.0


@dataclass(frozen=True)
class PaddingCost:
    """Multiply-adds per sample of one forward: (useful, executed) per slot.

    useful: what the slot's own model needs; executed: what the array runs for
    that slot (its envelope). Their ratio is the price of padding.
    """

    per_slot: list[tuple[int, int]]

    @property
    def useful(self) -> int:
        return sum(u for u, _ in self.per_slot)

    @property
    def executed(self) -> int:
        return sum(e for _, e in self.per_slot)

    @property
    def waste(self) -> float:
        """Fraction of executed multiply-adds spent on padding (0 for equal shapes)."""
        return padding_fraction(self.useful, self.executed)

    def __str__(self) -> str:
        return (
            f"{len(self.per_slot)} slots: {self.useful:,} useful / {self.executed:,} executed multiply-adds "
            f"per sample ({self.waste:.1%} padding)"
        )


def _samples(x: Any) -> Any:
    return x[:PROBE_SAMPLES] if isinstance(x, torch.Tensor) and x.dim() > 0 else x


def _as_float64(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return x.double() if x.is_floating_point() else x
    return x


def count_macs(module: nn.Module, state: dict[str, torch.Tensor] | None, inputs: tuple[Any, ...]) -> int:
    """Multiply-adds per sample of one forward of `module` (with `state` swapped in, if given)."""
    samples = next((x.shape[0] for x in tree_flatten(inputs)[0] if isinstance(x, torch.Tensor) and x.dim() > 0), 1)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        if state is None:
            module(*inputs)
        else:
            functional_call(module, state, inputs, tie_weights=True)
    return round(counter.get_total_flops() / 2 / max(samples, 1))


def padding_cost(models: Sequence[nn.Module], *example_inputs: Any) -> PaddingCost:
    """What one array of `models` would cost, without building it: per slot, the multiply-adds
    per sample its own model needs (useful) and its place in the envelope executes.

    `example_inputs` is one batch [N, ...]. Models and inputs may live on the meta
    device (shapes only, no memory), as a search's candidates do before they are packed.
    """
    models = list(models)
    if not models:
        raise HftaNasError("padding_cost needs at least one model.")
    executed = envelope_macs(models, *example_inputs)
    useful = [model_macs(m, *example_inputs) for m in models]
    return PaddingCost([(u, executed) for u in useful])


def model_macs(model: nn.Module, *example_inputs: Any) -> int:
    """Multiply-adds per sample of one eval-mode forward of `model` (a copy runs; meta device works)."""
    return _sized(copy.deepcopy(model).eval(), example_inputs)


def _sized(module: nn.Module, inputs: tuple[Any, ...]) -> int:
    """`count_macs` of `module`, which this call may change. A forward that the meta device
    cannot run (it makes tensors on a fixed device, `torch.zeros(...).to(DEVICE)`, or reads a
    value) is counted again on a CPU copy with zero inputs; HftaNasError when that fails too."""
    with no_attention_fast_path():
        try:
            return count_macs(module, None, inputs)
        except FusionError:
            raise
        except Exception as meta_error:  # noqa: BLE001 - the user's forward, on shapes only
            if not _on_meta(module, inputs):
                raise
            return _macs_on_cpu(module, inputs, meta_error)


def _on_meta(model: nn.Module, inputs: tuple[Any, ...]) -> bool:
    tensors = [*model.parameters(), *model.buffers(), *(x for x in inputs if isinstance(x, torch.Tensor))]
    return any(t.device.type == "meta" for t in tensors)


def _macs_on_cpu(model: nn.Module, inputs: tuple[Any, ...], meta_error: Exception) -> int:
    cpu_model = model.to_empty(device="cpu").eval()
    cpu_inputs = tuple(
        torch.zeros(x.shape, dtype=x.dtype) if isinstance(x, torch.Tensor) and x.device.type == "meta" else x
        for x in inputs
    )
    try:
        return count_macs(cpu_model, None, cpu_inputs)
    except Exception as error:  # noqa: BLE001 - the user's forward
        raise HftaNasError(
            f"the model could not be sized: its forward failed on the meta device ({type(meta_error).__name__}: "
            f"{_first_line(meta_error)}) and on the CPU ({type(error).__name__}: {_first_line(error)}). hfta-nas "
            "sizes every candidate with one forward on shapes only; make tensors inside forward on the input's "
            "device (torch.zeros(..., device=x.device)), not on a fixed one"
        ) from error


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else ""


def envelope_macs(models: Sequence[nn.Module], *example_inputs: Any) -> int:
    """Multiply-adds per sample that one slot of an array of `models` executes (its envelope's);
    FusionError when the models cannot share an array."""
    models = list(models)
    if len(models) == 1:
        return model_macs(models[0], *example_inputs)
    return template_macs(envelope_template(models), *example_inputs)


def envelope_template(models: Sequence[nn.Module]) -> nn.Module:
    """The module an array of two or more `models` runs, on their device (meta works) and in eval mode;
    FusionError when they cannot share an array. `template_macs` counts its multiply-adds."""
    device = next((p.device for p in models[0].parameters()), torch.device("cpu"))
    return Envelope(list(models)).template().to(device).eval()


def template_macs(template: nn.Module, *example_inputs: Any) -> int:
    """Multiply-adds per sample of one slot of `template` (from `envelope_template`, which this call may change)."""
    return _sized(template, example_inputs)


@contextlib.contextmanager
def _probing(template: nn.Module):
    """Template in training mode with its dropout off, attention's fused kernels off, and float64
    the default dtype (a forward that makes tensors, `torch.zeros(n, hidden)`, makes them in the
    probe's float64 as it does in float32 when it trains); restored after."""
    training = template.training
    dropouts = [m for m in template.modules() if isinstance(m, SlotDropout)]
    default_dtype = torch.get_default_dtype()
    try:
        template.train()
        for m in dropouts:
            m.training = False
        torch.set_default_dtype(torch.float64)
        with no_attention_fast_path():
            yield
    finally:
        torch.set_default_dtype(default_dtype)
        template.train(training)


_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)


def own_copy(model: nn.Module) -> nn.Module:
    """A float64 CPU copy of `model` in training mode with its dropout off: what the probe compares.
    Each rate it turned off is kept beside it (`with_own_dropout` turns them back on)."""
    own = copy.deepcopy(model).cpu().double()
    for m in own.modules():
        if isinstance(m, _DROPOUTS):
            m._hfta_own_rate, m.p = m.p, 0.0
        elif isinstance(m, nn.RNNBase):
            m._hfta_own_rate, m.dropout = m.dropout, 0.0
    return own.train()


def with_own_dropout(own: nn.Module) -> nn.Module:
    """`own` (an `own_copy`) with the dropout rates of the model it copies, in place."""
    for m in own.modules():
        rate = m.__dict__.pop("_hfta_own_rate", None)
        if rate is not None:
            setattr(m, "dropout" if isinstance(m, nn.RNNBase) else "p", rate)
    return own


def _difference(own: torch.Tensor, padded: torch.Tensor, scale: float | None = None) -> float:
    """Largest difference relative to `scale` (default: the own tensor's largest magnitude);
    inf for a shape mismatch."""
    if own.shape != padded.shape:
        return float("inf")
    if not own.is_floating_point():
        return 0.0 if torch.equal(own, padded) else float("inf")
    if not own.numel():
        return 0.0
    if scale is None:
        scale = own.abs().max().item()
    return (own - padded).abs().max().item() / max(scale, 1e-30)


class _Mismatch(Exception):
    def __init__(self, what: str, error: float) -> None:
        super().__init__(what)
        self.what, self.error = what, error


def _check(what: str, own: torch.Tensor, padded: torch.Tensor, scale: float | None = None) -> None:
    error = _difference(own, padded, scale)
    if error > _TOLERANCE:
        raise _Mismatch(what, error)


def _compare_outputs(what: str, own_out: Any, padded_out: Any) -> list[torch.Tensor]:
    own_leaves, own_spec = tree_flatten(own_out)
    padded_leaves, padded_spec = tree_flatten(padded_out)
    if own_spec != padded_spec:
        raise _Mismatch(f"{what} (the output's structure)", float("inf"))
    for own, padded in zip(own_leaves, padded_leaves):
        if isinstance(own, torch.Tensor) and isinstance(padded, torch.Tensor) and own.shape != padded.shape:
            raise _Mismatch(
                f"output shapes ({list(own.shape)} alone, {list(padded.shape)} padded; slots need equal output shapes)",
                float("inf"),
            )
        if isinstance(own, torch.Tensor):
            _check(what, own, padded)
    return [t for t in own_leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _first_differing_layer(placed: PlacedSlot, own: nn.Module, state, inputs) -> str:
    """The first layer (in the own model's execution order) whose output differs from its padded place."""
    emb = placed.embedding
    own_outputs: list[tuple[str, torch.Tensor]] = []
    padded_outputs: dict[str, torch.Tensor] = {}

    def recorder(store, path):
        def hook(module, args, output):
            tensor = output[0] if isinstance(output, (tuple, list)) and output else output
            if isinstance(tensor, torch.Tensor):
                if isinstance(store, list):
                    store.append((path, tensor.detach()))
                else:
                    store.setdefault(path, tensor.detach())

        return hook

    handles = [m.register_forward_hook(recorder(own_outputs, p)) for p, m in own.named_modules() if p]
    handles += [
        placed.template.get_submodule(env).register_forward_hook(recorder(padded_outputs, own_path))
        for own_path, env in emb.modules.items()
        if own_path
    ]
    try:
        with torch.no_grad(), contextlib.suppress(Exception):
            own(*inputs)
            functional_call(placed.template, {k: v.clone() for k, v in state.items()}, inputs, tie_weights=True)
    finally:
        for handle in handles:
            handle.remove()
    for path, own_out in own_outputs:
        padded = padded_outputs.get(path)
        if padded is None or padded.dim() != own_out.dim() or any(o > p for o, p in zip(own_out.shape, padded.shape)):
            continue
        corner = padded[tuple(slice(0, n) for n in own_out.shape)]
        if _difference(own_out, corner) > _TOLERANCE:
            return f", first at layer '{path}' ({type(own.get_submodule(path)).__name__})"
    return ""


# The first check also compares on these copies of the batch's floating-point inputs: the
# padding errors that depend on the data (a max over padded features, where real values meet
# the padding's zeros; f(0) != 0 applied where a block is skipped) depend on the signs and
# sizes of the values. What no copy of one batch reveals, the running check may catch later.
ADVERSARIAL_COPIES = (("the first batch with its signs flipped", -1.0), ("the first batch times 1000", 1e3))


def verify_slot(placed: PlacedSlot, slot: int, model: nn.Module, inputs: tuple[Any, ...]) -> tuple[int, int]:
    """Raise FusionError unless slot `slot` (`placed`) computes what `model` computes on `inputs`
    (one slot's batch) and on its adversarial copies. Returns (useful, executed) multiply-adds per sample."""
    inputs = tree_map(lambda x: _as_float64(_samples(x)), inputs)
    compare_slot(placed, slot, model, inputs, "the first batch")
    for what, factor in ADVERSARIAL_COPIES:
        # A copy the user's own model cannot run (it checks its inputs, say) proves nothing: skipped.
        compare_slot(placed, slot, model, _scaled(inputs, factor), what, own_may_fail=True)
    # Multiply-adds depend on shapes only: fresh copies in eval mode count as the compared ones.
    with _probing(placed.template):
        placed.template.eval()
        return count_macs(own_copy(model).eval(), None, inputs), count_macs(
            placed.template, _initial_state(placed), inputs
        )


def recheck_slot(placed: PlacedSlot, slot: int, own: nn.Module, inputs: tuple[Any, ...], when: str) -> None:
    """The running check: `verify_slot`'s comparison on one whole training batch, with the slot's current
    weights loaded into `own` (an `own_copy` of its model, which this check may change, so that it
    makes no copy of its own); FusionError on a mismatch."""
    compare_slot(placed, slot, own, tree_map(_as_float64, inputs), when, copied=True)


def _scaled(inputs: Any, factor: float) -> Any:
    return tree_map(lambda x: x * factor if isinstance(x, torch.Tensor) and x.is_floating_point() else x, inputs)


def compare_slot(
    placed: PlacedSlot,
    slot: int,
    model: nn.Module,
    inputs: tuple[Any, ...],
    when: str,
    own_may_fail: bool = False,
    copied: bool = False,
) -> None:
    """One comparison of `model` with its place on float64 `inputs`; `when` names the batch in the error.
    `copied`: `model` is an `own_copy` already, which may be changed (else a copy is made)."""
    own = model.train() if copied else own_copy(model)  # a copy the last comparison left in eval mode
    before = python_state(placed.template)  # each comparison starts where the user's forward stands
    try:
        _compare(placed, slot, model, own, inputs, when, own_may_fail)
    finally:
        put_back(placed.template, before)


def _compare(placed, slot, model, own, inputs, when, own_may_fail) -> None:
    state = _initial_state(placed)
    for name in placed.parameter_names:
        state[name].requires_grad_()
    template = placed.template
    with _probing(template), torch.enable_grad():
        try:
            own_out = own(*inputs)  # the user's own model: its errors are the user's, raised as they are
        except Exception:  # noqa: BLE001 - an adversarial copy the user's model refuses proves nothing
            if own_may_fail:
                return
            raise
        try:
            padded_out = functional_call(template, state, inputs, tie_weights=True)
        except FusionError:
            raise  # a refusal that names its layer already
        except Exception as error:  # noqa: BLE001 - any failure of the padded forward refuses the combination
            raise FusionError(
                f"slot {slot} fails padded into the array's envelope on {when} ({type(error).__name__}: "
                f"{cut(_first_line(error), 60)}): train models like it in a separate array",
                slot=slot,
            ) from None
        try:
            _compare_in_detail(placed, own, state, own_out, padded_out, inputs)
        except _Mismatch as mismatch:
            where = _first_differing_layer(placed, own_copy(model), _initial_state(placed), inputs)
            size = f" (relative difference {mismatch.error:.2g})" if mismatch.error != float("inf") else ""
            raise FusionError(
                f"slot {slot} differs from its own model in the envelope: {mismatch.what} on {when}{size}{where}; "
                "train this size in a separate array",
                slot=slot,
            ) from None


def _initial_state(placed: PlacedSlot) -> dict[str, torch.Tensor]:
    return {name: _as_float64(value).clone() for name, value in placed.state.items()}


def _compare_in_detail(placed: PlacedSlot, own: nn.Module, state, own_out, padded_out, inputs) -> None:
    """Raise _Mismatch at the first output, gradient or buffer of `own` that its place differs from."""
    emb = placed.embedding
    tensors = _compare_outputs("outputs", own_out, padded_out)
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in tensors]
    padded_tensors = [t for t in tree_flatten(padded_out)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    own_params = dict(own.named_parameters())
    leaves = [state[name] for name in placed.parameter_names]
    own_grads = torch.autograd.grad(
        sum((t * w).sum() for t, w in zip(tensors, weights)), list(own_params.values()), allow_unused=True
    )
    padded_grads = dict(
        zip(
            placed.parameter_names,
            torch.autograd.grad(sum((t * w).sum() for t, w in zip(padded_tensors, weights)), leaves, allow_unused=True),
        )
    )
    # Gradients are compared against the largest of them all: a gradient that is zero
    # in exact arithmetic (a bias before BatchNorm) is float noise on both sides.
    scale = max((g.abs().max().item() for g in own_grads if g is not None and g.numel()), default=0.0)
    for (name, param), grad in zip(own_params.items(), own_grads):
        env_name, index = emb.places[name]
        padded = padded_grads.get(placed.aliases[env_name])
        own_grad = grad if grad is not None else torch.zeros_like(param)
        padded_grad = take_from(padded, index) if padded is not None else torch.zeros_like(own_grad)
        _check(f"gradients of '{name}'", own_grad, padded_grad, scale)
    for name, buffer in own.named_buffers():
        env_name, index = emb.places[name]
        buffer_scale = max(buffer.abs().max().item(), 1e-6) if buffer.is_floating_point() and buffer.numel() else None
        _check(f"buffer '{name}' after a training step", buffer, take_from(state[env_name], index), buffer_scale)
    own.eval()
    placed.template.eval()
    with torch.no_grad():
        _compare_outputs(
            "outputs in eval mode", own(*inputs), functional_call(placed.template, state, inputs, tie_weights=True)
        )
