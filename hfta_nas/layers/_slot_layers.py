"""Drop-in replacements for layers that plain `vmap` cannot fuse correctly.

`ModelArray` runs one template copy of the user's model under `vmap`. Most
layers batch as they are; these do not:

- Dropout draws from torch's global generator, which vmap cannot split per
  slot. `SlotDropout` draws from the slot's own dropout seed instead.
- `nn.MultiheadAttention` without weights calls a fused attention kernel
  that vmap loops over; `FusableMultiheadAttention` keeps to plain matmuls.
- `nn.Embedding(padding_idx=...)` would train its padding row under vmap;
  `FusableEmbedding` keeps it frozen as torch does.
- `nn.GRU` / `nn.LSTM` call fused ATen kernels that have no batching rule.
  `FusableGRU` / `FusableLSTM` compute the same equations with ordinary ops and
  keep the parameter names, so state_dicts stay interchangeable.

Linear and Conv layers fuse under plain vmap too, but slowly; `make_fusable`
also gives them the faster array kernels of `_slot_ops.py`.

`make_fusable` swaps them into the template and refuses what it cannot fuse
exactly, naming the layer.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Mapping, Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.parametrizations import _SpectralNorm

from hfta_nas.errors import FusionError
from hfta_nas.layers._slot_ops import SLOT_OPS, _slot_first, physical_call
from hfta_nas.layers._slot_random import dropout_multiplier, slot_keys


class SlotDropout(nn.Module):
    """Dropout whose masks come from per-slot buffers `slot_key` and `calls`.

    Under `vmap` both buffers are [B]-stacked, so each slot sees its own
    scalars; `calls` counts this module's training forwards per slot so that
    every step draws a fresh mask, and restarts when a slot is replaced.
    `channel_dims` > 0 drops whole channels (Dropout1d/2d/3d semantics).
    The mask of all slots is made at once on the physical [B, ...] tensors
    (`hfta_nas.layers._slot_random.dropout_multiplier`), the same operations under vmap and
    in the vmap-free path, so both draw the same masks.
    """

    def __init__(self, p: float, channel_dims: int = 0, per_slot_rate: bool = False) -> None:
        super().__init__()
        self.p = p  # with per_slot_rate: the largest slot's rate (0: no slot drops anything)
        self.channel_dims = channel_dims
        self.per_slot_rate = False
        self.register_buffer("slot_key", torch.zeros((), dtype=torch.int64))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        if per_slot_rate:
            self.use_slot_rates()

    def use_slot_rates(self) -> None:
        """From now on each slot drops with its own rate (the buffer `rate`, starting at p: a per-slot
        constant like slot_key)."""
        if not self.per_slot_rate:
            self.per_slot_rate = True
            self.register_buffer("rate", torch.full((), self.p, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        self.calls.add_(1)
        rate = self.rate if self.per_slot_rate else None
        if rate is None and self.p == 1.0:
            return x * 0.0
        # Under vmap the multipliers of all slots are made at once on the physical
        # tensors (no per-op batching); outside it from this module's scalars.
        multiplier = physical_call(self._multiplier_kernel, x, self.slot_key, self.calls, rate)
        if multiplier is None:
            multiplier = self._multiplier(x.shape, self.slot_key, self.calls, rate, x)
        return x * multiplier

    def native_step(self, prefix: str):
        """This layer on [B, ...] tensors, for the vmap-free path (`hfta_nas.layers._slot_ops.native_forward`)."""

        def dropout(leaves, x):
            if not self.training or self.p == 0.0:
                return x
            return self.native_forward(
                x, leaves[prefix + "slot_key"], leaves[prefix + "calls"], leaves.get(prefix + "rate")
            )

        return dropout

    def native_forward(
        self, x: torch.Tensor, slot_key: torch.Tensor, calls: torch.Tensor, rate: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`forward` for all slots at once on physical tensors: x [B, ...], slot_key, calls (and rate) [B]."""
        calls.add_(1)
        if rate is None and self.p == 1.0:
            return x * 0.0
        multiplier, _ = self._multiplier_kernel(x.shape[0], (0, 0, 0, 0), x, slot_key, calls, rate)
        return x * multiplier

    def _multiplier_kernel(self, batch_size: int, dims, x, slot_key, calls, rate=None):
        """[B, *mask shape] multipliers of all slots (physical tensors; see `physical_call`)."""
        x_dim = dims[0]
        per_slot = x.shape if x_dim is None else x.shape[:x_dim] + x.shape[x_dim + 1 :]
        key = _slot_first(slot_key, dims[1], batch_size)
        counter = _slot_first(calls, dims[2], batch_size)
        rate = _slot_first(rate, dims[3], batch_size)
        return self._multiplier(per_slot, key, counter, rate, x), 0

    def _multiplier(self, shape: torch.Size, slot_key, calls, rate, x) -> torch.Tensor:
        """The multipliers for one slot's input `shape`: slot_key / calls (and rate) are one slot's
        scalars, or [B] for B slots (the result then [B, ...]). Channel dropout draws one value per
        (sample, channel): only the leading dims are hashed, the trailing spatial dims broadcast."""
        hashed = shape[: len(shape) - self.channel_dims] if self.channel_dims else shape
        lead = (*slot_key.shape, *([1] * len(hashed)))  # each slot's scalars against its own mask
        p = self.p if rate is None else rate.reshape(lead)
        multiplier = dropout_multiplier(hashed, slot_key.reshape(lead), calls.reshape(lead), p, x.dtype, x.device)
        return multiplier.view(*multiplier.shape, *([1] * (len(shape) - len(hashed))))

    def extra_repr(self) -> str:
        rate = ", per-slot rate" if self.per_slot_rate else ""
        return f"p={self.p}, channel_dims={self.channel_dims}{rate}"


