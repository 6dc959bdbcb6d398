"""An array's first forward of a kind, watched: torch's fusion failures turned into messages that name the cause.

vmap falls back to a loop over slots (exact, slower) where an operator has no
batching rule, and refuses what a forward cannot do for many slots at once: random
operations outside the array's own dropout layers, `requires_grad_()` on a tensor the
slots compute, reading `.data`, outputs that are not tensors, and packed sequences
(`pack_padded_sequence`). These surface here, once per mode, as a FusionFallbackWarning
or a FusionError that names the layer whose forward was running.

`requires_grad_()` on a fresh constant (`torch.zeros(...).requires_grad_()` for an LSTM's
h0, the habit of many published models) is accepted as the no-op it is: the constant's
own gradient is never read, and every parameter's gradient is the same with or without
it. vmap refuses the call whatever the tensor, so a TorchFunctionMode skips it; once a
first call has skipped one, hooks on the template keep the mode on for its later calls.

What a forward does per slot that vmap cannot batch (a branch on a tensor's value,
`.item()`, shapes that depend on the data) raises `NeedsSlotLoop`: the array then runs
its slots one by one (`_slot_loop.py`), exact and slower. Activation checkpointing is
refused by name wherever it runs: its backward re-runs the forward after the array has
taken its per-slot tensors out of the template, with the template's own weights.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch import nn
from torch._C._functorch import is_functorch_wrapped_tensor
from torch.overrides import TorchFunctionMode

from hfta_nas.errors import FusionError, FusionFallbackWarning

# (words of torch's error, what the forward did, what to do instead)
_REFUSALS = (
    (
        "random operation",
        "calls a random operation (F.dropout, torch.rand, ...)",
        "inside an array randomness must come from nn.Dropout modules, so that each slot uses its own seed",
    ),
    (
        "requires_grad_()",
        "calls requires_grad_() on a tensor the slots compute",
        "an array takes every slot's gradients at once: remove the call (parameters already require grad)",
    ),
    (
        "accessing `data` under vmap",
        "reads a tensor's .data",
        "use the tensor itself, or .detach() for a copy without gradient",
    ),
    (
        "must only return Tensors",
        "returns something other than tensors (None in a tuple, say)",
        "an array's outputs are stacked per slot, so return only tensors",
    ),
)


# (words of vmap's error, what the forward did): per-slot work a slot-by-slot loop runs exactly
_PER_SLOT = (
    ("data-dependent control flow", "branches on a tensor's value"),
    ("calling .item()", "reads a tensor's value (.item(), float(), int())"),
    ("dynamic shape", "makes shapes that depend on the data"),
    ("differently shaped Tensor", "makes shapes that depend on the data"),
)


class NeedsSlotLoop(Exception):
    """The forward does per slot what one fused call cannot (`what`, naming the layer): run slots one by one."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


def watched_first_call(fused: Callable[..., Any], state: dict, inputs: tuple, template: nn.Module) -> Any:
    """`fused(state, *inputs)`, with vmap's per-slot-loop fallbacks and what a fused forward
    cannot do reported (the latter as a FusionError naming the layer of `template` that ran;
    per-slot control flow as NeedsSlotLoop)."""
    with (
        warnings.catch_warnings(record=True) as caught,
        watching_forward(template) as running,
        _SkipFreshRequiresGrad() as fresh,
    ):
        warnings.simplefilter("always")
        try:
            result = fused(state, *inputs)
        except (RuntimeError, ValueError) as error:
            for words, what in _PER_SLOT:
                if words in str(error):
                    raise NeedsSlotLoop(f"{running_layer(running, template)} {what}") from error
            refusal = _refusal(error, running, template)
            if refusal is None:
                raise
            raise refusal from error
    for warning in caught:
        message = str(warning.message)
        if "performance drop" in message:
            operator = (
                message.split("batching rule for ")[-1].split(".")[0]
                if "batching rule for " in message
                else "an operator"
            )
            warnings.warn(
                f"{operator} has no fused (vmap) implementation: the array runs it as a loop over slots. "
                "Results are exact; only speed suffers.",
                FusionFallbackWarning,
                stacklevel=3,
            )
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    if fresh.skipped:
        _keep_skipping_fresh_requires_grad(template)
    return result


