"""Where each slot sits in the envelope: an index per dim of every tensor.

`embed(envelope, model)` places one slot: for every parameter and buffer of
the slot, the envelope tensor it lives in and the index of each of its entries
there. Entries no slot maps stay zero. Placement per dim:

- prefix (entry i at i): widths, channels, features, embedding dims;
- centred: the kernel dims of a convolution (a kernel-3 inside a kernel-7:
  offset 2), exact when the padding keeps the geometry (checked here);
- chunked: dims made of equal parts that each grow: GRU/LSTM gates, the
  q/k/v blocks and heads of attention (entry j of part i at i * envelope part
  size + j).

A model that does not fit (larger than the envelope, other settings, a
geometry the centred kernel would change) raises `FusionError` naming the layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hfta_nas.envelope._merge import (
    CONTAINERS,
    DROPOUTS,
    ELEMENTWISE,
    RECURRENT,
    align_children,
    empty_shell,
    is_size,
    join_path,
    layer_kind,
    padding_of,
    same_setting,
    settings_of,
    shown_path,
    shown_value,
)
from hfta_nas.envelope._padded_layers import ActivationChoice, DropoutChoice, activation_key
from hfta_nas.errors import FusionError
from hfta_nas.layers._slot_ops import SlotBox, explicit_padding


def _prefix(own: int, env: int) -> torch.Tensor:
    return torch.arange(own)


def _centred(own: int, env: int) -> torch.Tensor:
    return torch.arange(own) + (env - own) // 2


def _chunked(parts: int):
    def place(own: int, env: int) -> torch.Tensor:
        if own % parts or env % parts:
            raise FusionError(f"a dim of {own} (envelope {env}) does not split into {parts} equal parts.")
        part, env_part = own // parts, env // parts
        index = torch.arange(own)
        return (index // part) * env_part + index % part

    return place


def _placers(module: nn.Module, name: str, dims: int, hint: dict[str, Any]) -> list[Any]:
    """How each dim of `module`'s tensor `name` sits in the envelope (prefix unless the layer says otherwise)."""
    placers: list[Any] = [_prefix] * dims
    if name in hint:
        return list(hint[name])
    if isinstance(module, nn.modules.conv._ConvNd) and name == "weight":
        placers[2:] = [_centred] * (dims - 2)
    elif isinstance(module, nn.RNNBase):
        gates = 4 if isinstance(module, nn.LSTM) else 3 if isinstance(module, nn.GRU) else 1  # stand-ins too
        placers[0] = _chunked(gates)
        layer = int(name.split("_l")[1].split("_")[0]) if "_l" in name else 0
        if name.startswith("weight_ih") and layer > 0 and module.bidirectional:
            placers[1] = _chunked(2)
    elif isinstance(module, nn.MultiheadAttention):
        heads = module.num_heads
        if name in ("in_proj_weight", "in_proj_bias"):
            placers[0] = _chunked(3 * heads)
        elif name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
            placers[0] = _chunked(heads)
        elif name in ("bias_k", "bias_v"):
            placers[2] = _chunked(heads)
    return placers


def _child_hint(module: nn.Module, child: str) -> dict[str, Any]:
    """Placement a parent imposes on a child's tensors: attention's output projection reads heads."""
    if isinstance(module, nn.MultiheadAttention) and child == "out_proj":
        return {"weight": (_prefix, _chunked(module.num_heads))}
    return {}


@dataclass
class SlotEmbedding:
    """Where one slot's model sits in the envelope."""

    state_keys: list[str]  # the slot's own state_dict keys, in order
    shapes: dict[str, torch.Size]  # own tensor name -> own shape
    places: dict[str, tuple[str, tuple[torch.Tensor, ...]]]  # own tensor name -> (envelope name, index per dim)
    modules: dict[str, str] = field(default_factory=dict)  # own module path -> envelope module path
    absent: list[str] = field(default_factory=list)  # envelope module paths this slot skips
    choices: dict[str, int] = field(default_factory=dict)  # ActivationChoice path -> variant
    rates: dict[str, float] = field(default_factory=dict)  # DropoutChoice path -> p
    own: dict[str, nn.Module] = field(default_factory=dict)  # envelope path -> the slot's module there, its
    # settings only (a shell without tensors or children: the array keeps no reference to the user's model)

    def index(self, own_name: str) -> tuple[str, tuple[torch.Tensor, ...]]:
        return self.places[own_name]