class _FusableRecurrent(nn.RNNBase):
    """Shared machinery of the GRU/LSTM rewrites: parameters named as in torch.

    The stand-ins are instances of the class they replace (`isinstance(m, nn.LSTM)` holds in a
    user's code), with torch's bookkeeping of an RNN's weights kept; only their forward, and no
    cuDNN weight flattening, are their own."""

    gates: int = 0

    def __init__(self, source: nn.RNNBase) -> None:
        nn.Module.__init__(self)  # not RNNBase's: the weights are the source's, registered below
        if getattr(source, "proj_size", 0):
            raise FusionError("nn.LSTM with proj_size > 0 cannot be fused; use proj_size=0.")
        self.input_size = source.input_size
        self.hidden_size = source.hidden_size
        self.num_layers = source.num_layers
        self.bias = source.bias
        self.batch_first = source.batch_first
        self.bidirectional = source.bidirectional
        self.directions = 2 if source.bidirectional else 1
        # Parameters are supplied by ModelArray through functional_call; these
        # copies only fix names, shapes and dtypes.
        for name, param in source.named_parameters(recurse=False):
            self.register_parameter(name, nn.Parameter(param.detach().clone()))
        self.mode, self.proj_size, self.dropout = source.mode, 0, source.dropout
        self._flat_weights_names = list(source._flat_weights_names)
        self._all_weights = [list(names) for names in source._all_weights]
        self._init_flat_weights()
        # one dropout layer per boundary between layers (its own stream and counter): a slot with fewer
        # layers than its envelope draws at its boundaries what it draws alone
        self.inter_layer_dropouts = nn.ModuleList(
            [SlotDropout(source.dropout) for _ in range(source.num_layers - 1)] if source.dropout > 0 else []
        )

    def flatten_parameters(self) -> None:
        """Nothing: the forward below uses ordinary ops, not cuDNN's flat weight buffer."""

    def _weights(self, layer: int, direction: int) -> tuple[torch.Tensor, ...]:
        suffix = f"_l{layer}" + ("_reverse" if direction == 1 else "")
        w_ih = getattr(self, "weight_ih" + suffix)
        w_hh = getattr(self, "weight_hh" + suffix)
        b_ih = getattr(self, "bias_ih" + suffix) if self.bias else None
        b_hh = getattr(self, "bias_hh" + suffix) if self.bias else None
        return w_ih, w_hh, b_ih, b_hh

    def _cell(self, gi: torch.Tensor, h: torch.Tensor, c, w_hh, b_hh):
        raise NotImplementedError

    def forward(self, x: torch.Tensor, hx=None):
        unbatched = x.dim() == 2
        if unbatched:
            x = x.unsqueeze(0 if self.batch_first else 1)
        if not self.batch_first:
            x = x.transpose(0, 1)  # -> [N, L, F]
        n = x.shape[0]
        h0, c0 = self._initial_state(hx, n, x, unbatched)
        finals_h, finals_c = [], []
        layer_input = below_output = x  # below_output: the last layer's output before dropout
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(self.directions):
                index = layer * self.directions + direction
                w_ih, w_hh, b_ih, b_hh = self._weights(layer, direction)
                gi = F.linear(layer_input, w_ih, b_ih)  # all steps at once
                h = h0[index]
                c = c0[index] if c0 is not None else None
                # unbind once: indexing gi[:, t] in the loop would make every
                # step's backward zero-fill a gi-sized gradient (quadratic in L).
                gi_steps = gi.unbind(1)
                steps = range(len(gi_steps)) if direction == 0 else reversed(range(len(gi_steps)))
                out_steps = [None] * len(gi_steps)
                for t in steps:
                    h, c = self._cell(gi_steps[t], h, c, w_hh, b_hh)
                    out_steps[t] = h
                outputs.append(torch.stack(out_steps, dim=1))
                finals_h.append(h)
                finals_c.append(c)
            layer_output = torch.cat(outputs, dim=2) if self.directions == 2 else outputs[0]
            layer_present = getattr(self, "layer_present", None)
            if layer_present is not None and layer > 0:
                # A slot with fewer layers passes its last layer's output and final
                # states through the envelope's extra layers (exact selection).
                present = layer_present[layer]
                layer_output = torch.where(present, layer_output, below_output)  # before dropout, as alone
                for d in range(1, self.directions + 1):
                    below = len(finals_h) - d - self.directions
                    finals_h[-d] = torch.where(present, finals_h[-d], finals_h[below])
                    if c0 is not None:
                        finals_c[-d] = torch.where(present, finals_c[-d], finals_c[below])
            layer_input = below_output = layer_output
            if layer < len(self.inter_layer_dropouts):
                layer_input = self.inter_layer_dropouts[layer](layer_input)
        output = layer_input if self.batch_first else layer_input.transpose(0, 1)
        h_n = torch.stack(finals_h)
        c_n = torch.stack(finals_c) if c0 is not None else None
        if unbatched:
            output = output.squeeze(0 if self.batch_first else 1)
            h_n = h_n.squeeze(1)
            c_n = c_n.squeeze(1) if c_n is not None else None
        return output, self._final_state(h_n, c_n)

    def enable_layer_gates(self) -> None:
        """Per-slot `layer_present` [num_layers]: slots of fewer layers skip the top ones."""
        self.register_buffer("layer_present", torch.ones(self.num_layers, dtype=torch.bool))

    def _zeros(self, n: int, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(self.num_layers * self.directions, n, self.hidden_size)

    def _as_batched(self, state: torch.Tensor, unbatched: bool) -> torch.Tensor:
        return state.unsqueeze(1) if unbatched else state


class FusableGRU(_FusableRecurrent, nn.GRU):
    """nn.GRU's equations (gate order r, z, n) with ops that vmap batches."""

    def _initial_state(self, hx, n, x, unbatched):
        return (self._zeros(n, x) if hx is None else self._as_batched(hx, unbatched)), None

    def _cell(self, gi, h, c, w_hh, b_hh):
        gh = F.linear(h, w_hh, b_hh)
        i_r, i_z, i_n = gi.chunk(3, dim=-1)
        h_r, h_z, h_n = gh.chunk(3, dim=-1)
        r = torch.sigmoid(i_r + h_r)
        z = torch.sigmoid(i_z + h_z)
        candidate = torch.tanh(i_n + r * h_n)
        return (1 - z) * candidate + z * h, None

    def _final_state(self, h_n, c_n):
        return h_n


class FusableLSTM(_FusableRecurrent, nn.LSTM):
    """nn.LSTM's equations (gate order i, f, g, o) with ops that vmap batches."""

    def _initial_state(self, hx, n, x, unbatched):
        if hx is None:
            return self._zeros(n, x), self._zeros(n, x)
        return self._as_batched(hx[0], unbatched), self._as_batched(hx[1], unbatched)

    def _cell(self, gi, h, c, w_hh, b_hh):
        gates = gi + F.linear(h, w_hh, b_hh)
        i, f, g, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c

    def _final_state(self, h_n, c_n):
        return h_n, c_n


class FusableMultiheadAttention(nn.MultiheadAttention):
    """nn.MultiheadAttention that always takes torch's explicit-matmul path.

    nn.MultiheadAttention.forward may pick fused kernels (the inference fast
    path, or scaled_dot_product_attention when no weights are wanted) that vmap
    runs as a loop over slots. Calling F.multi_head_attention_forward with
    need_weights=True selects bmm + softmax, which fuses: same numbers, same
    parameters, as torch's own slow path.
    """

    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        need_weights=True,
        attn_mask=None,
        average_attn_weights=True,
        is_causal=False,
    ):
        transpose = self.batch_first and query.dim() == 3
        if transpose:
            query, key, value = (t.transpose(1, 0) for t in (query, key, value))
        output, weights = F.multi_head_attention_forward(
            query,
            key,
            value,
            self.embed_dim,
            self.num_heads,
            bias_k=self.bias_k,
            bias_v=self.bias_v,
            add_zero_attn=self.add_zero_attn,
            dropout_p=self.dropout,
            out_proj_weight=self.out_proj.weight,
            out_proj_bias=self.out_proj.bias,
            training=self.training,
            key_padding_mask=key_padding_mask,
            need_weights=True,
            attn_mask=attn_mask,
            average_attn_weights=average_attn_weights,
            is_causal=is_causal,
            **self._projections(query.dtype),
        )
        if transpose:
            output = output.transpose(1, 0)
        return output, (weights if need_weights else None)

    def _projections(self, dtype: torch.dtype) -> dict[str, torch.Tensor | bool | None]:
        """The in-projection arguments of F.multi_head_attention_forward: the module's own."""
        separate = not self._qkv_same_embed_dim
        return {
            "in_proj_weight": self.in_proj_weight,
            "in_proj_bias": self.in_proj_bias,
            "use_separate_proj_weight": separate,
            "q_proj_weight": self.q_proj_weight if separate else None,
            "k_proj_weight": self.k_proj_weight if separate else None,
            "v_proj_weight": self.v_proj_weight if separate else None,
        }


