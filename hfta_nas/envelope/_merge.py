"""Envelopes: models of one structure and different sizes, padded into one shape.

`build_envelope(models)` walks the slots' module trees side by side and
returns the *envelope*: the same tree with every tensor as large as the
largest slot's (per dim), the longest children list of every Sequential /
ModuleList, and `ActivationChoice` / `DropoutChoice` where slots differ in
activation or dropout rate. Its tensors are zeros; only their shapes matter.
Where each slot sits in it is `_placement.py`'s part.

Depth: a shorter Sequential / ModuleList maps onto a prefix and a suffix of
the envelope's children (`align_children`); the children in between must keep
their input's shape (judged from their sizes) and are skipped by that slot.
What cannot be embedded exactly raises `FusionError` naming the layer;
whatever passes is still verified numerically by the array before it trains
(`_probe.py`).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from hfta_nas.envelope._padded_layers import ActivationChoice, DropoutChoice, activation_key
from hfta_nas.errors import FusionError
from hfta_nas.layers._slot_ops import ELEMENTWISE, POOLING_DIMS

DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)
CONTAINERS = (nn.Sequential, nn.ModuleList)
RECURRENT = (nn.GRU, nn.LSTM)
_NORMS = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm)
_NO_SKIP = (nn.Flatten, nn.Unflatten, nn.Embedding, nn.RNNBase, nn.modules.conv._ConvTransposeNd, *POOLING_DIMS)

# Attributes of torch layers that are sizes: they may differ between slots, and
# the envelope takes the largest (per dim). Every other setting must be equal.
_SIZE_ATTRIBUTES = frozenset(
    {
        "in_features",
        "out_features",
        "in_channels",
        "out_channels",
        "kernel_size",
        "num_features",
        "num_channels",
        "normalized_shape",
        "num_embeddings",
        "embedding_dim",
        "input_size",
        "hidden_size",
        "num_layers",
        "embed_dim",
        "kdim",
        "vdim",
        "head_dim",
    }
)


def shown_path(path: str) -> str:
    return path or "<root>"


def shown_value(value: Any) -> str:
    """A setting's value for a one-line message: a tensor by its shape, anything else cut to 40 characters."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    return cut(" ".join(repr(value).split()), 40)


