"""The array's forward one slot at a time, for forwards vmap cannot run for all slots at once.

A forward that branches on a tensor's value (`if x.mean() > 0:`) or reads one
(`.item()`) takes a path per slot, which one fused call cannot. Running the template
once per slot, on that slot's view of every stacked tensor, computes exactly what each
slot's own model computes: the parameters' views carry gradients back into `flat`,
in-place buffer updates land in the slot's row, dropout draws from the slot's own
counters, and buffers the forward reassigns are gathered like the fused path's. It
costs one forward per slot instead of one for all.

vmap refuses random operations outside the array's dropout layers; a plain loop would
draw them from torch's global generator, shared by the slots, so the first call of a
loop refuses them too (`refusing_random_operations`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.func import functional_call
from torch.overrides import TorchFunctionMode

from hfta_nas.array._reassigned import reassigned
from hfta_nas.errors import FusionError

# Functions that draw from torch's global generator (and, for dropout, only when training).
_RANDOM = frozenset(
    {
        "rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm", "bernoulli",
        "multinomial", "normal", "poisson", "uniform_", "normal_", "bernoulli_", "exponential_", "random_",
        "cauchy_", "log_normal_", "geometric_",
    }
)  # fmt: skip
_DROPOUT = frozenset({"dropout", "alpha_dropout", "feature_dropout", "feature_alpha_dropout"})


def slots_one_by_one(
    template: nn.Module,
    state: dict[str, torch.Tensor],
    inputs: tuple[Any, ...],
    split: Callable[[Any, int], Any],
    call: Callable[[nn.Module, dict[str, torch.Tensor], tuple[Any, ...]], Any],
    slots: int,
) -> tuple[Any, dict[str, torch.Tensor]]:
    """(outputs stacked [B, ...], buffers the forward reassigned stacked [B, ...]): `call(template,
    slot_state, slot_inputs)` for each slot, `split(inputs, slot)` giving a slot's inputs."""
    outputs, kept = [], []
    for slot in range(slots):
        slot_state = {name: value[slot] for name, value in state.items()}
        given = dict(slot_state)
        outputs.append(call(template, slot_state, split(inputs, slot)))
        kept.append(reassigned(given, slot_state))
    return _stacked(outputs), _stacked_buffers(kept, state)


def one_slot_result(
    output: Any, kept: dict[str, torch.Tensor], state: dict[str, torch.Tensor]
) -> tuple[Any, dict[str, torch.Tensor]]:
    """`slots_one_by_one`'s result for one slot that returned `output` and reassigned `kept`."""
    return _stacked([output]), _stacked_buffers([kept], state)


def call_template(count: int, names: list[str]) -> Callable[[nn.Module, dict[str, torch.Tensor], tuple[Any, ...]], Any]:
    """A `call` for `slots_one_by_one`: the first `count` inputs positional, the rest keyword `names`."""

    def call(module: nn.Module, state: dict[str, torch.Tensor], slot_inputs: tuple[Any, ...]) -> Any:
        return functional_call(
            module, state, slot_inputs[:count], dict(zip(names, slot_inputs[count:])), tie_weights=True
        )

    return call


def _stacked(outputs: list[Any]) -> Any:
    leaves, spec = pytree.tree_flatten(outputs[0])
    per_slot = [leaves]
    for slot, output in enumerate(outputs[1:], start=1):
        slot_leaves, slot_spec = pytree.tree_flatten(output)
        if slot_spec != spec:
            raise FusionError(
                f"slot {slot}'s forward returned another structure than slot 0's; an array stacks its slots' "
                "outputs, so every slot must return the same structure"
            )
        per_slot.append(slot_leaves)
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            raise FusionError(
                f"the model's forward returns a {type(leaf).__name__}; an array's outputs are stacked per "
                "slot, so return only tensors"
            )
    for column in zip(*per_slot):
        slot = next((s for s, t in enumerate(column) if t.shape != column[0].shape), None)
        if slot is not None:
            raise FusionError(
                f"the model's output has shape {list(column[slot].shape)} in slot {slot} but "
                f"{list(column[0].shape)} in slot 0 (it depends on the data); an array stacks equal shapes"
            )
    return pytree.tree_unflatten([torch.stack(column) for column in zip(*per_slot)], spec)


def _stacked_buffers(kept: list[dict[str, torch.Tensor]], state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each buffer some slot reassigned, [B, ...]: a slot that did not keeps its own row."""
    names = {name for slot_kept in kept for name in slot_kept}
    return {
        name: torch.stack([slot_kept.get(name, state[name][slot]) for slot, slot_kept in enumerate(kept)])
        for name in sorted(names)
    }


@contextlib.contextmanager
def refusing_random_operations(where: Callable[[], str]) -> Iterator[None]:
    """While the block runs, a random operation raises a FusionError naming `where()` (the layer)."""
    with _RefuseRandom(where):
        yield


class _RefuseRandom(TorchFunctionMode):
    def __init__(self, where: Callable[[], str]) -> None:
        super().__init__()
        self.where = where

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _RANDOM or (name in _DROPOUT and _dropping(args, kwargs)):
            raise FusionError(
                f"{self.where()} calls a random operation ({name}); inside an array randomness must come "
                "from nn.Dropout modules, so that each slot uses its own seed"
            )
        return func(*args, **kwargs)


def _dropping(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a functional dropout call drops anything: p > 0 in training (torch.dropout(x, p, train))."""
    p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
    train = kwargs.get("train", kwargs.get("training", args[2] if len(args) > 2 else True))
    return bool(train) and p > 0