@contextlib.contextmanager
def no_attention_fast_path():
    """Turn off torch's fused inference kernels for attention/transformer layers
    (they have no vmap batching rule and would loop over slots)."""
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


class FusableEmbedding(nn.Embedding):
    """nn.Embedding whose padding row gets no gradient under vmap too.

    vmap's batching rule for embedding's backward ignores padding_idx, so the
    padding row would be trained. Detaching that row before the lookup gives
    the same forward and torch's gradient (zero for the padding row).
    """

    def forward(self, tokens):
        weight = self.weight
        if self.padding_idx is not None:
            is_padding = torch.zeros(weight.shape[0], 1, dtype=torch.bool, device=weight.device)
            is_padding[self.padding_idx] = True
            weight = torch.where(is_padding, weight.detach(), weight)
        return F.embedding(tokens, weight, self.padding_idx, None, self.norm_type, self.scale_grad_by_freq, False)


class FusableSpectralNorm(_SpectralNorm):
    """torch's spectral-norm parametrization with its power iteration written into the u and v
    buffers by copy_ instead of `out=` (which vmap cannot batch): the same numbers, per slot."""

    @torch.no_grad()
    def _power_method(self, weight_mat: torch.Tensor, n_power_iterations: int) -> None:
        for _ in range(n_power_iterations):
            self._u.copy_(F.normalize(torch.mv(weight_mat, self._v), dim=0, eps=self.eps))
            self._v.copy_(F.normalize(torch.mv(weight_mat.H, self._u), dim=0, eps=self.eps))