def cut(text: str, limit: int) -> str:
    """`text` for a one-line message: at most `limit` characters, the cut marked with '...'."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def join_path(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def layer_kind(module: nn.Module) -> Any:
    """What must be equal across slots at one position (activations may differ among themselves)."""
    if type(module) in ELEMENTWISE or isinstance(module, ActivationChoice):
        return "activation"
    return module.kind if isinstance(module, DropoutChoice) else type(module)


def _is_user_module(module: nn.Module) -> bool:
    return not type(module).__module__.startswith("torch.")


# ------------------------------------------------------------------ alignment
def _compatible(a: nn.Module, b: nn.Module) -> bool:
    """Same kind of layer with the same named children (containers may differ in length)."""
    if layer_kind(a) != layer_kind(b):
        return False
    if isinstance(a, CONTAINERS) or layer_kind(a) == "activation":
        return True
    if list(a._modules) != list(b._modules):
        return False
    return all(
        (x is None) == (y is None) and (x is None or _compatible(x, y))
        for x, y in zip(a._modules.values(), b._modules.values())
    )


def _sized_leaves(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd))]


def padding_of(conv: nn.modules.conv._ConvNd) -> tuple[float, ...]:
    """The padding on each side per spatial dim ('same': half the dilated kernel, maybe x.5)."""
    if conv.padding == "same":
        return tuple(d * (k - 1) / 2 for k, d in zip(conv.kernel_size, conv.dilation))
    if conv.padding == "valid":
        return (0.0,) * len(conv.kernel_size)
    return tuple(float(p) for p in conv.padding)


def _keeps_geometry(conv: nn.modules.conv._ConvNd) -> bool:
    return all(s == 1 for s in conv.stride) and all(
        2 * p == d * (k - 1) for p, d, k in zip(padding_of(conv), conv.dilation, conv.kernel_size)
    )


def _keeps_shape(module: nn.Module) -> bool:
    """Whether `module` maps an input to an output of the same shape, judged from its layers' sizes.

    Only a layer that keeps its input's shape can be skipped by a slot of
    smaller depth (skipping makes it the identity). A wrong guess is caught
    when the array runs (the skip gate checks shapes) and by the verification.
    """
    if type(module) in ELEMENTWISE or isinstance(
        module, (*DROPOUTS, *_NORMS, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, nn.MultiheadAttention)
    ):
        return True
    if any(isinstance(m, _NO_SKIP) for m in module.modules()):
        return False
    convs = [m for m in module.modules() if isinstance(m, nn.modules.conv._ConvNd)]
    if not all(_keeps_geometry(c) for c in convs):
        return False
    sized = _sized_leaves(module)
    if not sized:
        return True
    first, last = sized[0], sized[-1]
    first_in = first.in_features if isinstance(first, nn.Linear) else first.in_channels
    last_out = last.out_features if isinstance(last, nn.Linear) else last.out_channels
    return first_in == last_out


def align_children(path: str, long: Sequence[nn.Module], short: Sequence[nn.Module]) -> list[int]:
    """For each child of `short`, its position among `long`'s (the envelope's).

    `short` maps onto a prefix and a suffix of `long`; the children between
    are skipped and must keep their input's shape. The longest prefix that
    works is taken (an MLP of depth 1 in one of depth 3 skips hidden layers 2
    and 3 and keeps its output layer last).
    """
    gap = len(long) - len(short)
    if gap < 0:
        raise FusionError(
            f"layer '{shown_path(path)}' has {len(short)} children in a slot but {len(long)} in the envelope."
        )
    for prefix in range(len(short), -1, -1):
        mapping = list(range(prefix)) + list(range(prefix + gap, len(long)))
        if all(_compatible(long[j], child) for j, child in zip(mapping, short)) and all(
            _keeps_shape(long[j]) for j in range(prefix, prefix + gap)
        ):
            return mapping
    if gap == 0:
        k = next(k for k, (a, b) in enumerate(zip(long, short)) if not _compatible(a, b))
        raise FusionError(
            f"layer {k} of '{shown_path(path)}' is {type(short[k]).__name__} in one slot but {type(long[k]).__name__} "
            "in another; slots must have the same layer types in the same order"
        )
    raise FusionError(
        f"layer '{shown_path(path)}' holds {len(short)} layers in one slot and {len(long)} in another, and no "
        "choice of skipped layers keeps the shapes (a skipped layer must keep its input's shape): such depths "
        "need separate arrays"
    )


# -------------------------------------------------------------- the envelope
def empty_shell(module: nn.Module) -> nn.Module:
    """A copy of `module` with its own (empty) parameter, buffer and child tables."""
    shell = copy.copy(module)
    shell._parameters, shell._buffers, shell._modules = OrderedDict(), OrderedDict(), OrderedDict()
    shell._non_persistent_buffers_set = set(module._non_persistent_buffers_set)
    for hooks in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
        if hasattr(module, hooks):
            setattr(shell, hooks, OrderedDict(getattr(module, hooks)))
    return shell


def same_setting(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and bool((a == b).all())
        )
    if callable(a) and callable(b) and hasattr(a, "__code__") and hasattr(b, "__code__"):
        return a.__code__ is b.__code__  # the same function made again per instance (a lambda in __init__)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an attribute whose == is not a bool: compare identity
        return a is b


def settings_of(module: nn.Module) -> dict[str, Any]:
    """A module's settings: its public non-tensor attributes (what its forward may read)."""
    return {k: v for k, v in vars(module).items() if not k.startswith("_") and k != "training"}


def _sizes_in(module: nn.Module) -> set[int]:
    """The sizes a module's subtree has: every tensor dim and every container's length."""
    sizes = {n for t in [*module.parameters(), *module.buffers()] for n in t.shape}
    return sizes | {len(m) for m in module.modules() if isinstance(m, CONTAINERS)}


def is_size(module: nn.Module, name: str, value: Any) -> bool:
    """Whether a setting that differs between slots is a size the envelope may take the largest of.

    torch layers: their size attributes (`kernel_size` for convolutions only). A user's
    module: an int that is one of its own sizes (a width, a block count), so that a
    clamp bound or a temperature that merely differs is refused, not silently replaced.
    """
    if _is_user_module(module):
        return isinstance(value, int) and not isinstance(value, bool) and value in _sizes_in(module)
    if name == "kernel_size":
        return isinstance(module, nn.modules.conv._ConvNd)
    return name in _SIZE_ATTRIBUTES


def _largest(values: list[Any]) -> Any:
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return max(values)
    if all(isinstance(v, (tuple, list)) and len(v) == len(values[0]) for v in values):
        return type(values[0])(max(parts) for parts in zip(*values))
    return None