class _SkipFreshRequiresGrad(TorchFunctionMode):
    """`t.requires_grad_()` as a no-op where `t` is a fresh constant of the forward (made inside it:
    not a slot's tensor, not a parameter, no gradient history); any other tensor's call goes on
    to vmap, which refuses it (a FusionError naming the layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.skipped = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.requires_grad_ and args and _fresh_constant(args[0]):
            self.skipped = True
            return args[0]
        return func(*args, **(kwargs or {}))


def _fresh_constant(tensor: Any) -> bool:
    return (
        isinstance(tensor, torch.Tensor)
        and not isinstance(tensor, nn.Parameter)
        and not is_functorch_wrapped_tensor(tensor)  # a slot's own (batched) tensor
        and tensor.grad_fn is None
    )


def _keep_skipping_fresh_requires_grad(template: nn.Module) -> None:
    """Every later forward of `template` (the array's fused calls after the first) runs under the mode too:
    entered by a forward pre-hook, left by a forward hook that runs even when the forward raises."""
    if any(isinstance(getattr(hook, "__self__", None), _Skipping) for hook in template._forward_pre_hooks.values()):
        return
    skipping = _Skipping()
    template.register_forward_pre_hook(skipping.enter)
    template.register_forward_hook(skipping.leave, always_call=True)


class _Skipping:
    """The hooks' pair: a mode entered as the template's forward starts, left as it ends (a class, not
    closures, so that the template still pickles)."""

    def __init__(self) -> None:
        self.entered: list[_SkipFreshRequiresGrad] = []  # the modes of the template's forwards now running

    def enter(self, module: nn.Module, args: Any) -> None:
        mode = _SkipFreshRequiresGrad()
        mode.__enter__()
        self.entered.append(mode)

    def leave(self, module: nn.Module, args: Any, output: Any) -> None:
        self.entered.pop().__exit__(None, None, None)


@contextlib.contextmanager
def watching_forward(template: nn.Module) -> Iterator[list[str]]:
    """While the block runs, what no array can run is refused by name: packed sequences in `template`'s
    layers, activation checkpointing anywhere. Yields the paths of `template`'s running modules."""
    with refusing_packed_sequences(template) as running, refusing_checkpoints(lambda: running_layer(running, template)):
        yield running


@contextlib.contextmanager
def refusing_checkpoints(where: Callable[[], str]) -> Iterator[None]:
    """While the block runs, torch.utils.checkpoint (either form) raises a FusionError naming `where()`.
    Both forms are looked up at call time through the module's names, which this swaps for the block."""
    entries = ("CheckpointFunction", "_checkpoint_without_reentrant_generator")
    names = [name for name in entries if hasattr(torch_checkpoint, name)]
    saved = {name: getattr(torch_checkpoint, name) for name in names}

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise FusionError(
            f"{where()} uses torch.utils.checkpoint, whose backward re-runs the forward without the array's "
            "per-slot weights: remove the checkpoint, or train the model alone"
        )

    stand_in = type("RefusedCheckpoint", (), {"apply": staticmethod(refuse)})
    try:
        for name in names:
            setattr(torch_checkpoint, name, stand_in if name == "CheckpointFunction" else refuse)
        yield
    finally:
        for name, value in saved.items():
            setattr(torch_checkpoint, name, value)


@contextlib.contextmanager
def refusing_packed_sequences(template: nn.Module) -> Iterator[list[str]]:
    """While `template`'s modules run, packing sequences raises a FusionError naming the layer.
    Yields the paths of the template's modules whose forward is running, innermost last."""
    running: list[str] = []
    handles = _track_forwards(template, running)
    try:
        with _RefusePacking(template, running):
            yield running
    finally:
        for handle in handles:
            handle.remove()


class _RefusePacking(TorchFunctionMode):
    """A PackedSequence holds each slot's sequences as one tensor whose length is the sum of that
    slot's lengths: the slots' shapes differ, so no array can run them as one tensor (vmap fails
    deep inside with a message about stacking). Refused where the packing happens, by layer."""

    def __init__(self, template: nn.Module, running: list[str]) -> None:
        super().__init__()
        self.template, self.running = template, running

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # `running` is empty while anything but the template runs (the probe's own model packs freely).
        if self.running and getattr(func, "__name__", None) == "_pack_padded_sequence":
            raise FusionError(
                f"{running_layer(self.running, self.template)} packs sequences, whose shapes differ per slot: pass "
                "the padded batch and take each sequence's output at its last step (out[i, lengths[i] - 1])"
            )
        return func(*args, **(kwargs or {}))


def _track_forwards(template: nn.Module, running: list[str]) -> list[Any]:
    def entered(path):
        return lambda module, args: running.append(path)

    def left(module, args, output):
        running.pop()

    handles = []
    for path, module in template.named_modules():
        handles.append(module.register_forward_pre_hook(entered(path)))
        handles.append(module.register_forward_hook(left))
    return handles


def _refusal(error: Exception, running: list[str], template: nn.Module) -> FusionError | None:
    """A FusionError for a known failure of a fused forward, naming where it happened."""
    text = str(error)
    for words, what, instead in _REFUSALS:
        if words in text:
            if words == "must only return Tensors":
                where = f"the model's forward ({type(template).__name__})"
            else:
                where = running_layer(running, template)
            return FusionError(f"{where} {what}; {instead}.")
    return None


def running_layer(running: list[str], template: nn.Module) -> str:
    """The layer whose forward is running, in words."""
    if running and running[-1]:
        return f"layer '{running[-1]}' ({type(template.get_submodule(running[-1])).__name__})"
    return f"the model's own forward ({type(template).__name__})"
