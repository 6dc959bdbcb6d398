"""`Envelope`: the envelope tree of an array's slots, its template and per-slot constants.

The template is the envelope tree with the stand-ins of `_padded_layers.py`
where some slot needs one (a norm over fewer features, attention with a
smaller head_dim, a different activation or dropout rate, a skipped block),
then the usual fusable swaps (`make_fusable`). Each stand-in reads per-slot
constants (masks, choices, rates, presence flags), which the array stacks
[B, ...] like buffers. A slot put in later (`replace_slot`) must fit the
template as built: it may be smaller, but need no stand-in the template lacks.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn.utils import parametrize

from hfta_nas.envelope._merge import build_envelope
from hfta_nas.envelope._padded_layers import (
    ActivationChoice,
    DropoutChoice,
    PaddedGroupNorm,
    PaddedLayerNorm,
    PaddedMultiheadAttention,
    SlotActivation,
    gate_skipped_layer,
)
from hfta_nas.envelope._placement import SlotEmbedding, embed
from hfta_nas.errors import FusionError
from hfta_nas.layers._slot_layers import SlotDropout, make_fusable

_CHANNEL_DIMS = {nn.Dropout: 0, nn.Dropout1d: 1, nn.Dropout2d: 2, nn.Dropout3d: 3}


def _needs(envelope: nn.Module, emb: SlotEmbedding) -> set[tuple[str, str]]:
    """(path, stand-in kind) pairs this slot needs in the template."""
    needs = {(path, "gate") for path in emb.absent}
    for path, own in emb.own.items():
        env = envelope.get_submodule(path) if path else envelope
        if isinstance(env, ActivationChoice):
            needs.add((path, "activation"))
        elif isinstance(env, DropoutChoice):
            needs.add((path, "dropout_rate"))
        elif isinstance(env, nn.LayerNorm) and tuple(own.normalized_shape) != tuple(env.normalized_shape):
            needs.add((path, "layer_norm"))
        elif isinstance(env, nn.GroupNorm) and own.num_channels != env.num_channels:
            needs.add((path, "group_norm"))
        elif isinstance(env, nn.MultiheadAttention) and own.embed_dim != env.embed_dim:
            needs.add((path, "attention"))
        elif isinstance(env, nn.RNNBase) and own.num_layers != env.num_layers:
            needs.add((path, "rnn_layers"))
    return needs


def _refuse_parametrized(model: nn.Module) -> None:
    """FusionError naming the layer: a parametrization (torch.nn.utils.parametrize) computes its tensor from
    others of its own shapes, which an envelope cannot pad; equal shapes fuse it."""
    for path, module in model.named_modules():
        if parametrize.is_parametrized(module):
            tensors = ", ".join(
                f"'{name}' ({type(chain[0]).__name__})" for name, chain in module.parametrizations.items()
            )
            raise FusionError(
                f"layer '{path or '<root>'}' ({type(module).__bases__[0].__name__}) has a parametrized {tensors}, "
                "which an envelope cannot pad: models of different sizes with it need one array per size"
            )


def _set_child(root: nn.Module, path: str, module: nn.Module) -> nn.Module:
    if not path:
        return module
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)
    return root


class Envelope:
    """The envelope of some models, where each slot sits in it, and the stand-ins they need."""

    def __init__(self, models: Sequence[nn.Module]) -> None:
        for model in models:
            _refuse_parametrized(model)
        self.tree = build_envelope(models)
        # Where the models it was built from sit; the array keeps its own list through surgery.
        self.initial_slots = [embed(self.tree, model) for model in models]
        self.standins: set[tuple[str, str]] = set().union(*(_needs(self.tree, emb) for emb in self.initial_slots))

    def place(self, model: nn.Module, slot: int | None = None) -> SlotEmbedding:
        """Embed a further model (slot surgery); FusionError if the template cannot run it exactly."""
        emb = embed(self.tree, model)
        missing = _needs(self.tree, emb) - self.standins
        if missing:
            path, kind = sorted(missing)[0]
            what = {
                "gate": "skips it (smaller depth)",
                "layer_norm": "normalises fewer features",
                "group_norm": "has fewer channels",
                "attention": "has a smaller embed_dim",
                "rnn_layers": "has fewer layers",
            }.get(kind, kind)
            raise FusionError(
                f"layer '{path or '<root>'}': the new model {what}, which the array's template cannot run (its "
                "models had the full size there): build a new array that includes a model like it"
            )
        return emb

    def template(self) -> nn.Module:
        """The module the array runs: stand-ins where slots need them, then the fusable swaps."""
        root = copy.deepcopy(self.tree)
        for module in root.modules():
            if getattr(module, "inplace", False):
                module.inplace = False  # a skip gate passes its input through: it must not be overwritten
        for path, kind in sorted(self.standins):
            module = root.get_submodule(path) if path else root
            if kind == "activation":
                root = _set_child(root, path, SlotActivation(list(module.variants)))
            elif kind == "dropout_rate":
                root = _set_child(root, path, SlotDropout(module.p, _CHANNEL_DIMS[module.kind], per_slot_rate=True))
            elif kind in ("layer_norm", "group_norm", "attention"):
                module.__class__ = {
                    "layer_norm": PaddedLayerNorm,
                    "group_norm": PaddedGroupNorm,
                    "attention": PaddedMultiheadAttention,
                }[kind]
                module.enable_padding()
        root = make_fusable(root)
        for path, kind in sorted(self.standins):
            module = root.get_submodule(path) if path else root
            if kind == "rnn_layers":
                module.enable_layer_gates()
            elif kind == "gate":
                gate_skipped_layer(module, path)
        return root

    def constants(self, emb: SlotEmbedding) -> dict[str, torch.Tensor]:
        """One slot's values of every stand-in's per-slot constants (name -> tensor)."""
        values: dict[str, torch.Tensor] = {}
        for path, kind in sorted(self.standins):
            env = self.tree.get_submodule(path) if path else self.tree
            own = emb.own.get(path)
            name = functools.partial(_joined, path)
            if kind == "activation":
                values[name("choice")] = torch.tensor(emb.choices.get(path, 0))
            elif kind == "dropout_rate":
                values[name("rate")] = torch.tensor(emb.rates.get(path, 0.0), dtype=torch.float64)
            elif kind == "gate":
                values[name("slot_present")] = torch.tensor(path not in emb.absent)
            elif kind == "layer_norm":
                shape = tuple(own.normalized_shape) if own is not None else tuple(env.normalized_shape)
                mask = torch.zeros(env.normalized_shape)
                mask[tuple(slice(0, n) for n in shape)] = 1.0
                values[name("feature_mask")] = mask
                values[name("feature_count")] = torch.tensor(float(math.prod(shape)))
            elif kind == "group_norm":
                channels = own.num_channels if own is not None else env.num_channels
                per_group = channels // env.num_groups
                onehot = torch.zeros(env.num_channels, env.num_groups)
                onehot[torch.arange(channels), torch.arange(channels) // per_group] = 1.0
                values[name("group_of_channel")] = onehot
                values[name("group_size")] = torch.full((env.num_groups,), float(per_group))
            elif kind == "attention":
                head_dim = own.head_dim if own is not None else env.head_dim
                values[name("query_scale")] = torch.tensor(math.sqrt(env.head_dim / head_dim), dtype=torch.float64)
            elif kind == "rnn_layers":
                layers = own.num_layers if own is not None else env.num_layers
                values[name("layer_present")] = torch.arange(env.num_layers) < layers
        return values


def _joined(path: str, name: str) -> str:
    """A stand-in's constant name under the module at `path` ('' is the root)."""
    return f"{path}.{name}" if path else name