def _merge_settings(path: str, env: nn.Module, present: list[tuple[int, nn.Module]]) -> None:
    """Settings must be equal; sizes (and ints of user modules) become the largest slot's."""
    s0, first = present[0]
    names = set(settings_of(first))
    for slot, module in present[1:]:
        if set(settings_of(module)) != names:
            raise FusionError(f"layer '{shown_path(path)}' has different attributes in slots {s0} and {slot}.")
    for name in sorted(names):
        values = [getattr(m, name) for _, m in present]
        if all(same_setting(values[0], v) for v in values[1:]):
            continue
        if name == "padding" and isinstance(first, nn.modules.conv._ConvNd):
            continue  # set from the geometry in _merge_conv
        largest = _largest(values)
        if largest is not None and all(is_size(m, name, v) for (_, m), v in zip(present, values)):
            setattr(env, name, largest)
            continue
        slot = next(s for (s, _), v in zip(present, values) if not same_setting(values[0], v))
        raise FusionError(
            f"layer '{shown_path(path)}' ({type(first).__name__}): '{name}' is {shown_value(values[0])} in slot "
            f"{s0} but {shown_value(getattr(dict(present)[slot], name))} in slot {slot}; slots share one forward, so "
            "settings other than sizes must be equal."
        )


def _merge_conv(path: str, env: nn.modules.conv._ConvNd, present: list[tuple[int, nn.Module]]) -> None:
    """Kernels are centred in the envelope's: the padding must grow with them (same output geometry)."""
    kernels = [m.kernel_size for _, m in present]
    channels = {(m.in_channels, m.out_channels) for _, m in present}
    if len(channels) > 1 and env.groups != 1:
        raise FusionError(
            f"layer '{shown_path(path)}' ({type(env).__name__}): a grouped convolution (groups={env.groups}) with "
            "different channel counts per slot cannot be padded (its groups would mix); use equal channels here."
        )
    if len(set(kernels)) == 1 and len({str(m.padding) for _, m in present}) == 1:
        return
    if env.padding_mode != "zeros":
        raise FusionError(
            f"layer '{shown_path(path)}': kernels of different sizes need padding_mode='zeros', got "
            f"{env.padding_mode!r}."
        )
    big = tuple(max(ks) for ks in zip(*kernels))
    paddings = set()
    for slot, conv in present:
        for k, big_k in zip(conv.kernel_size, big):
            if (big_k - k) % 2:
                raise FusionError(
                    f"layer '{shown_path(path)}' ({type(conv).__name__}): kernel sizes {k} (slot {slot}) and {big_k} "
                    "differ by an odd number, so one cannot be centred in the other: use odd sizes throughout"
                )
        paddings.add(
            tuple(
                p + d * (big_k - k) / 2
                for p, k, big_k, d in zip(padding_of(conv), conv.kernel_size, big, conv.dilation)
            )
        )
    if len(paddings) > 1 or any(p != int(p) for p in next(iter(paddings))):
        raise FusionError(
            f"layer '{shown_path(path)}' ({type(env).__name__}): kernels {sorted(set(kernels))} with paddings "
            f"{[m.padding for _, m in present]} give outputs of different geometry: pad to keep it (padding='same')"
        )
    padding = next(iter(paddings))
    env.padding = "same" if all(m.padding == "same" for _, m in present) else tuple(int(p) for p in padding)
    env._reversed_padding_repeated_twice = [int(p) for p in reversed(padding) for _ in range(2)]


