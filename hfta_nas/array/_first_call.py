"""An array's first forward of a kind, watched: torch's fusion failures turned into messages that name the cause.

vmap falls back to a loop over slots (exact, slower) where an operator has no
batching rule, and refuses what a forward cannot do for many slots at once: random
operations outside the array's own dropout layers, `requires_grad_()`, reading
`.data`, and outputs that are not tensors. These surface here, once per mode, as a
FusionFallbackWarning or a FusionError that names the layer whose forward was running.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from torch import nn

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
    running: list[str] = []  # paths of the modules whose forward is running, innermost last
    handles = _track_forwards(template, running)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = fused(state, *inputs)
        except (RuntimeError, ValueError) as error:
            refusal = _refusal(error, running, template)
            if refusal is None:
                raise
            raise refusal from error
        finally:
            for handle in handles:
                handle.remove()
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
            elif running and running[-1]:
                where = f"layer '{running[-1]}' ({type(template.get_submodule(running[-1])).__name__})"
            else:
                where = f"the model's own forward ({type(template).__name__})"
            return FusionError(f"{where} {what}; {instead}.")
    return None
