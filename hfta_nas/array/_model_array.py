"""`ModelArray`: B models fused into one array (equal shapes, or padded into an envelope).

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
tensors directly (`hfta_nas.layers._slot_ops.native_forward`). An array of one
slot fuses nothing and skips both: it runs the template on the slot's tensors
as its model alone would (`ModelArray._alone`).
"""

from __future__ import annotations

import copy
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.func import vmap

from hfta_nas._python_state import carry, changes, put_back, python_state
from hfta_nas.array._alone import TemplatePlaces
from hfta_nas.array._envelope_slots import EnvelopeSlots, as_tensor
from hfta_nas.array._first_call import NeedsSlotLoop, running_layer, watched_first_call, watching_forward
from hfta_nas.array._layout import FlatLayout
from hfta_nas.array._reassigned import keep, reassigned
from hfta_nas.array._signature import (
    FusionSignature,
    ShapesDiffer,
    check_equal_shapes,
    check_fusable,
    equal_shapes,
    refuse_frozen,
    refuse_hooked_weights,
)
from hfta_nas.array._slot_loop import call_template, one_slot_result, refusing_random_operations, slots_one_by_one
from hfta_nas.array._unpad import carry_python_state, keeps_unsaved_buffers, own_counters, own_models, own_rows
from hfta_nas.envelope._placement import SlotEmbedding
from hfta_nas.envelope._probe import PaddingCost, PlacedSlot, count_macs, recheck_slot, verify_slot
from hfta_nas.envelope._template import Envelope
from hfta_nas.errors import FusionError, FusionFallbackWarning, HftaNasError
from hfta_nas.layers._slot_layers import SlotDropout, init_slot_randomness, make_fusable, no_attention_fast_path
from hfta_nas.layers._slot_ops import NeedsVmap, global_hooks_set, lowering, native_forward

__all__ = ["FusionSignature", "ModelArray", "check_fusable"]

# A parameter's gradient is a strided view into `flat.grad` by design (see the
# module docstring); autograd accumulates into it in place and warns once that
# its layout is not dense. The warning is about speed and does not apply here.
warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout contract")


def _per_slot_ints(values: Iterable[int] | None, count: int, name: str) -> list[int]:
    values = list(values) if values is not None else list(range(count))
    if len(values) != count:
        raise HftaNasError(f"{name} has {len(values)} entries but the array has {count} slots.")
    for value in values:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise HftaNasError(f"{name} must be non-negative integers, got {value!r}.")
    return values


