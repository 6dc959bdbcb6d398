"""An array of one slot calls its template on the slot's own tensors, placed without `functional_call`.

`functional_call` finds, unties and swaps every tensor of the template on each call: about
0.07 ms per module and 6% of a small 2-D CNN's training step on one CPU thread (issue 43),
where an array of one must cost what its model alone costs. An array of one calls its template
the same way every time, so `TemplatePlaces` finds where each tensor goes once (tied names
included) and per call only puts the slot's tensors there and puts the template's back.

What it puts there is what `functional_call` was given: each tensor's view at slot 0 (the
parameters' views of the array's [1, ...] leaves, so gradients reach `flat.grad` through the
same leaves, and buffers' views, so in-place updates land in the array); a buffer the forward
reassigns is handed back, to be kept by the array.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


class TemplatePlaces:
    """Where each of the template's tensors sits: the module's `_parameters` or `_buffers` dict and
    the attribute, under every name (tied tensors under each of theirs), found once."""

    def __init__(self, template: nn.Module) -> None:
        self.template = template
        self.by_name = _places(template)

    def call(
        self, state: Mapping[str, torch.Tensor], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, dict[str, torch.Tensor], dict[str, Any]]:
        """(the template's output with each of `state`'s [1, ...] tensors' slot 0 in its places, the
        views given, name -> what the forward left in a place it reassigned). The template's own
        tensors are back in their places afterwards, whatever the forward raised."""
        if any(name not in self.by_name for name in state):  # a buffer registered since (per-slot dropout rates)
            self.by_name = _places(self.template)
        given = {name: value[0] for name, value in state.items() if name in self.by_name}
        filled, saved = [], []
        for name, tensor in given.items():
            for owner, attr in self.by_name[name]:
                filled.append((owner, attr, name))
                saved.append(owner[attr])
                owner[attr] = tensor
        replaced: dict[str, Any] = {}
        try:
            out = self.template(*args, **kwargs)
        finally:
            for (owner, attr, name), original in zip(filled, saved):
                now = owner.get(attr)
                if now is not given[name]:
                    replaced[name] = now
                owner[attr] = original
        return out, given, replaced


def _places(template: nn.Module) -> dict[str, list[tuple[dict[str, Any], str]]]:
    """Every tensor name of the template -> the (module's `_parameters` or `_buffers` dict, attribute)
    places that hold that tensor (a tied tensor's places under each of its names)."""
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