class _CumulativeBatchNormMixin:
    """BatchNorm with momentum=None (running stats as a cumulative average), fusable.

    torch computes the average's factor as 1 / float(num_batches_tracked), a
    host read that vmap cannot batch (and each slot has its own count). Here
    the factor stays a tensor per slot: the batch is normalised with its own
    statistics as torch does, and the running stats are updated in place with
    the same formula (biased mean, unbiased variance).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and self.track_running_stats):
            return super().forward(x)
        self.num_batches_tracked.add_(1)
        factor = 1.0 / self.num_batches_tracked.to(x.dtype)
        dims = [0, *range(2, x.dim())]
        with torch.no_grad():
            mean, var = x.mean(dims), x.var(dims, unbiased=True)
            self.running_mean.mul_(1.0 - factor).add_(mean * factor)
            self.running_var.mul_(1.0 - factor).add_(var * factor)
        return F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)


class FusableCumulativeBatchNorm1d(_CumulativeBatchNormMixin, nn.BatchNorm1d):
    pass


class FusableCumulativeBatchNorm2d(_CumulativeBatchNormMixin, nn.BatchNorm2d):
    pass


class FusableCumulativeBatchNorm3d(_CumulativeBatchNormMixin, nn.BatchNorm3d):
    pass


_CUMULATIVE_BATCH_NORM = {
    nn.BatchNorm1d: FusableCumulativeBatchNorm1d,
    nn.BatchNorm2d: FusableCumulativeBatchNorm2d,
    nn.BatchNorm3d: FusableCumulativeBatchNorm3d,
}
_CHANNEL_DROPOUT_DIMS = {nn.Dropout1d: 1, nn.Dropout2d: 2, nn.Dropout3d: 3}
_REFUSED = {
    nn.AlphaDropout: "AlphaDropout is not supported in arrays; use nn.Dropout",
    nn.FeatureAlphaDropout: "FeatureAlphaDropout is not supported in arrays; use nn.Dropout",
    nn.RNN: "nn.RNN is not supported in arrays; use nn.GRU or nn.LSTM",
}


def _replacement(module: nn.Module, path: str) -> nn.Module | None:
    """The fusable stand-in for `module`, None to keep it, or a FusionError."""
    where = path or "<root>"
    for refused, reason in _REFUSED.items():
        if type(module) is refused:
            raise FusionError(f"layer '{where}' ({type(module).__name__}): {reason}.")
    if type(module) in _CHANNEL_DROPOUT_DIMS:
        return SlotDropout(module.p, _CHANNEL_DROPOUT_DIMS[type(module)])
    if type(module) is nn.Dropout:
        return SlotDropout(module.p)
    if type(module) is nn.GRU:
        return FusableGRU(module)
    if type(module) is nn.LSTM:
        return FusableLSTM(module)
    if isinstance(module, nn.MultiheadAttention) and module.dropout > 0:
        raise FusionError(
            f"layer '{where}' (MultiheadAttention) has attention dropout={module.dropout}, drawn inside a fused "
            "kernel from torch's global generator, not per slot: build it with dropout=0"
        )
    if type(module) is _SpectralNorm:
        module.__class__ = FusableSpectralNorm  # same state; its power iteration batches
        return None
    if type(module) in _CUMULATIVE_BATCH_NORM and module.momentum is None:
        module.__class__ = _CUMULATIVE_BATCH_NORM[type(module)]  # same state, per-slot average factor
        return None
    if type(module) is nn.Embedding:
        if module.max_norm is not None or module.sparse:
            raise FusionError(
                f"layer '{where}' (Embedding): max_norm and sparse=True cannot be fused; use max_norm=None, "
                "sparse=False."
            )
        module.__class__ = FusableEmbedding  # same state, exact gradient
        return None
    if type(module) is nn.MultiheadAttention:
        module.__class__ = FusableMultiheadAttention  # same state, fusable forward
        return None
    if type(module) in SLOT_OPS:
        module.__class__ = SLOT_OPS[type(module)]  # same state, faster fused forward (_slot_ops.py)
        return None
    return None


def make_fusable(template: nn.Module) -> nn.Module:
    """Swap un-fusable layers of `template` (in place) for exact stand-ins."""
    root_replacement = _replacement(template, "")
    if root_replacement is not None:
        return root_replacement
    for path, module in list(template.named_modules()):
        for child_name, child in list(module.named_children()):
            child_path = f"{path}.{child_name}" if path else child_name
            replacement = _replacement(child, child_path)
            if replacement is not None:
                setattr(module, child_name, replacement)
    return template


def init_slot_randomness(
    template: nn.Module, dropout_seeds: torch.Tensor, own_modules: Sequence[Mapping[str, str]] | None = None
) -> dict[str, torch.Tensor]:
    """Stacked `slot_key` / `calls` buffers for every SlotDropout of the template.

    A layer's stream is its path in the slot's own model (hashed), not its position among the
    dropout layers nor its path in an envelope: the same layer draws the same masks in the slot's
    model alone and in an envelope whose extra layers shift it (a deeper slot's hidden blocks
    before a shared final dropout). `own_modules` gives, per slot, the slot's own module paths
    -> the envelope's (`SlotEmbedding.modules`); None: the template's paths are every slot's own.
    """
    envelope_to_own = None if own_modules is None else [{env: own for own, env in m.items()} for m in own_modules]
    buffers: dict[str, torch.Tensor] = {}
    for path, module in template.named_modules():
        if not isinstance(module, SlotDropout):
            continue
        prefix = f"{path}." if path else ""
        if envelope_to_own is None:
            stream: int | torch.Tensor = zlib.crc32(path.encode())
        else:
            stream = torch.tensor(
                [zlib.crc32(own_dropout_path(path, own).encode()) for own in envelope_to_own],
                dtype=torch.int64,
                device=dropout_seeds.device,
            )
        buffers[prefix + "slot_key"] = slot_keys(dropout_seeds, stream)
        buffers[prefix + "calls"] = torch.zeros_like(dropout_seeds)
    return buffers


def own_dropout_path(path: str, envelope_to_own: Mapping[str, str]) -> str:
    """The slot's own path of the template's module `path`: its nearest mapped ancestor's own path
    plus the rest (a recurrent layer's `inter_layer_dropouts.k` has no module in the user's model).
    A module the slot skips gets a path this way too; its output reaches nothing of the slot's."""
    parts = path.split(".") if path else []
    for cut in range(len(parts), -1, -1):
        head = ".".join(parts[:cut])
        if head in envelope_to_own:
            own = envelope_to_own[head]
            rest = ".".join(parts[cut:])
            return f"{own}.{rest}" if own and rest else own or rest
    return path
