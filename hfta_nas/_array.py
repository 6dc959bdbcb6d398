"""`ModelArray`: B models with equal shapes, fused into one array.

All parameters live in ONE tensor `flat` of shape [B, P] (slot first,
contract 4), and so do their gradients (`flat.grad`). Each named parameter is
an autograd leaf that is a [B, *shape] view into `flat`'s storage, and its
`.grad` a view into `flat.grad`: backward accumulates every parameter's
gradient straight into its slice (no [B, P]-sized zero fill per parameter, as
slicing one [B, P] leaf in the graph would cost), while the optimizer still
updates a few contiguous [B, P] row blocks whatever the model, and slot surgery
(drop, replace, load) stays a row operation. Buffers (BatchNorm running stats,
per-slot dropout counters) are stacked [B, ...] tensors.

The forward pass runs ONE template copy of the user's model through
`torch.func.functional_call` under `torch.func.vmap`, so the user's forward
code is never edited: it sees one slot's batch [N, ...] as it would alone.
A template that is an nn.Sequential of plain layers (Linear, large Conv,
activations, Flatten) skips vmap and runs the same ops on the [B, ...]
tensors directly (`_slot_ops.native_forward`).
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap

from hfta_nas._slot_layers import init_slot_randomness, make_fusable
from hfta_nas._slot_ops import NeedsVmap, global_hooks_set, native_forward
from hfta_nas.errors import FusionError, FusionFallbackWarning, HftaNasError

# A parameter's gradient is a strided view into `flat.grad` by design (see the
# module docstring); autograd accumulates into it in place and warns once that
# its layout is not dense. The warning is about speed and does not apply here.
warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout contract")


def _describe_tensors(model: nn.Module) -> list[tuple[str, str, tuple[int, ...], torch.dtype]]:
    params = [("parameter", n, tuple(p.shape), p.dtype) for n, p in model.named_parameters()]
    buffers = [("buffer", n, tuple(b.shape), b.dtype) for n, b in model.named_buffers()]
    return params + buffers


class FusionSignature:
    """What must be equal across slots: tensor names/shapes/dtypes and the module tree.

    Slot 0's forward code runs for every slot, so besides parameter and buffer
    shapes the module trees (types and their settings, as printed by repr)
    must be equal: an MLP with ReLU and one with GELU have equal shapes but
    cannot share a forward.
    """

    def __init__(self, model: nn.Module) -> None:
        self.tensors = _describe_tensors(model)
        self.structure = repr(model).splitlines()

    def check(self, model: nn.Module, slot: int) -> None:
        """Raise FusionError naming the first difference between `model` and the reference (slot 0)."""
        described = _describe_tensors(model)
        for (kind0, name0, shape0, dtype0), (kind, name, shape, dtype) in zip(self.tensors, described):
            if (kind0, name0) != (kind, name):
                raise FusionError(f"slot {slot} has {kind} '{name}' where slot 0 has {kind0} '{name0}'; models must have the same layers.")
            if shape0 != shape:
                raise FusionError(
                    f"{kind} '{name}' has shape {list(shape)} in slot {slot} but {list(shape0)} in slot 0; "
                    "only models with equal shapes can be fused into one array."
                )
            if dtype0 != dtype and not (dtype0.is_floating_point and dtype.is_floating_point):
                # Floating tensors are all cast to the array's dtype; others must agree.
                raise FusionError(f"{kind} '{name}' is {dtype} in slot {slot} but {dtype0} in slot 0.")
        if len(described) != len(self.tensors):
            longer = slot if len(described) > len(self.tensors) else 0
            extra = (described if longer else self.tensors)[min(len(described), len(self.tensors))]
            raise FusionError(f"slot {longer} has an extra {extra[0]} '{extra[1]}'; models must have the same layers.")
        for line0, line in zip(self.structure, repr(model).splitlines()):
            if line0 != line:
                raise FusionError(
                    f"slot {slot} differs from slot 0 in structure: '{line.strip()}' vs '{line0.strip()}'; "
                    "slots share one forward, so layer types and settings must be equal."
                )


def check_fusable(models: Sequence[nn.Module]) -> None:
    """Raise FusionError unless every model can share slot 0's forward and layout."""
    signature = FusionSignature(models[0])
    for slot, model in enumerate(models[1:], start=1):
        signature.check(model, slot)