def _merge_recurrent(path: str, present: list[tuple[int, nn.Module]]) -> nn.Module:
    s0, first = present[0]
    stacked = [(slot, m) for slot, m in present if m.num_layers > 1]  # dropout acts between layers only
    for slot, rnn in stacked[1:]:
        if rnn.dropout != stacked[0][1].dropout:
            raise FusionError(
                f"layer '{shown_path(path)}' ({type(first).__name__}): 'dropout' is {stacked[0][1].dropout!r} "
                f"in slot {stacked[0][0]} but {rnn.dropout!r} in slot {slot}."
            )
    dropout = stacked[0][1].dropout if stacked else 0.0
    for slot, rnn in present[1:]:
        for name in ("bias", "batch_first", "bidirectional", "proj_size"):
            if getattr(rnn, name) != getattr(first, name):
                raise FusionError(
                    f"layer '{shown_path(path)}' ({type(first).__name__}): '{name}' is "
                    f"{shown_value(getattr(first, name))} in slot {s0} but {shown_value(getattr(rnn, name))} "
                    f"in slot {slot}."
                )
    hidden = {m.hidden_size for _, m in present}
    if first.bidirectional and len(hidden) > 1:
        raise FusionError(
            f"layer '{shown_path(path)}' ({type(first).__name__}): bidirectional layers of different hidden sizes "
            "cannot be padded (the padding would sit between the directions): use one hidden size"
        )
    # Built on the meta device: the constructor's random init must not touch torch's RNG.
    env = type(first)(
        max(m.input_size for _, m in present),
        max(hidden),
        num_layers=max(m.num_layers for _, m in present),
        bias=first.bias,
        batch_first=first.batch_first,
        dropout=dropout,
        bidirectional=first.bidirectional,
        device="meta",
    )
    device = next(first.parameters()).device
    env.to_empty(device=device)
    if device.type != "meta":
        for param in env.parameters():
            param.data.zero_()
    return env


def _merge_tensors(path: str, env: nn.Module, present: list[tuple[int, nn.Module]], table: str, tied: dict) -> None:
    s0, first = present[0]
    names = list(getattr(first, table))
    for slot, module in present[1:]:
        if list(getattr(module, table)) != names:
            raise FusionError(
                f"layer '{shown_path(path)}' has {table[1:]} {names} in slot {s0} but {list(getattr(module, table))} "
                f"in slot {slot}; models must have the same layers."
            )
    for name in names:
        tensors = [getattr(m, table)[name] for _, m in present]
        if any(t is None for t in tensors):
            if not all(t is None for t in tensors):
                raise FusionError(f"'{join_path(path, name)}' is None in some slots only.")
            getattr(env, table)[name] = None
            continue
        key = tuple(id(t) for t in tensors)
        if key in tied:  # the same tensor again (tied weights): the same envelope tensor
            getattr(env, table)[name] = tied[key]
            continue
        if len({t.dim() for t in tensors}) > 1:
            raise FusionError(f"'{join_path(path, name)}' has a different number of dims across slots.")
        shape = tuple(max(sizes) for sizes in zip(*(t.shape for t in tensors)))
        zeros = torch.zeros(shape, dtype=tensors[0].dtype, device=tensors[0].device)  # meta stays meta
        made = nn.Parameter(zeros, requires_grad=tensors[0].requires_grad) if table == "_parameters" else zeros
        getattr(env, table)[name] = tied[key] = made


def _add_stand_ins(
    columns: list[list[nn.Module | None]], slot: int, reference: list[nn.Module], placed: dict[int, nn.Module]
) -> None:
    """Size a block that `slot` skips as if the slot had it too.

    A block only deeper slots have would otherwise get their width alone,
    while the skipping slot feeds it its own (maybe wider) activations: a
    transformer of width 16 and 2 layers beside one of width 12 and 3 layers
    needs a third layer of width 16. The nearest block of the same kind that
    the slot does have stands in for the size merge only (not for placement).
    """
    for position, column in enumerate(columns):
        if column[slot] is not None:
            continue
        candidates = sorted(placed, key=lambda p: (abs(p - position), p > position))
        column[slot] = next(
            (placed[p] for p in candidates if _compatible(reference[position], placed[p]) and _keeps_shape(placed[p])),
            None,
        )
        if column[slot] is None:  # the slot has no such block: the reference block at the slot's width
            column[slot] = _widened(reference[position], _width_before(placed, position))


def _out_size(module: nn.Module) -> int | None:
    sized = _sized_leaves(module)
    if not sized:
        return None
    last = sized[-1]
    return last.out_features if isinstance(last, nn.Linear) else last.out_channels


def _in_size(module: nn.Module) -> int | None:
    sized = _sized_leaves(module)
    if not sized:
        return None
    first = sized[0]
    return first.in_features if isinstance(first, nn.Linear) else first.in_channels


def _width_before(placed: dict[int, nn.Module], position: int) -> int | None:
    """The width of the features a slot feeds into `position`: the output size of its
    nearest earlier layer that has one."""
    for p in sorted((p for p in placed if p < position), reverse=True):
        size = _out_size(placed[p])
        if size is not None:
            return size
    return None