def place_index(index: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Per-dim index vectors as one advanced index (their outer product)."""
    dims = len(index)
    return tuple(i.view(*([1] * d), -1, *([1] * (dims - d - 1))) for d, i in enumerate(index))


def _embed_tensors(env: nn.Module, own: nn.Module, env_path: str, own_path: str, emb: SlotEmbedding, hint) -> None:
    for table in ("_parameters", "_buffers"):
        for name, tensor in getattr(own, table).items():
            if tensor is None:
                continue
            target = getattr(env, table).get(name)
            if target is None:
                raise FusionError(
                    f"'{join_path(own_path, name)}' has no place in the array's envelope at "
                    f"'{join_path(env_path, name)}'."
                )
            if tensor.dim() != target.dim() or any(o > e for o, e in zip(tensor.shape, target.shape)):
                raise FusionError(
                    f"'{join_path(own_path, name)}' has shape {list(tensor.shape)}, larger than the array's envelope "
                    f"{list(target.shape)}; a model must fit inside the envelope of the models the array was "
                    "built from."
                )
            placers = _placers(env, name, tensor.dim(), hint)
            index = tuple(place(o, e) for place, o, e in zip(placers, tensor.shape, target.shape))
            emb.places[join_path(own_path, name)] = (join_path(env_path, name), index)
            emb.shapes[join_path(own_path, name)] = tensor.shape


def _embed(env: nn.Module, own: nn.Module, env_path: str, own_path: str, emb: SlotEmbedding, hint) -> None:
    emb.modules[own_path] = env_path
    emb.own[env_path] = empty_shell(own)
    if isinstance(env, ActivationChoice):
        choice = env.index_of(own) if type(own) in ELEMENTWISE else None
        if choice is None:
            raise FusionError(
                f"layer '{shown_path(own_path)}' ({own!r}) is none of the array's activations there "
                f"({', '.join(repr(v) for v in env.variants)})."
            )
        emb.choices[env_path] = choice
        return
    if isinstance(env, DropoutChoice):
        if type(own) is not env.kind:
            raise FusionError(
                f"layer '{shown_path(own_path)}' is {type(own).__name__}, the array has {env.kind.__name__}."
            )
        emb.rates[env_path] = own.p
        return
    if layer_kind(env) != layer_kind(own) or (
        layer_kind(env) == "activation" and activation_key(env) != activation_key(own)
    ):
        raise FusionError(f"layer '{shown_path(own_path)}' is {own!r}; the array has {env!r} there.")
    if isinstance(env, DROPOUTS) and env.p != own.p:
        raise FusionError(
            f"layer '{shown_path(own_path)}' has dropout p={own.p}; the array has p={env.p} there for every slot."
        )
    _check_fits(env, own, own_path)
    if isinstance(env, CONTAINERS):
        env_children, own_children = list(env._modules.items()), list(own._modules.items())
        mapping = align_children(own_path, [c for _, c in env_children], [c for _, c in own_children])
        for (own_name, child), position in zip(own_children, mapping):
            env_name = env_children[position][0]
            _embed(
                env_children[position][1], child, join_path(env_path, env_name), join_path(own_path, own_name), emb, {}
            )
        for position in sorted(set(range(len(env_children))) - set(mapping)):
            emb.absent.append(join_path(env_path, env_children[position][0]))
    else:
        if list(own._modules) != list(env._modules):
            raise FusionError(
                f"layer '{shown_path(own_path)}' has children {list(own._modules)}; the array's model "
                f"has {list(env._modules)}."
            )
        for name, child in own._modules.items():
            if child is not None:
                _embed(
                    env._modules[name],
                    child,
                    join_path(env_path, name),
                    join_path(own_path, name),
                    emb,
                    _child_hint(env, name),
                )
    _embed_tensors(env, own, env_path, own_path, emb, hint)


def _check_fits(env: nn.Module, own: nn.Module, own_path: str) -> None:
    """Settings of `own` that must equal the envelope's (sizes are checked with the tensors)."""
    if isinstance(env, RECURRENT):
        names = ("bias", "batch_first", "bidirectional", "proj_size") + (("dropout",) if own.num_layers > 1 else ())
        for name in names:
            if getattr(own, name) != getattr(env, name):
                raise FusionError(
                    f"layer '{shown_path(own_path)}': '{name}' is {shown_value(getattr(own, name))}; the array has "
                    f"{shown_value(getattr(env, name))}."
                )
        if own.bidirectional and own.hidden_size != env.hidden_size:
            raise FusionError(
                f"layer '{shown_path(own_path)}': a bidirectional layer must have the array's hidden size "
                f"({env.hidden_size})."
            )
        return
    env_settings = settings_of(env)
    for name, value in settings_of(own).items():
        if name in env_settings and same_setting(env_settings[name], value):
            continue
        if name in env_settings and (
            name == "padding" and isinstance(own, nn.modules.conv._ConvNd) or is_size(own, name, value)
        ):
            continue  # sizes: checked with the tensors (a user module's: by the verification too)
        raise FusionError(
            f"layer '{shown_path(own_path)}' ({type(own).__name__}): '{name}' is {shown_value(value)}; the array's "
            f"model has {shown_value(env_settings.get(name, '<missing>'))}."
        )
    if isinstance(env, nn.modules.conv._ConvNd):
        for k, big_k, d, p, big_p in zip(
            own.kernel_size, env.kernel_size, own.dilation, padding_of(own), padding_of(env)
        ):
            if (big_k - k) % 2 or p + d * (big_k - k) / 2 != big_p:
                raise FusionError(
                    f"layer '{shown_path(own_path)}' ({type(own).__name__}): kernel {own.kernel_size} with padding "
                    f"{own.padding!r} cannot be centred in the array's kernel {env.kernel_size} with padding "
                    f"{env.padding!r}"
                )


def embed(envelope: nn.Module, model: nn.Module) -> SlotEmbedding:
    """Where `model`'s tensors sit in `envelope` (FusionError naming the layer if they cannot)."""
    emb = SlotEmbedding(state_keys=list(model.state_dict().keys()), shapes={}, places={})
    _embed(envelope, model, "", "", emb, {})
    return emb


def embed_into(envelope_value: torch.Tensor, value: torch.Tensor, index: tuple[torch.Tensor, ...]) -> None:
    """Write `value` into its place in one slot's envelope tensor (in place)."""
    if value.dim() == 0:
        envelope_value.copy_(value)
    else:
        envelope_value[place_index(index)] = value.to(envelope_value.dtype)


def take_from(envelope_value: torch.Tensor, index: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """One slot's own tensor out of its envelope tensor (a copy)."""
    if envelope_value.dim() == 0:
        return envelope_value.clone()
    return envelope_value[place_index(tuple(i.to(envelope_value.device) for i in index))]


def conv_box(env: nn.Module, own: nn.Module | None) -> SlotBox | None:
    """Where a slot's own convolution sits in the envelope's (None: it fills it, or is absent)."""
    if own is None or env.groups != 1 or env.transposed:
        return None
    sizes = lambda conv: (conv.out_channels, conv.in_channels, tuple(conv.kernel_size))
    padding = explicit_padding(own)
    if sizes(own) == sizes(env) or padding is None:
        return None
    offsets = [(big - k) // 2 for big, k in zip(env.kernel_size, own.kernel_size)]
    weight = (
        slice(0, own.out_channels),
        slice(0, own.in_channels),
        *(slice(o, o + k) for o, k in zip(offsets, own.kernel_size)),
    )
    return SlotBox(own.out_channels, own.in_channels, weight, padding)
