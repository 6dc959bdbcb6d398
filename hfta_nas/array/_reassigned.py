"""Buffers a forward reassigns (`self.ema = 0.9 * self.ema + 0.1 * x.mean(0)`), carried like parameters.

`functional_call` swaps the array's tensors into the template for one call and, when
the call ends, writes every tensor the forward put in their place back into the dict it
was given. Inside `vmap` that dict is vmap's own, lost when the call returns, so the
fused forward hands the reassigned tensors out as outputs and the array keeps them as its
buffers: the next call reads them, as the model alone would. In-place updates
(`self.ema.mul_(0.9)`, BatchNorm's running stats) need none of this.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hfta_nas.errors import FusionError


def reassigned(given: Mapping[str, torch.Tensor], after: Mapping[str, object]) -> dict[str, torch.Tensor]:
    """The entries of `after` (the dict functional_call was given, after the call) that the forward
    replaced: `given` holds what it held before. A tensor set to something else is refused by name."""
    changed = {}
    for name, before in given.items():
        value = after.get(name)
        if value is before:
            continue
        if not isinstance(value, torch.Tensor):
            raise FusionError(
                f"{_owner(name)} sets '{name}' to {type(value).__name__} in forward; an array keeps it as a "
                "tensor per slot: assign a tensor of the same shape"
            )
        changed[name] = value
    return changed


def keep(buffers: dict[str, torch.Tensor], parameters: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor]):
    """Store the [B, ...] tensors a forward reassigned as the array's buffers (in `buffers`, in place);
    FusionError by name for what no model alone could go on with either."""
    for name, value in new.items():
        if name not in buffers:
            kind = "parameter" if name in parameters else "per-slot state"
            raise FusionError(
                f"{_owner(name)} reassigns its {kind} '{name}' in forward; an array trains parameters in "
                "place: compute the new value into a local variable instead"
            )
        old = buffers[name]
        if value.shape != old.shape:
            raise FusionError(
                f"{_owner(name)} reassigns buffer '{name}' with shape {list(value.shape[1:])} instead of "
                f"{list(old.shape[1:])}; an array keeps one shape per buffer: keep its shape"
            )
        if value.requires_grad:
            raise FusionError(
                f"{_owner(name)} reassigns buffer '{name}' to a tensor with a gradient history, which the "
                "next backward cannot pass (the model alone fails too): assign .detach() or use torch.no_grad()"
            )
        buffers[name] = value.contiguous()  # vmap may give a broadcast view; later slot surgery writes rows


def _owner(name: str) -> str:
    path = name.rpartition(".")[0]
    return f"layer '{path}'" if path else "the model's own forward"