class ModelArray:
    """B models trained as one: of equal shapes, or of one structure and different sizes.

    >>> arr = ModelArray.from_factory(make_model, seeds=[0, 1, 2, 3])
    >>> logits = arr(x)                 # x: [B, N, ...] one batch per slot
    >>> logits = arr(x, shared_input=True)  # x: [N, ...] the same batch for all slots

    Each slot has its own dropout seed (default: its index, or its init seed
    with `from_factory`); dropout masks depend on that seed only.

    Models of different sizes (widths, channels, odd kernels, hidden sizes,
    depth where a block can be skipped, activation and dropout rate per slot)
    are padded into one *envelope* (`envelope/_merge.py`): each slot's entries sit in
    a corner of the envelope's tensors, the rest stay exactly zero (their
    gradients are masked), and the slot computes what its own model computes.
    Before such an array first runs, each slot's own model is compared with
    its place in the envelope on the first batch and two adversarial copies
    of it (float64, forward and backward); a mismatch raises FusionError
    naming the layer. While it trains, one slot in turn is compared again on
    the whole batch of every `recheck_every`-th training call (a call in
    training mode, or with gradients on: an array trained in eval mode too),
    with its current weights: a mismatch there stops the array (that call and
    every later one raise the FusionError), so it never trains on.
    `recheck_every = 0` turns the running check off.

    The checks run on a copy of the template, so the user's forward runs once
    per call, as each slot's own model would: Python state it keeps (a step
    counter) advances exactly as in plain training. Buffers the forward
    reassigns (`self.ema = ...`) are kept like in-place updates. A forward
    that branches on a tensor's value runs its slots one by one (exact, slower).
    """

    # Training calls between two running checks. One check is a float64 forward and backward of
    # one slot's model and of its place on the whole batch: about 3 training steps of an array of
    # 4 MLPs (widths 32-128, batch 64-256, CPU, 1 thread; benchmarks/forward_checks.py), so one
    # check every 100 calls adds about 3%.
    RECHECK_EVERY = 100

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
        first_param = next(models[0].parameters(), None)
        if first_param is None:
            raise FusionError("the model has no parameters; there is nothing to train in an array.")
        refuse_frozen(models)
        for model in models:
            refuse_hooked_weights(model)  # before the shapes are compared, whose message would blame a setting
        dtype = dtype or first_param.dtype
        device = torch.device(device) if device is not None else first_param.device
        self.device, self.dtype = device, dtype
        self._listeners: list[Any] = []
        self._checked_modes: set[tuple[bool, bool]] = set()
        self._training_calls = 0  # counts the calls in training mode, for the running check
        self._recheck_every = self.RECHECK_EVERY
        self._refusal: FusionError | None = None  # set when the running check found a mismatch
        self._one_by_one: str | None = None  # why the forward runs slot by slot (None: fused)
        self._looped_modes: set[tuple[bool, bool]] = set()
        self._places: TemplatePlaces | None = None  # where an array of one's tensors go (_alone.py)

        # Equal shapes: slot 0's model is the source of names and shapes. Else
        # the envelope of all slots is (FusionError naming the layer if none).
        envelope = None if equal_shapes(models) else Envelope(models)
        source = models[0] if envelope is None else envelope.tree
        self._signature = FusionSignature(source)
        # The template keeps the source module's names (state_dict keys) and
        # its non-tensor attributes; its own tensors are never used.
        template = make_fusable(copy.deepcopy(source)) if envelope is None else envelope.template()
        self._template = template.to(device=device)
        self._initial_python = python_state(self._template)  # what a forward's Python state starts from
        self._state_keys = list(source.state_dict().keys())
        self._layout = FlatLayout.of(source)
        self._param_aliases = self._layout.aliases
        # Sequential models of plain layers skip vmap (same ops, less overhead; _slot_ops.py).
        self._native = native_forward(self._template, self._param_aliases)
        self._native_refused: set[tuple[Any, ...]] = set()
        self._native_accepted: set[tuple[Any, ...]] = set()
        self._buffer_names = [n for n, _ in source.named_buffers()]

        # Arrays of different sizes keep where each slot sits in the envelope (None: equal shapes).
        self._slots = None if envelope is None else EnvelopeSlots(envelope, models, self._layout, dtype, device)
        if self._slots is None:
            rows = [self._layout.flatten(m, dtype) for m in models]
            self.flat = torch.stack(rows).to(device=device, dtype=dtype).requires_grad_()
            self.buffers: dict[str, torch.Tensor] = {
                name: torch.stack([dict(m.named_buffers())[name].detach() for m in models]).to(device=device)
                for name in self._buffer_names
            }
        else:
            self.flat, self.buffers = self._slots.zero_tensors(source, dtype, device)
            for slot, model in enumerate(models):
                params = dict(model.named_parameters(remove_duplicate=False))
                self._slots.write(slot, params, dict(model.named_buffers()), flat=self.flat, array_buffers=self.buffers)
            self._slots.sync_conv_boxes(self._template)
        self._bind_leaves()
        for name, value in self.buffers.items():
            if value.is_floating_point():
                self.buffers[name] = value.to(dtype)
        seeds = _per_slot_ints(dropout_seeds, len(models), "dropout_seeds")
        self.dropout_seeds = torch.tensor(seeds, dtype=torch.int64, device=device)
        own_modules = None if self._slots is None else [emb.modules for emb in self._slots.embeddings]
        self._slot_random = init_slot_randomness(self._template, self.dropout_seeds, own_modules)

    @property
    def recheck_every(self) -> int:
        """Training calls between two running checks of an array of different sizes; 0: none."""
        return self._recheck_every

    @recheck_every.setter
    def recheck_every(self, calls: int) -> None:
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
            raise HftaNasError(
                f"recheck_every must be a whole number of training calls, or 0 for no running check; got {calls!r}."
            )
        self._recheck_every = calls

    def _probe_template(self) -> nn.Module:
        """A copy of the template for checks and counts, so that only the array's own calls run the
        user's forward on it (its Python state advances as in plain training). The tensors are shared,
        not copied: the checks swap in their own."""
        memo = {id(t): t for t in (*self._template.parameters(), *self._template.buffers())}
        return copy.deepcopy(self._template, memo)

    def _verify_pending(self, inputs: tuple[Any, ...], shared_input: bool) -> None:
        """Compare every not yet checked slot's own model with its embedding on this batch."""
        probe = self._probe_template()
        for slot in sorted(self._slots.unverified):
            slot_inputs = _slot_inputs(inputs, slot, shared_input)
            with watching_forward(probe):
                self._slots.macs[slot] = verify_slot(
                    self.placed_slot(slot, probe), slot, self._slots.unverified[slot], slot_inputs
                )
            self._slots.mark_verified(slot)

    def _recheck_now_and_then(self, inputs: tuple[Any, ...], shared_input: bool) -> None:
        """Every `recheck_every` training calls, compare one slot (in turn) with its own model on this
        whole batch: a padding error that depends on the data stops the array when a batch shows it."""
        self._training_calls += 1
        every = self.recheck_every
        if not every or self._training_calls % every:
            return
        slot = (self._training_calls // every - 1) % len(self)
        own = self._slots.verified.get(slot)
        if own is None:
            return
        own.load_state_dict(self.slot_state_dict(slot))
        # The own model's Python state as the template's is now (a forward's step counter, say).
        carry(changes(self._template, self._initial_python), own, self._slots.embeddings[slot].modules)
        when = f"the batch of training call {self._training_calls}"
        probe = self._probe_template()
        try:
            with watching_forward(probe):
                recheck_slot(self.placed_slot(slot, probe), slot, own, _slot_inputs(inputs, slot, shared_input), when)
        except FusionError as error:
            self._refusal = error  # every later call raises it too: the array never trains on
            raise

    def verify(self, *example_inputs: Any) -> None:
        """Check now (rather than on the first call) that every slot computes exactly what its
        own model computes, on one example batch shared by all slots ([N, ...], like shared_input)."""
        if self._slots is not None and self._slots.unverified:
            self._verify_pending(example_inputs, shared_input=True)

    def padding_cost(self, *example_inputs: Any) -> PaddingCost:
        """Multiply-adds per sample, one forward: what the slots' own models need (useful) and
        what the array executes (executed = slots x envelope). Equal-shape arrays waste nothing.

        Counted on the batch that verified the slots (the first call), or on `example_inputs`
        (one batch [N, ...]) when there was none yet.
        """
        if self._slots is None:
            if not example_inputs:
                raise HftaNasError("padding_cost() of an array of equal shapes needs an example batch [N, ...].")
            per_slot = count_macs(self._probe_template(), self._slot_state(0), example_inputs)
            return PaddingCost([(per_slot, per_slot)] * len(self))
        if self._slots.unverified:
            if not example_inputs:
                raise HftaNasError("padding_cost() before the array's first call needs an example batch [N, ...].")
            self.verify(*example_inputs)
        return PaddingCost([self._slots.macs[slot] for slot in range(len(self))])

    def _slot_state(self, slot: int) -> dict[str, torch.Tensor]:
        """Slot `slot`'s view of every tensor the template reads (parameters, buffers, per-slot state)."""
        state = {**self._leaves, **self.buffers, **self._slot_random, **self._constants()}
        return {name: value[slot] for name, value in state.items()}

    def placed_slot(self, slot: int, template: nn.Module | None = None) -> PlacedSlot:
        """Slot `slot` of an array of different sizes as the envelope probe reads it: the template
        (or `template`, a copy of it), where the slot sits in it, and its view of every tensor it reads."""
        slot = self._check_slot(slot)
        if self._slots is None:
            raise HftaNasError("placed_slot() is for arrays of models of different sizes (an envelope).")
        return PlacedSlot(
            self._template if template is None else template,
            self._slots.embeddings[slot],
            self._slot_state(slot),
            tuple(self._leaves),
            self._param_aliases,
        )

    def fits(self, model: nn.Module) -> bool:
        """Whether `model` can replace a slot of this array (`replace_slot`) without a new array."""
        if not isinstance(model, nn.Module):
            raise HftaNasError(f"fits needs a torch.nn.Module, got {type(model).__name__}.")
        try:
            refuse_frozen([model])
            self._placement(model, 0)
        except FusionError:
            return False
        return True

    def _placement(self, model: nn.Module, slot: int) -> SlotEmbedding | None:
        """Where `model` goes in slot `slot` (None: equal shapes); FusionError if it cannot."""
        if self._slots is None:
            difference = self._signature.difference(model, slot)
            if difference is not None:
                raise FusionError(f"a new model must match this array of equal shapes: {difference}")
            return None
        return self._slots.envelope.place(model, slot)

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
    ) -> ModelArray:
        """One slot per seed: slot b is `factory()` built right after `torch.manual_seed(seeds[b])`.

        The factory must build the same shapes every time (replicas of one model);
        models of different sizes go into one array as a list, `ModelArray(models)`.

        The global RNG state is restored afterwards, so building an array does
        not change the randomness of the caller's code.
        """
        seeds = _per_slot_ints(seeds, len(list(seeds)), "seeds")
        if not seeds:
            raise HftaNasError("from_factory needs at least one seed.")
        with torch.random.fork_rng(devices=[]):
            models = [_build_seeded(factory, seed) for seed in seeds]
        # One factory, many seeds means replicas: a factory whose sizes change with the seed
        # is a bug here (models of different sizes go in as a list: `ModelArray(models)`).
        refuse_hooked_weights(models[0])  # before the comparison, whose message would blame the factory
        try:
            check_equal_shapes(models)
        except ShapesDiffer as error:
            raise FusionError(
                f"the model factory built different models for different seeds: {error.difference}; "
                "only the initial weights may depend on the seed"
            ) from None
        return cls(
            models, dropout_seeds=dropout_seeds if dropout_seeds is not None else seeds, device=device, dtype=dtype
        )

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

    def train(self, mode: bool = True) -> ModelArray:
        self._template.train(mode)
        return self

    def eval(self) -> ModelArray:
        return self.train(False)

    def parameters(self) -> dict[str, torch.Tensor]:
        """Each named parameter as a [B, *shape] leaf that is a view of `flat`."""
        return self._leaves

    def _bind_leaves(self) -> None:
        """(Re)make the per-parameter leaves over `flat` and bind their gradients to `flat.grad`."""
        self._leaves = {name: view.requires_grad_() for name, view in self._layout.views(self.flat.detach()).items()}
        self._grad_views: dict[str, torch.Tensor] = {}
        self.zero_grad()

    def zero_grad(self) -> None:
        """Zero `flat.grad` and point every parameter's `.grad` at its slice of it,
        so that backward accumulates in place (one [B, P] buffer for all)."""
        if self.flat.grad is None or self.flat.grad.shape != self.flat.shape:
            self.flat.grad = torch.zeros_like(self.flat, memory_format=torch.contiguous_format)
        else:
            self.flat.grad.zero_()
        self._grad_views = self._layout.views(self.flat.grad)
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
            if self._slots is not None:
                self._slots.mask_gradient(self.flat.grad)
        return self.flat.grad

    # ------------------------------------------------------------------- forward
    def __call__(self, *inputs: Any, shared_input: bool = False, **keyword_inputs: Any) -> Any:
        """Run every slot on its own batch ([B, N, ...] inputs) or, with
        `shared_input=True`, all slots on the same batch ([N, ...] inputs).

        Inputs may be several, tuples or dicts of tensors, and keyword arguments
        (`arr(tokens, pad_mask=mask)`): every tensor in them is split by slot the
        same way; other values (flags, None) reach each slot's forward as given."""
        batched = (*inputs, *keyword_inputs.values())
        if not shared_input:
            for position, x in enumerate(pytree.tree_leaves(batched)):
                if isinstance(x, torch.Tensor) and (x.dim() == 0 or x.shape[0] != len(self)):
                    raise HftaNasError(
                        f"input {position} has shape {list(x.shape)}; an array of {len(self)} slots expects "
                        f"[{len(self)}, N, ...] (one batch per slot), or pass shared_input=True for one "
                        "batch [N, ...] shared by all slots."
                    )
        if keyword_inputs and self._slots is not None:
            raise HftaNasError(
                "keyword inputs are not supported by an array of models of different sizes; "
                "give them positionally (the model's forward(x, mask))"
            )
        if self._refusal is not None:
            raise self._refusal
        if self._slots is not None and self._slots.unverified:
            self._verify_pending(inputs, shared_input)
        if self._slots is not None and (self.training or torch.is_grad_enabled()):
            self._recheck_now_and_then(inputs, shared_input)
        alone = self._alone()
        if self._native is not None and not alone and not shared_input and len(inputs) == 1 and not keyword_inputs:
            out = self._native_call(inputs[0])
            if out is not None:
                return out
        state = {**self._leaves, **self.buffers, **self._slot_random, **self._constants()}
        call = call_template(len(inputs), list(keyword_inputs))
        mode = (self.training, shared_input)
        with no_attention_fast_path():
            if alone and mode in self._looped_modes:
                out, kept = self._alone_call(state, inputs, keyword_inputs, shared_input)
            elif self._one_by_one is not None or alone:
                out, kept = self._slot_by_slot(call, state, batched, mode)
            else:
                out, kept = self._fused(call, state, batched, mode)
        keep(self.buffers, self._leaves, kept)
        return out

    def _alone(self) -> bool:
        """Whether the array is one slot of its own shapes, which fusion cannot speed up: its forward
        then runs the template once on the slot's tensors, without vmap, so its layers run torch's own
        code as the model alone does (`_slot_loop.py`). Under vmap an array of one paid the batching
        machinery for nothing: 1.4x plain PyTorch's time per epoch (SignalNet of
        examples/custom_model.py, CPU, 1 thread; issue 43). An envelope left with one slot first drops its
        padding where it can (`_drop_padding_if_one_shape`)."""
        return len(self) == 1 and self._slots is None

    def _alone_call(self, state: dict[str, torch.Tensor], inputs, keyword_inputs, shared_input: bool):
        """`_slot_by_slot`'s result for an array of one after its first call of a mode (which
        `_slot_by_slot` watches): the same call, the template's tensor places found once."""
        if self._places is None:
            self._places = TemplatePlaces(self._template)
        args = _slot_inputs(inputs, 0, shared_input)
        keywords = dict(zip(keyword_inputs, _slot_inputs(tuple(keyword_inputs.values()), 0, shared_input)))
        out, given, replaced = self._places.call(state, args, keywords)
        kept = reassigned({name: given[name] for name in replaced}, replaced)
        return one_slot_result(out, kept, state)

    def _fused(self, call, state: dict[str, torch.Tensor], batched: tuple[Any, ...], mode: tuple[bool, bool]):
        """(outputs, buffers the forward reassigned) of one vmap call over the slots; on the first
        call of a mode, watched, and falling back to slot by slot where the forward needs it."""

        def one_slot(slot_state, *slot_inputs):
            given = dict(slot_state)
            out = call(self._template, slot_state, slot_inputs)
            return out, reassigned(given, slot_state)  # functional_call wrote reassigned buffers back

        # a tensor is split by slot (dim 0) unless shared; anything else is passed as it is
        dim = None if mode[1] else 0
        in_dims = (0, *(pytree.tree_map(lambda v: dim if isinstance(v, torch.Tensor) else None, x) for x in batched))
        fused = vmap(one_slot, in_dims=in_dims, randomness="error")
        if mode in self._checked_modes:
            return fused(state, *batched)
        self._checked_modes.add(mode)
        before = self._stateful_copy()
        try:
            return watched_first_call(fused, state, batched, self._template)
        except NeedsSlotLoop as needs:
            self._put_back(before)  # the fused attempt may have run layers before the one that needs it
            warnings.warn(
                f"{needs.what}, which one fused call cannot do for every slot: the array runs its slots one "
                "by one (exact; one forward per slot instead of one for all).",
                FusionFallbackWarning,
                stacklevel=4,
            )
            self._one_by_one = needs.what
            return self._slot_by_slot(call, state, batched, mode)

    def _slot_by_slot(self, call, state: dict[str, torch.Tensor], batched: tuple[Any, ...], mode: tuple[bool, bool]):
        """`_fused`'s result computed one slot at a time (`_slot_loop.py`); its first call of a mode watched."""
        shared_input = mode[1]

        def loop():
            split = lambda inputs, slot: _slot_inputs(inputs, slot, shared_input)  # noqa: E731
            return slots_one_by_one(self._template, state, batched, split, call, len(self))

        if mode in self._looped_modes:
            return loop()
        self._looped_modes.add(mode)
        with (
            watching_forward(self._template) as running,
            refusing_random_operations(lambda: running_layer(running, self._template)),
        ):
            return loop()

    def _stateful_copy(self) -> tuple[dict[str, torch.Tensor], Any]:
        """What a forward may change: buffers and per-slot counters (copies), and its Python state."""
        tensors = {**self.buffers, **self._slot_random}
        return {name: value.clone() for name, value in tensors.items()}, python_state(self._template)

    def _put_back(self, saved: tuple[dict[str, torch.Tensor], Any]) -> None:
        tensors, python = saved
        current = {**self.buffers, **self._slot_random}
        with torch.no_grad():
            for name, value in tensors.items():
                current[name].copy_(value)
        put_back(self._template, python)

    def _native_call(self, x: Any) -> torch.Tensor | None:
        """The template's output computed without vmap, or None where this call needs vmap
        (remembered per input shape and mode, so a refused call is not tried again).

        Layers before the one that refuses may have run already and changed
        state (BatchNorm running stats, dropout counters): on the first call
        of a kind those are saved, and put back if the call is refused, so the
        vmap path starts from the same state. Refusals depend only on shapes,
        mode and the lowering (`HFTA_NAS_LOWERING`, which a process may change
        between calls), so a call of a kind that once ran through never refuses.
        """
        if not isinstance(x, torch.Tensor) or global_hooks_set():
            return None
        key = (tuple(x.shape), x.dtype, self.training, lowering())
        if key in self._native_refused:
            return None
        stateful = {**self.buffers, **self._slot_random}
        saved = {name: value.clone() for name, value in stateful.items()} if key not in self._native_accepted else None
        try:
            out = self._native({**self._leaves, **stateful, **self._constants()}, x)
        except NeedsVmap:
            self._native_refused.add(key)
            for name, value in saved.items():
                stateful[name].copy_(value)
            return None
        self._native_accepted.add(key)
        return out

    def _constants(self) -> dict[str, torch.Tensor]:
        return self._slots.constants if self._slots is not None else {}

    # ------------------------------------------------------------- slot access
    def _check_slot(self, slot: int) -> int:
        if not isinstance(slot, int) or not -len(self) <= slot < len(self):
            raise HftaNasError(f"slot {slot!r} is out of range for an array of {len(self)} slots.")
        return slot % len(self)

    def slot_state_dict(self, slot: int) -> OrderedDict[str, torch.Tensor]:
        """A plain state_dict of one slot, loadable into a model from the same factory
        (a slot of an envelope: into its own model, with its own shapes)."""
        slot = self._check_slot(slot)
        params = self.parameters()
        result: OrderedDict[str, torch.Tensor] = OrderedDict()
        if self._slots is not None:
            return self._slots.state_dict(slot, params, self.buffers)
        for key in self._state_keys:
            if key in self._param_aliases:
                result[key] = params[self._param_aliases[key]][slot].detach().clone()
            else:
                result[key] = self.buffers[key][slot].clone()
        return result

    def load_slot(self, slot: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Overwrite one slot's parameters and buffers from a plain state_dict (of its own model)."""
        slot = self._check_slot(slot)
        if self._slots is not None:
            self._slots.load(slot, state_dict, flat=self.flat, array_buffers=self.buffers)
            return
        missing = [k for k in self._state_keys if k not in state_dict]
        unexpected = [k for k in state_dict if k not in self._state_keys]
        if missing or unexpected:
            raise HftaNasError(
                f"state_dict does not match the array's model: missing keys {missing}, unexpected keys {unexpected}."
            )
        params = self._layout.views(self.flat.detach())
        with torch.no_grad():
            for key in self._state_keys:
                value = as_tensor(key, state_dict[key])
                target = (
                    params[self._param_aliases[key]][slot] if key in self._param_aliases else self.buffers[key][slot]
                )
                if value.shape != target.shape:
                    raise FusionError(
                        f"'{key}' has shape {list(value.shape)} but the array expects {list(target.shape)}."
                    )
                target.copy_(value)

    def numeric_state(self) -> dict[str, Any]:
        """Every number the array trains or counts (weights, buffers, dropout seeds and call
        counters), for a checkpoint; the structure (slots, envelope) is rebuilt by the caller."""
        cpu = lambda t: t.detach().to("cpu", copy=True)  # noqa: E731 - a checkpoint takes no device memory
        return {
            "flat": cpu(self.flat),
            "buffers": {k: cpu(v) for k, v in self.buffers.items()},
            "slot_random": {k: cpu(v) for k, v in self._slot_random.items()},
            "dropout_seeds": cpu(self.dropout_seeds),
        }

    def load_numeric_state(self, state: Mapping[str, Any]) -> None:
        """Put back `numeric_state()` of an array of the same structure (HftaNasError if not)."""
        targets = {
            "flat": self.flat.detach(),
            "dropout_seeds": self.dropout_seeds,
            **{f"buffers.{k}": v for k, v in self.buffers.items()},
            **{f"slot_random.{k}": v for k, v in self._slot_random.items()},
        }
        sources = {
            "flat": state["flat"],
            "dropout_seeds": state["dropout_seeds"],
            **{f"buffers.{k}": v for k, v in state["buffers"].items()},
            **{f"slot_random.{k}": v for k, v in state["slot_random"].items()},
        }
        if targets.keys() != sources.keys() or any(targets[k].shape != sources[k].shape for k in targets):
            raise HftaNasError("the saved array state does not match this array's slots and tensors.")
        with torch.no_grad():
            for name, target in targets.items():
                target.copy_(sources[name])
        self._sync_dropout_p()  # rates put back: the layers that skip their masks follow
        # A slot not yet checked against its own model is checked with the weights it has now.
        for slot, model in self._slots.unverified.items() if self._slots is not None else ():
            model.to(self.dtype).load_state_dict(self.slot_state_dict(slot))

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
        if self._slots is not None:
            self._slots.keep_rows(keep, index)
            self._slots.sync_conv_boxes(self._template)
        self._bind_leaves()
        self.buffers = {name: value.index_select(0, index) for name, value in self.buffers.items()}
        self._slot_random = {name: value.index_select(0, index) for name, value in self._slot_random.items()}
        self.dropout_seeds = self.dropout_seeds.index_select(0, index)
        for listener in self._listeners:
            listener.keep_slots(keep)
        self._drop_padding_if_one_shape()
        return keep

    def _drop_padding_if_one_shape(self) -> None:
        """An envelope whose slots now share their shapes becomes an array of those shapes, every
        number moved over (`_unpad.py`); where that cannot be exact, it keeps its padding."""
        if self._slots is None or self._refusal is not None or self.has_slot_dropout_rates():
            return
        if keeps_unsaved_buffers(self.buffers, self._state_keys):
            return
        models = own_models(self._slots, [self.slot_state_dict(slot) for slot in range(len(self))])
        if models is None:
            return
        try:
            plain = ModelArray(models, dropout_seeds=self.dropout_seeds.tolist(), device=self.device, dtype=self.dtype)
        except (FusionError, torch.OutOfMemoryError):  # other settings at equal shapes; no room for both
            return
        counters = own_counters(self._slots, self._slot_random, plain._slot_random)
        if counters is None:
            return
        convert = own_rows(self._slots, self._layout, plain._layout)
        plain._slot_random = counters
        carry_python_state(self._template, self._initial_python, self._slots, plain._template)
        self._become(plain)
        for listener in self._listeners:
            relayout = getattr(listener, "relayout", None)
            if relayout is not None:
                relayout(convert)

    def _become(self, other: ModelArray) -> None:
        """Take `other`'s structure and numbers; keep what is attached, the running-check setting and
        the mode (those hold on to this object)."""
        training, listeners, recheck = self.training, self._listeners, self._recheck_every
        self.__dict__.update(other.__dict__)
        self._listeners, self._recheck_every = listeners, recheck
        self.train(training)

    def replace_slot(self, slot: int, model: nn.Module, *, dropout_seed: int | None = None) -> None:
        """Put a fresh model into `slot`: its weights and buffers, a new dropout
        stream, and fresh optimizer state / schedule position in everything attached."""
        slot = self._check_slot(slot)
        if not isinstance(model, nn.Module):
            raise HftaNasError(f"replace_slot needs a torch.nn.Module, got {type(model).__name__}.")
        refuse_frozen([model])
        emb = self._placement(model, slot)
        if emb is None:
            self.load_slot(slot, model.state_dict())
        else:
            self._slots.put(slot, emb, model, flat=self.flat, array_buffers=self.buffers)
            self._slots.sync_conv_boxes(self._template)
        seed = _per_slot_ints([slot if dropout_seed is None else dropout_seed], 1, "dropout_seed")[0]
        self.dropout_seeds[slot] = seed
        own_modules = None if self._slots is None else [self._slots.embeddings[slot].modules]
        fresh = init_slot_randomness(self._template, self.dropout_seeds[slot : slot + 1], own_modules)
        for name, value in fresh.items():
            self._slot_random[name][slot] = value[0]
        for listener in self._listeners:
            listener.reset_slot(slot)

    def use_slot_dropout_rates(self) -> None:
        """Give every dropout layer a rate per slot, starting at its own, which `set_dropout_rate` changes
        for one slot (population-based training explores it). Call it before `load_numeric_state` of an
        array that had them. Arrays of different sizes have per-slot rates of their own and are refused."""
        if self._slots is not None:
            raise FusionError("per-slot dropout rates to explore need an array of one architecture (equal shapes).")
        for path, module in self._template.named_modules():
            if isinstance(module, SlotDropout) and not module.per_slot_rate:
                module.use_slot_rates()
                name = f"{path}.rate" if path else "rate"
                self._slot_random[name] = torch.full((len(self),), module.p, dtype=torch.float64, device=self.device)

    def _rate_names(self) -> list[str]:
        return [name for name in self._slot_random if name == "rate" or name.endswith(".rate")]

    def has_slot_dropout_rates(self) -> bool:
        """Whether `use_slot_dropout_rates` gave this array's dropout layers a rate per slot."""
        return bool(self._rate_names())

    def _rate_names_given(self) -> list[str]:
        """`_rate_names`, or HftaNasError when there are none to read or set."""
        names = self._rate_names()
        if not names:
            raise HftaNasError(
                "this array has no per-slot dropout rates (a dropout layer, and use_slot_dropout_rates)."
            )
        return names

    def dropout_rate(self, slot: int) -> float:
        """The dropout rate of slot `slot` (after `use_slot_dropout_rates`): one rate for all its dropout
        layers, as `set_dropout_rate` sets it; HftaNasError when its layers have different rates."""
        names = self._rate_names_given()
        rates = sorted({float(self._slot_random[name][self._check_slot(slot)]) for name in names})
        if len(rates) > 1:
            raise HftaNasError(
                f"slot {slot}'s dropout layers have different rates {rates}; a slot's dropout rate is one "
                "rate for all its layers (build the model with one rate to change it per slot)."
            )
        return rates[0]

    def set_dropout_rate(self, slot: int, rate: float) -> None:
        """Every dropout layer of slot `slot` drops with probability `rate` from its next training call
        on, as the slot's model built with that rate would; no other slot changes."""
        slot, names = self._check_slot(slot), self._rate_names_given()
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
            raise HftaNasError(f"a dropout rate must be in [0, 1), got {rate!r}.")
        for name in names:
            self._slot_random[name][slot] = float(rate)
        self._sync_dropout_p()

    def _sync_dropout_p(self) -> None:
        """Each per-slot-rate layer's `p` is its largest slot rate: a layer whose slots all have rate 0
        skips its mask (SlotDropout.forward), one where some slot drops must not."""
        modules = dict(self._template.named_modules())
        for name in self._rate_names():
            modules[name.removesuffix("rate").removesuffix(".")].p = float(self._slot_random[name].max())

    def copy_slot(self, source: int, target: int) -> None:
        """Make slot `target` a copy of slot `source`: weights, buffers, dropout seed and dropout
        call counters (so it draws the masks the source would draw), and in everything attached
        the optimizer state, hyper-parameters and schedule position. No other slot is touched.
        Population-based training's exploit: one indexed copy per tensor, nothing leaves the device."""
        source, target = self._check_slot(source), self._check_slot(target)
        if self._slots is not None:
            raise FusionError(
                "copy_slot needs an array of equal shapes; this one pads models of different sizes into an "
                "envelope, where one slot's tensors do not fit another's place"
            )
        with torch.no_grad():
            for tensor in (self.flat.detach(), *self.buffers.values(), *self._slot_random.values(), self.dropout_seeds):
                tensor[target] = tensor[source]
        for listener in self._listeners:
            listener.copy_slot(source, target)


def _slot_inputs(inputs: tuple[Any, ...], slot: int, shared_input: bool) -> tuple[Any, ...]:
    """One slot's share of a call's inputs: every tensor in them (dicts and tuples too) cut at `slot`."""
    if shared_input:
        return inputs
    return pytree.tree_map(lambda x: x[slot] if isinstance(x, torch.Tensor) else x, inputs)


def _build_seeded(factory: Callable[[], nn.Module], seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = factory()
    if not isinstance(model, nn.Module):
        raise HftaNasError(f"the model factory returned a {type(model).__name__}, not a torch.nn.Module.")
    return model
