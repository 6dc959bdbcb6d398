"""Stand-ins that let slots of different sizes share one padded template.

A slot smaller than the array's envelope keeps its real numbers in a corner of
every envelope tensor and zeros elsewhere. Most layers then compute the slot's
own result unchanged: zero weights give zero padded units, and zero weight
columns keep padded units (whatever their value) out of real outputs. The
layers here are the exceptions, each fixed with per-slot constants (stacked
[B, ...] like any buffer, so each slot sees its own under vmap):

- `PaddedLayerNorm` / `PaddedGroupNorm`: the mean and variance run over the
  slot's real features only (a mask and a count), not over the padding.
- `PaddedMultiheadAttention`: attention scales scores by 1/sqrt(head_dim);
  a narrower slot has a smaller head_dim, so its query projection is scaled
  by sqrt(envelope head_dim / slot head_dim) before torch's own scaling.
- `SlotActivation`: each slot's own element-wise activation (relu, gelu, ...),
  chosen per slot with an exact `torch.where`.
- `ActivationChoice` / `DropoutChoice`: what the envelope tree holds where
  slots differ in activation or dropout rate; the template turns them into
  `SlotActivation` and per-slot-rate `SlotDropout`.
- `gate_skipped_layer`: a slot of smaller depth passes its input through the
  envelope blocks it does not have (`torch.where`, exact in both directions).
"""

from __future__ import annotations

import copy
import functools
import math

import torch
from torch import nn

from hfta_nas.errors import FusionError
from hfta_nas.layers._slot_layers import FusableMultiheadAttention


def activation_key(activation: nn.Module) -> str:
    """What makes two activation modules the same function: type and settings, not `inplace`."""
    if getattr(activation, "inplace", False):
        activation = copy.copy(activation)
        activation.inplace = False
    return repr(activation)


class ActivationChoice(nn.Module):
    """Envelope-tree marker: slots use different element-wise activations here."""

    def __init__(self, variants: list[nn.Module]) -> None:
        super().__init__()
        self.variants = nn.ModuleList(variants)

    def index_of(self, activation: nn.Module) -> int | None:
        """Which variant `activation` is (type and settings), None if none."""
        key = activation_key(activation)
        return next((i for i, v in enumerate(self.variants) if activation_key(v) == key), None)


class DropoutChoice(nn.Module):
    """Envelope-tree marker: slots use different dropout rates here (one dropout class)."""

    def __init__(self, kind: type[nn.Module], p: float) -> None:
        super().__init__()
        self.kind, self.p = kind, p

    def extra_repr(self) -> str:
        return f"{self.kind.__name__}, per-slot p (max {self.p})"


