"""An array's first forward of a kind, watched: torch's fusion failures turned into messages that name the cause.

vmap falls back to a loop over slots (exact, slower) where an operator has no
batching rule, and refuses random operations outside the array's own dropout
layers; both surface here, once per mode, as a FusionFallbackWarning or a
FusionError a user can act on.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from hfta_nas.errors import FusionError, FusionFallbackWarning


def watched_first_call(fused: Callable[..., Any], state: dict, inputs: tuple) -> Any:
    """`fused(state, *inputs)`, with vmap's per-slot-loop fallbacks and un-fusable random ops reported."""
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
