"""An array of one slot calls its template on the slot's own tensors, placed without `functional_call`.

`functional_call` finds, unties and swaps every tensor of the template on each call: about
0.07 ms per module and 6% of a small 2-D CNN's training step on one CPU thread (issue 43),
where an array of one must cost what its model alone costs. An array of one calls its template
the same way every time, so `AloneBinding` finds where each tensor goes once (tied names
included) and per call only puts the slot's tensors there and puts the template's back.

The slot's parameters are autograd leaves of their own: views of `flat`'s one row without the
slot dim, whose `.grad` are views of `flat.grad`'s row. Backward accumulates into the array's
gradient as the [1, ...] leaves' would, without a select node per parameter. Buffers are views
of the array's [1, ...] buffers, so in-place updates (BatchNorm's running stats, dropout
counters) land in the array; a buffer the forward reassigns is handed back like
`functional_call`'s, to be kept by the array.

A binding holds on to the tensors it was made from; the array makes a new one when any of them
was replaced (slot surgery, a resumed state, a reassigned buffer, a new `flat.grad`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


class AloneBinding:
    """The template's tensor places, filled with one slot's tensors for each call."""

    def __init__(
        self,
        template: nn.Module,
        state: Mapping[str, torch.Tensor],
        parameter_names: set[str],
        grad_base: torch.Tensor,
        grad_rows: Mapping[str, torch.Tensor],
    ) -> None:
        """`state`: name -> [1, ...] tensor (parameters' leaves, buffers, per-slot random state);
        `grad_base`: the array's `flat.grad`, of which `grad_rows` are each parameter's [1, ...] view."""
        self.sources, self.grad_base = dict(state), grad_base
        self.given: dict[str, torch.Tensor] = {}
        self.bound_grads: dict[str, torch.Tensor] = {}
        for name, value in state.items():
            if name in parameter_names:
                leaf = value.detach()[0].requires_grad_()
                leaf.grad = self.bound_grads[name] = grad_rows[name][0]
                self.given[name] = leaf
            else:
                self.given[name] = value[0]
        places = _places(template)
        self.places = [(owner, attr, name) for name in self.given for owner, attr in places.get(name, ())]

    def still_fits(self, state: Mapping[str, torch.Tensor], grad_base: torch.Tensor | None) -> bool:
        """Whether every tensor it was made from is still the array's (by identity)."""
        if grad_base is not self.grad_base or len(state) != len(self.sources):
            return False
        return all(self.sources.get(name) is value for name, value in state.items())

    def call(self, template: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """(the template's output on the slot's tensors, name -> what the forward left in a place it
        reassigned); the template's own tensors are back in their places afterwards, whatever the
        forward raised."""
        saved = []
        for owner, attr, name in self.places:
            saved.append(owner[attr])
            owner[attr] = self.given[name]
        replaced: dict[str, Any] = {}
        try:
            out = template(*args, **kwargs)
        finally:
            for (owner, attr, name), original in zip(self.places, saved):
                now = owner.get(attr)
                if now is not self.given[name]:
                    replaced[name] = now
                owner[attr] = original
        return out, replaced

    def moved_gradients(self) -> dict[str, torch.Tensor | None]:
        """Parameters whose `.grad` is no longer the view of `flat.grad` it was bound to (set to None,
        or rebuilt out of place by a create_graph backward): name -> that gradient."""
        current = {name: self.given[name].grad for name in self.bound_grads}
        return {name: grad for name, grad in current.items() if grad is not self.bound_grads[name]}


def _places(template: nn.Module) -> dict[str, list[tuple[dict[str, Any], str]]]:
    """Every tensor name of the template (tied names under each of their names) -> the
    (module's `_parameters` or `_buffers` dict, attribute) places that hold that tensor."""
    by_tensor: dict[int, list[tuple[dict[str, Any], str]]] = {}
    names: dict[str, int] = {}
    for kind, named in (
        ("_parameters", template.named_parameters(remove_duplicate=False)),
        ("_buffers", template.named_buffers(remove_duplicate=False)),
    ):
        for name, tensor in named:
            prefix, _, attr = name.rpartition(".")
            owner = getattr(template.get_submodule(prefix), kind)
            by_tensor.setdefault(id(tensor), []).append((owner, attr))
            names[name] = id(tensor)
    return {name: by_tensor[key] for name, key in names.items()}
