"""What lets models share one array: equal tensors and module trees, or one envelope.

`FusionSignature` is slot 0's description that every other slot must match
for an array of equal shapes; `check_fusable` falls back to the envelope of
models of one structure and different sizes (FusionError naming the layer
when there is none); `refuse_frozen` refuses parameters an array would train
although their model froze them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from hfta_nas.envelope._merge import cut, same_setting, settings_of, shown_value
from hfta_nas.envelope._template import Envelope
from hfta_nas.errors import FusionError


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
        refuse_hooked_weights(model)
        self.tensors = _describe_tensors(model)
        self.structure = repr(model).splitlines()
        self.settings = [(path, settings_of(m)) for path, m in model.named_modules()]

    def check(self, model: nn.Module, slot: int) -> None:
        """Raise ShapesDiffer naming the first difference between `model` and the reference (slot 0)."""
        difference = self.difference(model, slot)
        if difference is not None:
            raise ShapesDiffer(difference)

    def difference(self, model: nn.Module, slot: int) -> str | None:
        """The first difference between `model` (in slot `slot`) and the reference (slot 0), in words."""
        described = _describe_tensors(model)
        for (kind0, name0, shape0, dtype0), (kind, name, shape, dtype) in zip(self.tensors, described):
            if (kind0, name0) != (kind, name):
                return f"slot {slot} has {kind} '{name}' where slot 0 has {kind0} '{name0}'"
            if shape0 != shape:
                return f"{kind} '{name}' is {list(shape)} in slot {slot} but {list(shape0)} in slot 0"
            if dtype0 != dtype and not (dtype0.is_floating_point and dtype.is_floating_point):
                # Floating tensors are all cast to the array's dtype; others must agree.
                return f"{kind} '{name}' is {dtype} in slot {slot} but {dtype0} in slot 0"
        if len(described) != len(self.tensors):
            longer = slot if len(described) > len(self.tensors) else 0
            extra = (described if longer else self.tensors)[min(len(described), len(self.tensors))]
            return f"slot {longer} has an extra {extra[0]} '{extra[1]}'"
        for line0, line in zip(self.structure, repr(model).splitlines()):
            if line0 != line:
                return f"slot {slot} has '{cut(line.strip(), 50)}' where slot 0 has '{cut(line0.strip(), 50)}'"
        # Attributes repr does not show (a user module's temperature, say) are read by the shared forward too.
        for (path, settings0), (_, module) in zip(self.settings, model.named_modules()):
            settings = settings_of(module)
            for name, value0 in settings0.items():
                if name not in settings or not same_setting(value0, settings[name]):
                    shown, shown0 = shown_value(settings.get(name, "<missing>")), shown_value(value0)
                    return f"layer '{path or '<root>'}': '{name}' is {shown} in slot {slot} but {shown0} in slot 0"
        return None


class ShapesDiffer(FusionError):
    """Models that cannot share an array of equal shapes; `difference` says where, in a few words."""

    def __init__(self, difference: str) -> None:
        super().__init__(f"{difference}; only models of equal layers, shapes and settings share one array")
        self.difference = difference


# torch.nn.utils' hook-based weight rewrites (hook class: the function, its parametrization form)
_HOOKED_WEIGHTS = {
    "SpectralNorm": ("spectral_norm", "torch.nn.utils.parametrizations.spectral_norm"),
    "WeightNorm": ("weight_norm", "torch.nn.utils.parametrizations.weight_norm"),
}


def refuse_hooked_weights(model: nn.Module) -> None:
    """FusionError naming the layer when a weight is recomputed in a forward pre-hook
    (torch.nn.utils.spectral_norm, weight_norm): the hook writes a plain attribute the array
    cannot give each slot; the parametrization forms do the same and fuse."""
    for path, module in model.named_modules():
        for hook in module._forward_pre_hooks.values():
            kind = type(hook)
            if kind.__name__ in _HOOKED_WEIGHTS and kind.__module__.startswith("torch.nn.utils"):
                function, parametrization = _HOOKED_WEIGHTS[kind.__name__]
                raise FusionError(
                    f"layer '{path or '<root>'}' ({type(module).__name__}) uses torch.nn.utils.{function}, whose "
                    f"hook writes a plain weight attribute no array can give each slot; use {parametrization}"
                )


def check_equal_shapes(models: Sequence[nn.Module]) -> None:
    """Raise FusionError naming the first model that differs from slot 0 in tensors, shapes or tree."""
    signature = FusionSignature(models[0])
    for slot, model in enumerate(models[1:], start=1):
        signature.check(model, slot)


def equal_shapes(models: Sequence[nn.Module]) -> bool:
    """Whether every model has slot 0's tensors, shapes and module tree (no envelope needed)."""
    try:
        check_equal_shapes(models)
    except FusionError:
        return False
    return True


def check_fusable(models: Sequence[nn.Module]) -> None:
    """Raise FusionError (naming the layer) unless the models can train as one array:
    equal shapes, or one structure of different sizes that pads into an envelope."""
    models = list(models)
    if not equal_shapes(models):
        Envelope(models)


def refuse_frozen(models: Sequence[nn.Module]) -> None:
    """Every parameter of an array is trained: a frozen one would silently be trained too."""
    for slot, model in enumerate(models):
        for name, param in model.named_parameters():
            if not param.requires_grad:
                raise FusionError(
                    f"parameter '{name}' of slot {slot} has requires_grad=False; an array trains every parameter: "
                    "register a frozen tensor as a buffer instead"
                )