class SlotActivation(nn.Module):
    """Each slot's own activation: all variants are computed, each slot keeps its own (`choice`)."""

    def __init__(self, variants: list[nn.Module]) -> None:
        super().__init__()
        self.variants = nn.ModuleList(variants)
        self.register_buffer("choice", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.variants[0](x)
        for index in range(1, len(self.variants)):
            out = torch.where(self.choice == index, self.variants[index](x), out)
        return out

    def native_step(self, prefix: str):
        """This layer on [B, ...] tensors, for the vmap-free path (`hfta_nas.layers._slot_ops.native_forward`)."""
        return lambda leaves, x: self.native_forward(x, leaves[prefix + "choice"])

    def native_forward(self, x: torch.Tensor, choice: torch.Tensor) -> torch.Tensor:
        """`forward` on physical [B, ...] tensors, `choice` [B]."""
        choice = choice.view(-1, *([1] * (x.dim() - 1)))
        out = self.variants[0](x)
        for index in range(1, len(self.variants)):
            out = torch.where(choice == index, self.variants[index](x), out)
        return out


class PaddedLayerNorm(nn.LayerNorm):
    """LayerNorm over a slot's real features: `feature_mask` (1 real, 0 padded) and their count."""

    def enable_padding(self) -> None:
        self.register_buffer("feature_mask", torch.ones(self.normalized_shape))
        self.register_buffer("feature_count", torch.tensor(float(math.prod(self.normalized_shape))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims = tuple(range(-len(self.normalized_shape), 0))
        mask = self.feature_mask.to(x.dtype)
        count = self.feature_count.to(x.dtype)
        mean = (x * mask).sum(dims, keepdim=True) / count
        centred = (x - mean) * mask
        variance = (centred * centred).sum(dims, keepdim=True) / count
        out = centred * torch.rsqrt(variance + self.eps)
        if self.weight is not None:
            out = out * self.weight
        if getattr(self, "bias", None) is not None:
            out = out + self.bias
        return out


class PaddedGroupNorm(nn.GroupNorm):
    """GroupNorm whose groups hold a slot's real channels only.

    `group_of_channel` [C, G] is one-hot (padded channels: all zero) and
    `group_size` [G] the slot's channels per group, so a slot with 16 of the
    envelope's 32 channels in 4 groups normalises groups of 4 channels, as
    nn.GroupNorm(4, 16) does, not groups of 8.
    """

    def enable_padding(self) -> None:
        per_group = self.num_channels // self.num_groups
        onehot = torch.zeros(self.num_channels, self.num_groups)
        onehot[torch.arange(self.num_channels), torch.arange(self.num_channels) // per_group] = 1.0
        self.register_buffer("group_of_channel", onehot)
        self.register_buffer("group_size", torch.full((self.num_groups,), float(per_group)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2:
            raise FusionError(f"GroupNorm needs input [N, C, ...], got shape {list(x.shape)}.")
        n, c = x.shape[:2]
        flat = x.reshape(n, c, -1)
        onehot = self.group_of_channel.to(x.dtype)
        count = self.group_size.to(x.dtype) * flat.shape[-1]
        mean = (flat.sum(-1) @ onehot) / count  # [N, G]
        centred = flat - (mean @ onehot.T).unsqueeze(-1)  # padded channels: x - 0
        variance = ((centred * centred).sum(-1) @ onehot) / count
        out = centred * (torch.rsqrt(variance + self.eps) @ onehot.T).unsqueeze(-1)  # padded: * 0
        if self.affine:
            out = out * self.weight.view(c, 1) + self.bias.view(c, 1)
        return out.view(x.shape)


class PaddedMultiheadAttention(FusableMultiheadAttention):
    """Attention whose query is rescaled per slot (`query_scale`) so that a slot
    with head_dim d is scaled by 1/sqrt(d), not by 1/sqrt(envelope head_dim)."""

    def enable_padding(self) -> None:
        self.register_buffer("query_scale", torch.ones((), dtype=torch.float64))

    def _projections(self, dtype: torch.dtype) -> dict[str, torch.Tensor | bool | None]:
        """The query's weight and bias times the slot's scale; keys and values as they are."""
        e = self.embed_dim
        scale = self.query_scale.to(dtype)
        if self._qkv_same_embed_dim:
            q_w, k_w, v_w = (
                self.in_proj_weight[:e] * scale,
                self.in_proj_weight[e : 2 * e],
                self.in_proj_weight[2 * e :],
            )
        else:
            q_w, k_w, v_w = self.q_proj_weight * scale, self.k_proj_weight, self.v_proj_weight
        bias = self.in_proj_bias
        if bias is not None:
            bias = torch.cat([bias[:e] * scale, bias[e:]])
        return {
            "in_proj_weight": None,
            "in_proj_bias": bias,
            "use_separate_proj_weight": True,
            "q_proj_weight": q_w,
            "k_proj_weight": k_w,
            "v_proj_weight": v_w,
        }


def _gate(path: str, module: nn.Module, args: tuple, kwargs: dict, output):
    x = args[0] if args else next(iter(kwargs.values()), None)  # the first input, however it was passed
    if not isinstance(output, torch.Tensor) or not isinstance(x, torch.Tensor) or output.shape != x.shape:
        raise FusionError(
            f"layer '{path}' is missing in some slots (smaller depth) but changes its input's shape, so it "
            "cannot be skipped: models whose depth differs here need separate arrays"
        )
    return torch.where(module.slot_present, output, x)


def gate_skipped_layer(module: nn.Module, path: str) -> None:
    """Make `module` an identity for the slots whose `slot_present` is False."""
    module.register_buffer("slot_present", torch.ones((), dtype=torch.bool))
    gate = functools.partial(_gate, path)
    module._hfta_skip_gate = gate  # lets the vmap-free path (`hfta_nas.layers._slot_ops`) run the gate itself
    module.register_forward_hook(gate, with_kwargs=True)