def _per_slot_ints(values: Iterable[int] | None, count: int, name: str) -> list[int]:
    values = list(values) if values is not None else list(range(count))
    if len(values) != count:
        raise HftaNasError(f"{name} has {len(values)} entries but the array has {count} slots.")
    for value in values:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise HftaNasError(f"{name} must be non-negative integers, got {value!r}.")
    return values


class ModelArray:
    """B models of equal shapes trained as one.

    >>> arr = ModelArray.from_factory(make_model, seeds=[0, 1, 2, 3])
    >>> logits = arr(x)                 # x: [B, N, ...] one batch per slot
    >>> logits = arr(x, shared_input=True)  # x: [N, ...] the same batch for all slots

    Each slot has its own dropout seed (default: its index, or its init seed
    with `from_factory`); dropout masks depend on that seed only.
    """

    def __init__(
        self,
        models: Sequence[nn.Module],
        *,
        dropout_seeds: Sequence[int] | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        models = list(models)
        if not models:
            raise HftaNasError("a ModelArray needs at least one model.")
        for slot, model in enumerate(models):
            if not isinstance(model, nn.Module):
                raise HftaNasError(f"slot {slot} is a {type(model).__name__}, not a torch.nn.Module.")
        self._signature = FusionSignature(models[0])
        for slot, model in enumerate(models[1:], start=1):
            self._signature.check(model, slot)
        first_param = next(models[0].parameters(), None)
        if first_param is None:
            raise FusionError("the model has no parameters; there is nothing to train in an array.")
        dtype = dtype or first_param.dtype
        device = torch.device(device) if device is not None else first_param.device
        self.device, self.dtype = device, dtype
        self._listeners: list[Any] = []
        self._checked_modes: set[tuple[bool, bool]] = set()

        # The template keeps the original module's names (state_dict keys) and
        # its non-tensor attributes; its own tensors are never used.
        self._template = make_fusable(copy.deepcopy(models[0])).to(device=device)
        self._state_keys = list(models[0].state_dict().keys())
        self._layout = self._param_layout(models[0])
        self._param_aliases = self._aliases(models[0])
        # Sequential models of plain layers skip vmap (same ops, less overhead; _slot_ops.py).
        self._native = native_forward(self._template, self._param_aliases)
        self._native_refused: set[tuple[Any, ...]] = set()
        self._native_accepted: set[tuple[Any, ...]] = set()
        self._buffer_names = [n for n, _ in models[0].named_buffers()]

        self.flat = torch.stack([self._flatten(m) for m in models]).to(device=device, dtype=dtype).requires_grad_()
        self._bind_leaves()
        self.buffers: dict[str, torch.Tensor] = {
            name: torch.stack([dict(m.named_buffers())[name].detach() for m in models]).to(device=device)
            for name in self._buffer_names
        }
        for name, value in self.buffers.items():
            if value.is_floating_point():
                self.buffers[name] = value.to(dtype)
        seeds = _per_slot_ints(dropout_seeds, len(models), "dropout_seeds")
        self.dropout_seeds = torch.tensor(seeds, dtype=torch.int64, device=device)
        self._slot_random = init_slot_randomness(self._template, self.dropout_seeds)

    # ------------------------------------------------------------------ building
    @classmethod
    def from_factory(
        cls,
        factory: Callable[[], nn.Module],
        seeds: Sequence[int],
        *,
        dropout_seeds: Sequence[int] | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> "ModelArray":
        """One slot per seed: slot b is `factory()` built right after `torch.manual_seed(seeds[b])`.

        The global RNG state is restored afterwards, so building an array does
        not change the randomness of the caller's code.
        """
        seeds = _per_slot_ints(seeds, len(list(seeds)), "seeds")
        if not seeds:
            raise HftaNasError("from_factory needs at least one seed.")
        with torch.random.fork_rng(devices=[]):
            models = [_build_seeded(factory, seed) for seed in seeds]
        try:
            check_fusable(models)
        except FusionError as error:
            raise FusionError(f"the model factory built different models on different calls (one per seed): {error} "
                              "A factory must build the same layers and shapes every time; only the initial "
                              "weights may depend on the seed.") from None
        return cls(models, dropout_seeds=dropout_seeds if dropout_seeds is not None else seeds, device=device, dtype=dtype)

    @staticmethod
    def _param_layout(model: nn.Module) -> list[tuple[str, int, torch.Size]]:
        layout, offset = [], 0
        for name, param in model.named_parameters():
            layout.append((name, offset, param.shape))
            offset += param.numel()
        return layout

    @staticmethod
    def _aliases(model: nn.Module) -> dict[str, str]:
        """Map every parameter name (tied weights included) to its canonical name."""
        canonical: dict[int, str] = {}
        aliases = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            aliases[name] = canonical.setdefault(id(param), name)
        return aliases

    def _flatten(self, model: nn.Module) -> torch.Tensor:
        params = dict(model.named_parameters())
        return torch.cat([params[name].detach().reshape(-1).to(self.dtype) for name, _, _ in self._layout])

    # ---------------------------------------------------------------- properties
    def __len__(self) -> int:
        return self.flat.shape[0]

    @property
    def num_parameters(self) -> int:
        """Parameters of ONE slot."""
        return self.flat.shape[1]

    @property
    def training(self) -> bool:
        return self._template.training

    def train(self, mode: bool = True) -> "ModelArray":
        self._template.train(mode)
        return self

    def eval(self) -> "ModelArray":
        return self.train(False)

    def parameters(self) -> dict[str, torch.Tensor]:
        """Each named parameter as a [B, *shape] leaf that is a view of `flat`."""
        return self._leaves

    def _views(self, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        batch = len(self)
        return {name: tensor[:, offset : offset + shape.numel()].view(batch, *shape) for name, offset, shape in self._layout}

    def _bind_leaves(self) -> None:
        """(Re)make the per-parameter leaves over `flat` and bind their gradients to `flat.grad`."""
        self._leaves = {name: view.requires_grad_() for name, view in self._views(self.flat.detach()).items()}
        self._grad_views: dict[str, torch.Tensor] = {}
        self.zero_grad()

    def zero_grad(self) -> None:
        """Zero `flat.grad` and point every parameter's `.grad` at its slice of it,
        so that backward accumulates in place (one [B, P] buffer for all)."""
        if self.flat.grad is None or self.flat.grad.shape != self.flat.shape:
            self.flat.grad = torch.zeros_like(self.flat, memory_format=torch.contiguous_format)
        else:
            self.flat.grad.zero_()
        self._grad_views = self._views(self.flat.grad)
        for name, leaf in self._leaves.items():
            leaf.grad = self._grad_views[name]

    def gradient(self) -> torch.Tensor:
        """`flat.grad` after backward: [B, P], every parameter's gradient in its slice.

        A parameter whose `.grad` was replaced (set to None by the caller, or
        rebuilt out of place by a create_graph backward) is copied back in.
        """
        grad = self.flat.grad
        if grad is None or grad.shape != self.flat.shape:
            stale = {name: leaf.grad for name, leaf in self._leaves.items()}
            self.zero_grad()
        else:
            stale = {name: leaf.grad for name, leaf in self._leaves.items() if leaf.grad is not self._grad_views[name]}
        with torch.no_grad():
            for name, value in stale.items():
                if value is not None:
                    self._grad_views[name].copy_(value)
                self._leaves[name].grad = self._grad_views[name]
        return self.flat.grad

    # ------------------------------------------------------------------- forward
    def __call__(self, *inputs: torch.Tensor, shared_input: bool = False) -> Any:
        """Run every slot on its own batch ([B, N, ...] inputs) or, with
        `shared_input=True`, all slots on the same batch ([N, ...] inputs)."""
        if not shared_input:
            for position, x in enumerate(inputs):
                if isinstance(x, torch.Tensor) and (x.dim() == 0 or x.shape[0] != len(self)):
                    raise HftaNasError(
                        f"input {position} has shape {list(x.shape)}; an array of {len(self)} slots expects "
                        f"[{len(self)}, N, ...] (one batch per slot), or pass shared_input=True for one batch [N, ...] shared by all slots."
                    )
        if self._native is not None and not shared_input and len(inputs) == 1:
            out = self._native_call(inputs[0])
            if out is not None:
                return out
        state = {**self._leaves, **self.buffers, **self._slot_random}

        def one_slot(slot_state, *slot_inputs):
            return functional_call(self._template, slot_state, slot_inputs, tie_weights=True)

        in_dims = (0,) + ((None if shared_input else 0),) * len(inputs)
        fused = vmap(one_slot, in_dims=in_dims, randomness="error")
        mode = (self.training, shared_input)
        with _no_attention_fast_path():
            if mode in self._checked_modes:
                return fused(state, *inputs)
            self._checked_modes.add(mode)
            return self._first_call(fused, state, inputs)

    def _native_call(self, x: Any) -> torch.Tensor | None:
        """The template's output computed without vmap, or None where this call needs vmap
        (remembered per input shape and mode, so a refused call is not tried again).

        Layers before the one that refuses may have run already and changed
        state (BatchNorm running stats, dropout counters): on the first call
        of a kind those are saved, and put back if the call is refused, so the
        vmap path starts from the same state. Refusals depend only on shapes
        and mode, so a call of a kind that once ran through never refuses.
        """
        if not isinstance(x, torch.Tensor) or global_hooks_set():
            return None
        key = (tuple(x.shape), x.dtype, self.training)
        if key in self._native_refused:
            return None
        stateful = {**self.buffers, **self._slot_random}
        saved = {name: value.clone() for name, value in stateful.items()} if key not in self._native_accepted else None
        try:
            out = self._native({**self._leaves, **stateful}, x)
        except NeedsVmap:
            self._native_refused.add(key)
            for name, value in saved.items():
                stateful[name].copy_(value)
            return None
        self._native_accepted.add(key)
        return out

    def _first_call(self, fused, state, inputs):
        """Run once while watching for vmap's per-slot-loop fallbacks and
        un-fusable random ops, and turn them into messages that name the cause."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                result = fused(state, *inputs)
            except RuntimeError as error:
                if "random operation" in str(error):
                    raise FusionError(
                        "the model calls a random operation in its forward (e.g. F.dropout or torch.rand); "
                        "inside an array randomness must come from nn.Dropout modules so each slot uses its own seed."
                    ) from error
                raise
        for warning in caught:
            message = str(warning.message)
            if "performance drop" in message:
                operator = message.split("batching rule for ")[-1].split(".")[0] if "batching rule for " in message else "an operator"
                warnings.warn(
                    f"{operator} has no fused (vmap) implementation: the array runs it as a loop over slots. "
                    "Results are exact; only speed suffers.",
                    FusionFallbackWarning,
                    stacklevel=3,
                )
            else:
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        return result

    # ------------------------------------------------------------- slot access
    def _check_slot(self, slot: int) -> int:
        if not isinstance(slot, int) or not -len(self) <= slot < len(self):
            raise HftaNasError(f"slot {slot!r} is out of range for an array of {len(self)} slots.")
        return slot % len(self)

    def slot_state_dict(self, slot: int) -> "OrderedDict[str, torch.Tensor]":
        """A plain state_dict of one slot, loadable into a model from the same factory."""
        slot = self._check_slot(slot)
        params = self.parameters()
        result: OrderedDict[str, torch.Tensor] = OrderedDict()
        for key in self._state_keys:
            if key in self._param_aliases:
                result[key] = params[self._param_aliases[key]][slot].detach().clone()
            else:
                result[key] = self.buffers[key][slot].clone()
        return result

    def load_slot(self, slot: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Overwrite one slot's parameters and buffers from a plain state_dict."""
        slot = self._check_slot(slot)
        missing = [k for k in self._state_keys if k not in state_dict]
        unexpected = [k for k in state_dict if k not in self._state_keys]
        if missing or unexpected:
            raise HftaNasError(f"state_dict does not match the array's model: missing keys {missing}, unexpected keys {unexpected}.")
        params = self._views(self.flat.detach())
        with torch.no_grad():
            for key in self._state_keys:
                value = torch.as_tensor(state_dict[key])
                target = params[self._param_aliases[key]][slot] if key in self._param_aliases else self.buffers[key][slot]
                if value.shape != target.shape:
                    raise FusionError(f"'{key}' has shape {list(value.shape)} but the array expects {list(target.shape)}.")
                target.copy_(value)

    def to_module(self, slot: int, model: nn.Module) -> nn.Module:
        """Load slot `slot` into `model` (a fresh instance from the same factory) and return it."""
        model.load_state_dict(self.slot_state_dict(slot))
        return model

    # ------------------------------------------------------------ slot surgery
    def attach(self, listener: Any) -> None:
        """Register an object (optimizer, schedule, data order) that holds
        per-slot state and must follow `drop_slots` / `replace_slot`."""
        self._listeners.append(listener)

    def drop_slots(self, slots: Iterable[int]) -> list[int]:
        """Remove slots; the survivors keep their order. Returns the kept old indices.

        Everything attached (optimizers, schedules) shrinks the same way, so
        training continues as if the array had been built from the survivors.
        """
        dropped = {self._check_slot(s) for s in slots}
        keep = [b for b in range(len(self)) if b not in dropped]
        if not keep:
            raise HftaNasError("cannot drop every slot of an array.")
        index = torch.tensor(keep, device=self.device)
        self.flat = self.flat.detach().index_select(0, index).requires_grad_()
        self._bind_leaves()
        self.buffers = {name: value.index_select(0, index) for name, value in self.buffers.items()}
        self._slot_random = {name: value.index_select(0, index) for name, value in self._slot_random.items()}
        self.dropout_seeds = self.dropout_seeds.index_select(0, index)
        for listener in self._listeners:
            listener.keep_slots(keep)
        return keep

    def replace_slot(self, slot: int, model: nn.Module, *, dropout_seed: int | None = None) -> None:
        """Put a fresh model into `slot`: its weights and buffers, a new dropout
        stream, and fresh optimizer state / schedule position in everything attached."""
        slot = self._check_slot(slot)
        if not isinstance(model, nn.Module):
            raise HftaNasError(f"replace_slot needs a torch.nn.Module, got {type(model).__name__}.")
        self._signature.check(model, slot)
        self.load_slot(slot, model.state_dict())
        seed = _per_slot_ints([slot if dropout_seed is None else dropout_seed], 1, "dropout_seed")[0]
        self.dropout_seeds[slot] = seed
        fresh = init_slot_randomness(self._template, self.dropout_seeds[slot : slot + 1])
        for name, value in fresh.items():
            self._slot_random[name][slot] = value[0]
        for listener in self._listeners:
            listener.reset_slot(slot)


@contextlib.contextmanager
def _no_attention_fast_path():
    """Turn off torch's fused inference kernels for attention/transformer layers
    (they have no vmap batching rule and would loop over slots)."""
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


def _build_seeded(factory: Callable[[], nn.Module], seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = factory()
    if not isinstance(model, nn.Module):
        raise HftaNasError(f"the model factory returned a {type(model).__name__}, not a torch.nn.Module.")
    return model
