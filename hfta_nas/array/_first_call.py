"""An array's first forward of a kind, watched: torch's fusion failures turned into messages that name the cause.

vmap falls back to a loop over slots (exact, slower) where an operator has no
batching rule, and refuses what a forward cannot do for many slots at once: random
operations outside the array's own dropout layers, `requires_grad_()`, reading
`.data`, outputs that are not tensors, and packed sequences (`pack_padded_sequence`).
These surface here, once per mode, as a FusionFallbackWarning or a FusionError that
names the layer whose forward was running.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn
from torch.overrides import TorchFunctionMode

from hfta_nas.errors import FusionError, FusionFallbackWarning

# (words of torch's error, what the forward did, what to do instead)
_REFUSALS = (
    (
        "random operation",
        "calls a random operation (e.g. F.dropout or torch.rand)",
        "inside an array randomness must come from nn.Dropout modules so each slot uses its own seed",
    ),
    (
        "requires_grad_()",
        "calls requires_grad_()",
        "an array takes every slot's gradients at once, so a forward may not switch them on: remove the call "
        "(parameters already require grad; for an input's gradient use torch.func outside the model)",
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


def watched_first_call(fused: Callable[..., Any], state: dict, inputs: tuple, template: nn.Module) -> Any:
    """`fused(state, *inputs)`, with vmap's per-slot-loop fallbacks and what a fused forward
    cannot do reported (the latter as a FusionError naming the layer of `template` that ran)."""
    with warnings.catch_warnings(record=True) as caught, refusing_packed_sequences(template) as running:
        warnings.simplefilter("always")
        try:
            result = fused(state, *inputs)
        except (RuntimeError, ValueError) as error:
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
    return result


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
                f"{_where(self.running, self.template)} packs sequences (pack_padded_sequence), which an array "
                "cannot run: a packed batch's shape depends on each slot's lengths; pass the padded batch to "
                "the recurrent layer and take each sequence's output at its own last step (out[i, lengths[i] - 1])."
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
                where = _where(running, template)
            return FusionError(f"{where} {what}; {instead}.")
    return None


def _where(running: list[str], template: nn.Module) -> str:
    """The layer whose forward is running, in words."""
    if running and running[-1]:
        return f"layer '{running[-1]}' ({type(template.get_submodule(running[-1])).__name__})"
    return f"the model's own forward ({type(template).__name__})"