def _widened(block: nn.Module, width: int | None) -> nn.Module | None:
    """A shape-only copy of a shape-keeping `block` whose width (its input size) becomes `width`,
    or None where that would not make it wider. Only used to size the envelope."""
    old = _in_size(block) if _keeps_shape(block) else None
    if old is None or width is None or width <= old:
        return None
    ghost = copy.deepcopy(block)
    resize = lambda n: width if n == old else n
    for module in ghost.modules():
        for table in ("_parameters", "_buffers"):
            for name, tensor in getattr(module, table).items():
                if tensor is not None:
                    zeros = torch.zeros([resize(n) for n in tensor.shape], dtype=tensor.dtype, device=tensor.device)
                    getattr(module, table)[name] = (
                        nn.Parameter(zeros, requires_grad=tensor.requires_grad) if table == "_parameters" else zeros
                    )
        for name, value in settings_of(module).items():
            if (
                isinstance(value, int)
                and not isinstance(value, bool)
                and (name in _SIZE_ATTRIBUTES or _is_user_module(module))
            ):
                setattr(module, name, resize(value))
            elif name in _SIZE_ATTRIBUTES and isinstance(value, tuple):
                setattr(module, name, tuple(resize(v) for v in value))
        if isinstance(module, nn.MultiheadAttention):
            module.head_dim = module.embed_dim // module.num_heads
    return ghost


def _merge(path: str, column: list[nn.Module | None], tied: dict) -> nn.Module:
    """The envelope of the modules at one position (None: a slot that skips it)."""
    present = [(slot, m) for slot, m in enumerate(column) if m is not None]
    s0, first = present[0]
    for slot, module in present[1:]:
        if layer_kind(module) != layer_kind(first):
            raise FusionError(
                f"layer '{shown_path(path)}' is {type(first).__name__} in slot {s0} but "
                f"{type(module).__name__} in slot "
                f"{slot}; slots must have the same layer types in the same order."
            )
    if layer_kind(first) == "activation":
        variants: list[nn.Module] = []
        for _, m in present:
            if activation_key(m) not in {activation_key(v) for v in variants}:
                variant = copy.deepcopy(m)
                if getattr(variant, "inplace", False):
                    variant.inplace = False  # each variant reads the same input
                variants.append(variant)
        return copy.deepcopy(first) if len(variants) == 1 else ActivationChoice(variants)
    if isinstance(first, DROPOUTS):
        rates = {m.p for _, m in present}
        return copy.deepcopy(first) if len(rates) == 1 else DropoutChoice(type(first), max(rates))
    if isinstance(first, RECURRENT):
        return _merge_recurrent(path, present)
    env = empty_shell(first)
    _merge_settings(path, env, present)
    if isinstance(first, CONTAINERS):
        longest = max((m for _, m in present), key=len)
        reference = list(longest._modules.items())
        columns: list[list[nn.Module | None]] = [[None] * len(column) for _ in reference]
        for slot, module in present:
            children = list(module._modules.values())
            mapping = align_children(path, [c for _, c in reference], children)
            for child, position in zip(children, mapping):
                columns[position][slot] = child
            _add_stand_ins(columns, slot, [c for _, c in reference], dict(zip(mapping, children)))
        for (name, _), child_column in zip(reference, columns):
            env._modules[name] = _merge(join_path(path, name), child_column, tied)
    else:
        names = list(first._modules)
        for slot, module in present[1:]:
            if list(module._modules) != names:
                raise FusionError(
                    f"layer '{shown_path(path)}' has children {names} in slot {s0} but "
                    f"{list(module._modules)} in slot {slot}; models must have the same layers."
                )
        for name in names:
            child_column = [m._modules[name] if m is not None else None for m in column]
            present_children = [c for c in child_column if c is not None]
            if not present_children:
                env._modules[name] = None
            elif len(present_children) != len(present):
                raise FusionError(f"'{join_path(path, name)}' is None in some slots only.")
            else:
                env._modules[name] = _merge(join_path(path, name), child_column, tied)
    _merge_tensors(path, env, present, "_parameters", tied)
    _merge_tensors(path, env, present, "_buffers", tied)
    if isinstance(first, nn.modules.conv._ConvNd):
        _merge_conv(path, env, present)
    if isinstance(first, nn.MultiheadAttention) and len({m.num_heads for _, m in present}) > 1:
        raise FusionError(f"layer '{shown_path(path)}' (MultiheadAttention): slots must have the same num_heads.")
    return env


def build_envelope(models: Sequence[nn.Module]) -> nn.Module:
    """The envelope tree of `models` (see the module docstring); FusionError naming the layer if none exists."""
    return _merge("", list(models), {})
