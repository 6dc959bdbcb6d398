"""Faster fused kernels for Linear and Conv layers inside an array.

`ModelArray` runs the user's forward under `vmap`, and vmap's own batching
rules compute the right numbers for every layer. For the two layers that carry
almost all of the FLOPs they are slower than they need to be (measured on CPU,
1 thread, B=32 slots, batch 100, MNIST-1D; see benchmarks/_profile.py):

- `F.linear` with a batched weight becomes `bmm(x, w.transpose) + b`. Its
  backward returns the weight gradient *transposed*, and adding that into the
  weight's [B, O, I] slice of `flat.grad` is a strided pass about 8x slower
  than a contiguous add (0.8 ms vs 0.1 ms for 32 x 128 x 128), and the bias
  add is a separate pass over the output. `_BatchedLinear` computes
  `baddbmm(b, x, w^T)` forward and the weight gradient as `bmm(g^T, x)`,
  already in the [B, O, I] layout of the parameter.
- A convolution with a batched weight becomes one grouped convolution
  (groups=B) over [N, B*C, ...]. oneDNN runs grouped convolutions with few
  channels per group poorly (the 1-channel first layer of cnn1d: 8x slower
  than the same FLOPs ungrouped), and every call over the whole array
  allocates buffers of tens of MB that glibc maps fresh from the OS, so a
  large part of the time is page faults (~8,000 per call). One ordinary
  convolution per slot keeps each call's buffers small (reused, in cache) and
  measured 1.5-2x faster for cnn1d's layers, forward and backward. It is also
  exactly the computation a model trained alone does. For small convolutions
  the per-call overhead dominates, so below `_LOOP_MIN_MACS` multiply-adds
  per slot the grouped convolution is kept. The choice depends only on
  shapes, never on timings, so runs stay bit-for-bit reproducible.

The layers are swapped into the array's template by `make_fusable` (same
class with only `forward` changed, so parameters, buffers and state_dict keys
are untouched). Outside vmap (weights not batched) they run torch's own code.

To reach vmap's physical tensors, `physical_call` unwraps them at the
array's vmap level, runs the kernel with that level popped off functorch's
stack (so the kernel's ops, and autograd.Functions in it, are plain torch ops
recorded by ordinary autograd), and wraps the result back. This is what
`torch.library`'s `register_vmap` does, without its ~0.3 ms of Python per call
(pytree walks, signature binding), which would cost more than it saves on a
small model.
"""

from __future__ import annotations

import functools
import math
import os
from typing import NamedTuple

import torch
from torch import nn
from torch._C import _functorch
from torch._functorch.pyfunctorch import TransformType, coerce_cinterpreter, temporarily_pop_interpreter_stack

from hfta_nas.errors import HftaNasError

# Per-slot multiply-adds (one forward) from which a convolution runs as one
# call per slot rather than one grouped call. Each slot's call costs ~0.1 ms
# forward and ~0.2 ms backward besides its arithmetic; measured through the
# benchmark (CPU, 1 thread, B=32, batch 100): cnn1d (layers of 6.4e5 and
# 2e7) and cnn2d (5.2e5 and 7.4e6) train 10-20% faster with every layer
# looped than with 2e6 as the bound, bn_cnn (1e6, 1.5e7) the same within
# noise; at ~1e5 (an 8x8 image, batch 10) the grouped call is 3x faster.
_LOOP_MIN_MACS = 500_000
LOWERINGS = ("auto", "loop", "grouped")


def lowering() -> str:
    """`HFTA_NAS_LOWERING`: auto (the default), loop (every convolution and BatchNorm one call per
    slot) or grouped (one call over the array: a grouped convolution, vmap's BatchNorm over B*C
    channels). Forcing one is for tests of each path and for measuring them against each other."""
    value = os.environ.get("HFTA_NAS_LOWERING", "auto").strip().lower() or "auto"
    if value not in LOWERINGS:
        raise HftaNasError(f"HFTA_NAS_LOWERING must be one of {', '.join(LOWERINGS)}, got {value!r}.")
    return value


def conv_per_slot(device: torch.device, per_slot_macs: int) -> bool:
    """Whether a convolution runs as one call per slot. auto: on the CPU from `_LOOP_MIN_MACS` up
    (measured, see above); on a GPU never: B small launches per layer are what fusion removes, and
    one grouped convolution is the HFTA lowering."""
    mode = lowering()
    if mode != "auto":
        return mode == "loop"
    return device.type == "cpu" and per_slot_macs >= _LOOP_MIN_MACS


def batch_norm_per_slot(device: torch.device) -> bool:
    """Whether a BatchNorm runs as one call per slot (`_BatchNormLoop`: the ops of a model alone) or,
    on a GPU by default, as vmap's one batch norm over the array's B*C channels (one launch)."""
    mode = lowering()
    if mode != "auto":
        return mode == "loop"
    return device.type == "cpu"


def _slot_first(tensor: torch.Tensor | None, dim: int | None, batch_size: int) -> torch.Tensor | None:
    """`tensor` with its slot dim first ([B, ...]); an unbatched one is expanded (no copy)."""
    if tensor is None:
        return None
    if dim is None:
        return tensor.expand(batch_size, *tensor.shape)
    return tensor if dim == 0 else tensor.movedim(dim, 0)  # no autograd node for the common case


def under_vmap() -> bool:
    """Whether the innermost functorch transform is a vmap (`physical_call` runs its kernel only then)."""
    cdata = _functorch.peek_interpreter_stack()
    return cdata is not None and cdata.key() == TransformType.Vmap


def physical_call(kernel, *tensors: torch.Tensor | None) -> torch.Tensor | None:
    """`kernel(batch_size, dims, *physical)` on vmap's physical tensors, its result wrapped back.

    `dims` holds each tensor's slot dim (None: not batched, or None given).
    Returns None (the caller then runs its ordinary code) unless the
    innermost functorch transform is a vmap, as it is inside
    `ModelArray.__call__`, and the kernel returns (output, its slot dim)
    rather than None.
    """
    if not under_vmap():
        return None
    interpreter = coerce_cinterpreter(_functorch.peek_interpreter_stack())
    level = interpreter.level()
    unwrapped = [_functorch._unwrap_batched(t, level) if t is not None else (None, None) for t in tensors]
    with temporarily_pop_interpreter_stack():
        result = kernel(interpreter.batch_size(), tuple(dim for _, dim in unwrapped), *(t for t, _ in unwrapped))
    if result is None:
        return None
    out, out_dim = result
    return _functorch._add_batch_dim(out, out_dim, level)


class _ReusedBuffer:
    """One [B, ...] buffer a layer writes every step, handed out again once nothing uses it.

    Each step's Linear/Conv outputs and input gradients are tens of MB. Freed
    and allocated afresh, glibc returns them to the OS and page-faults them
    back in (zero-filled) the next step: ~20% of a cnn1d array's step on CPU
    (unless the process keeps freed memory, see `hfta_nas.training._allocator`). This
    keeps the memory of the last buffer and gives it out again when no tensor
    shares its storage any more (not the output still held by a graph, a
    saved tensor, a view or the caller), checked through the storage's use
    count. Each hand-out is a new tensor over that storage, never the cached
    one, so autograd's metadata never carries over between steps.
    """

    def __init__(self) -> None:
        self._tensor: torch.Tensor | None = None

    def take(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        cached = self._tensor
        if (
            cached is None
            or cached.shape != shape
            or cached.dtype != like.dtype
            or cached.device != like.device
            or torch._C._storage_Use_Count(cached.untyped_storage()._cdata) > 2
        ):  # 2: cached + this query
            cached = self._tensor = like.new_empty(shape)  # still used (or first use): a fresh one
        return like.new_empty((0,)).set_(cached.untyped_storage(), 0, shape, cached.stride())


def _reused(module: nn.Module, role: str) -> _ReusedBuffer:
    """The module's reusable buffer for `role` (made on first use; lives as long as the template)."""
    buffers = module.__dict__.get("_hfta_reused_buffers")
    if buffers is None:
        buffers = module.__dict__["_hfta_reused_buffers"] = {}
    buffer = buffers.get(role)
    if buffer is None:  # not setdefault: that would build a throw-away buffer object on every call
        buffer = buffers[role] = _ReusedBuffer()
    return buffer


def _slot(tensor: torch.Tensor | None, b: int) -> torch.Tensor | None:
    """Slot b's row of a [B, ...] tensor, None for an absent (optional) one."""
    return None if tensor is None else tensor[b]


class _BatchedLinear(torch.autograd.Function):
    """y[b] = x[b] @ w[b]^T + bias[b] for x [B, M, I], w [B, O, I], bias [B, O] or None,
    then ReLU (in place, as `_ConvLoop` does) if `relu`.

    The backward gives the weight gradient as bmm(g^T, x): contiguous [B, O, I],
    the layout of the parameter's slice of `flat.grad` (autograd's bmm rule
    would give it transposed). Written with differentiable ops, so a
    create_graph backward through it works.
    """

    # Old-style forward(ctx, ...): it runs below vmap (no functorch transform
    # active), and skips the signature binding that setup_context costs.
    @staticmethod
    def forward(ctx, owner, relu, x, weight, bias):
        weight_t = weight.transpose(1, 2)
        out = _reused(owner, "out").take((x.shape[0], x.shape[1], weight.shape[1]), x)
        if bias is None:
            torch.bmm(x, weight_t, out=out)
        else:
            torch.baddbmm(bias.unsqueeze(1), x, weight_t, out=out)
        if relu:
            out.relu_()
        ctx.save_for_backward(x, weight, out if relu else None)
        ctx.has_bias = bias is not None
        ctx.relu, ctx.owner = relu, owner
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, out = ctx.saved_tensors
        if ctx.relu:
            grad = torch.ops.aten.threshold_backward(grad, out, 0)
        grad_x = None
        if ctx.needs_input_grad[2]:
            if torch.is_grad_enabled():  # a create_graph backward: differentiable ops only (no out=)
                grad_x = torch.bmm(grad, weight)
            else:
                grad_x = torch.bmm(grad, weight, out=_reused(ctx.owner, "grad_x").take(tuple(x.shape), x))
        grad_weight = torch.bmm(grad.transpose(1, 2), x) if ctx.needs_input_grad[3] else None
        grad_bias = grad.sum(1) if ctx.has_bias and ctx.needs_input_grad[4] else None
        return None, None, grad_x, grad_weight, grad_bias


def _autocast(*tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """Under autocast, the inputs of a matmul or convolution in autocast's dtype, as torch's own
    linear and conv would take them: the fused kernels write into buffers (`out=`), which autocast
    does not reach. The casts are ordinary autograd ops, so gradients reach the float32 weights."""
    first = tensors[0]
    device = first.device.type
    if not torch.is_autocast_enabled(device) or not first.is_floating_point():
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) if t is not None else None for t in tensors)


def _linear_kernel(owner: nn.Module, batch_size: int, in_dims, x, weight, bias, relu: bool = False):
    x_dim, weight_dim, bias_dim = in_dims
    if weight_dim is None:
        return None  # one weight for all slots: not an array's layer; torch's own forward
    x, weight, bias = _autocast(x, weight, bias)
    weight = _slot_first(weight, weight_dim, batch_size)
    bias = _slot_first(bias, bias_dim, batch_size)
    x = _slot_first(x, x_dim, batch_size)  # a shared input is expanded, as vmap would
    lead = x.shape[1:-1]
    out = _BatchedLinear.apply(owner, relu, x.reshape(batch_size, -1, x.shape[-1]), weight, bias)
    return out.view(batch_size, *lead, out.shape[-1]), 0


class SlotLinear(nn.Linear):
    """nn.Linear whose array forward is `_BatchedLinear` (see the module docstring)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name: callers may pass input=
        out = physical_call(functools.partial(_linear_kernel, self), input, self.weight, self.bias)
        return super().forward(input) if out is None else out


def _per_slot_macs(conv: nn.modules.conv._ConvNd, shape: torch.Size) -> int:
    """Multiply-adds of one slot's forward, for a per-slot input of `shape` ([N, C, *spatial] or [C, *spatial])."""
    spatial = shape[-len(conv.kernel_size) :]
    samples = shape[0] if len(shape) == len(conv.kernel_size) + 2 else 1
    outputs = math.prod(s // st for s, st in zip(spatial, conv.stride))  # ~ output positions
    return samples * outputs * conv.out_channels * (conv.in_channels // conv.groups) * math.prod(conv.kernel_size)


def explicit_padding(conv: nn.modules.conv._ConvNd) -> list[int] | None:
    """The conv's zero padding as ints per spatial dim, None where torch pads the input itself
    (padding_mode other than zeros, or an asymmetric 'same')."""
    if conv.padding_mode != "zeros":
        return None
    if conv.padding == "valid":
        return [0] * len(conv.kernel_size)
    if conv.padding == "same":
        totals = [d * (k - 1) for k, d in zip(conv.kernel_size, conv.dilation)]
        return None if any(t % 2 for t in totals) else [t // 2 for t in totals]
    return list(conv.padding)


class _ConvLoop(torch.autograd.Function):
    """y[b] = conv(x[b], w[b]) + bias[b] for each slot b, then ReLU if `relu`; x is [B, N, C, *spatial].

    One ordinary convolution per slot (see the module docstring), with the
    buffers managed here rather than by autograd: the slots' outputs go
    straight into one [B, ...] output, ReLU is applied in place to each
    slot's cache-resident result, and backward masks each slot's gradient and
    writes its input gradient into one [B, ...] buffer. A Conv -> ReLU pair so
    allocates two activation-sized tensors per step instead of four
    (conv output, ReLU output, ReLU gradient, input gradient); each fresh
    allocation of tens of MB costs its size in page faults (~10 ms for 16 MB),
    more than the arithmetic of the layer's element-wise ops.
    Backward uses differentiable ops, so double backward works.
    """

    @staticmethod
    def forward(ctx, conv, padding, relu, x, weight, bias):
        nd = len(conv.kernel_size)
        ctx.conv_args = (list(conv.stride), padding, list(conv.dilation), False, [0] * nd, conv.groups)
        ctx.relu, ctx.conv = relu, conv
        ctx.boxes = getattr(conv, "_hfta_slot_boxes", None)
        out = None
        for b in range(x.shape[0]):
            x_b, weight_b, bias_b, args, _ = _operands(ctx, b, x, weight, bias)
            y = torch.convolution(x_b, weight_b, bias_b, *args)
            if relu:
                y = y.relu_()
            if out is None:
                out = _reused(conv, "out").take((x.shape[0], y.shape[0], weight.shape[1], *y.shape[2:]), y)
            _put(out[b], y, 1)
        ctx.save_for_backward(x, weight, out if relu else None)
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, out = ctx.saved_tensors
        need = [ctx.needs_input_grad[3], ctx.needs_input_grad[4], ctx.has_bias and ctx.needs_input_grad[5]]
        grad_x = _reused(ctx.conv, "grad_x").take(tuple(x.shape), x) if need[0] else None
        grad_weight = torch.empty_like(weight, memory_format=torch.contiguous_format) if need[1] else None
        grad_bias = weight.new_empty(weight.shape[:2]) if need[2] else None
        for b in range(x.shape[0]):
            g = grad[b]
            if ctx.relu:
                g = torch.ops.aten.threshold_backward(g, out[b], 0)
            x_b, weight_b, _, args, box = _operands(ctx, b, x, weight, None)
            if box is not None:
                g = g[:, : box.out_channels]
            gx, gw, gb = torch.ops.aten.convolution_backward(g, x_b, weight_b, [weight_b.shape[0]], *args, need)
            if need[0]:
                _put(grad_x[b], gx, 1)
            if need[1]:
                if box is None:
                    grad_weight[b] = gw
                else:
                    grad_weight[b] = 0.0
                    grad_weight[b][box.weight] = gw
            if need[2]:
                _put(grad_bias[b], gb, 0)
        return None, None, None, grad_x, grad_weight, grad_bias


class SlotBox(NamedTuple):
    """Where a slot smaller than the envelope sits in a convolution: its channels, its
    (centred) kernel as an index of the weight, and its own padding."""

    out_channels: int
    in_channels: int
    weight: tuple[slice, ...]
    padding: list[int]


def _operands(ctx, b: int, x, weight, bias) -> tuple:
    """Slot b's convolution: (input, weight, bias, convolution args, its SlotBox or None), the
    envelope's own tensors, or a smaller slot's part of them (its channels, its centred kernel)."""
    box = ctx.boxes[b] if ctx.boxes is not None else None
    bias_b = _slot(bias, b)
    if box is None:
        return x[b], weight[b], bias_b, ctx.conv_args, None
    stride, _, dilation, transposed, output_padding, groups = ctx.conv_args
    args = (stride, box.padding, dilation, transposed, output_padding, groups)
    bias_b = None if bias_b is None else bias_b[: box.out_channels]
    return x[b][:, : box.in_channels], weight[b][box.weight], bias_b, args, box


def _put(target: torch.Tensor, value: torch.Tensor, dim: int) -> None:
    """target = value, where value may cover only the first entries of `dim` (a smaller slot):
    the rest is zero, what the envelope's zero weights give."""
    size = value.shape[dim]
    if size == target.shape[dim]:
        target.copy_(value)
        return
    target.narrow(dim, size, target.shape[dim] - size).zero_()
    target.narrow(dim, 0, size).copy_(value)


class _BatchNormLoop(torch.autograd.Function):
    """y[b] = batch_norm(x[b]) with slot b's weight, bias and running stats, then ReLU if `relu`.

    vmap's batching rule for batch_norm moves the slot dim into the channels
    (two activation-sized transposing copies each way) and builds the result
    from several element-wise passes over the whole array, each a fresh
    allocation of tens of MB (bn_cnn, B=32: most of its step). One
    `native_batch_norm` per slot is the computation a model trained alone
    does, on a cache-sized slice, and updates the slot's row of the stacked
    running stats in place as torch does. `stats` (running mean and var, or
    None) is a tuple so that autograd does not see them as inputs.
    """

    @staticmethod
    def forward(ctx, owner, relu, batch_stats, momentum, eps, stats, x, weight, bias):
        running_mean, running_var = stats
        out = _reused(owner, "out").take(tuple(x.shape), x)
        save_mean = x.new_empty((x.shape[0], x.shape[2])) if batch_stats else None
        save_invstd = x.new_empty((x.shape[0], x.shape[2])) if batch_stats else None
        for b in range(x.shape[0]):
            y, mean, invstd = torch.native_batch_norm(
                x[b],
                _slot(weight, b),
                _slot(bias, b),
                _slot(running_mean, b),
                _slot(running_var, b),
                batch_stats,
                momentum,
                eps,
            )
            if relu:
                y = y.relu_()
            out[b] = y
            if batch_stats:
                save_mean[b], save_invstd[b] = mean, invstd
        ctx.save_for_backward(x, weight, out if relu else None, save_mean, save_invstd)
        ctx.relu, ctx.batch_stats, ctx.eps, ctx.stats, ctx.owner = relu, batch_stats, eps, stats, owner
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, out, save_mean, save_invstd = ctx.saved_tensors
        running_mean, running_var = ctx.stats
        need = [
            ctx.needs_input_grad[6],
            weight is not None and ctx.needs_input_grad[7],
            ctx.needs_input_grad[8] and weight is not None,
        ]
        grads = [
            _reused(ctx.owner, "grad_x").take(tuple(x.shape), x) if need[0] else None,
            *(torch.empty_like(weight) if wanted else None for wanted in need[1:]),
        ]
        for b in range(x.shape[0]):
            g = grad[b]
            if ctx.relu:
                g = torch.ops.aten.threshold_backward(g, out[b], 0)
            parts = torch.ops.aten.native_batch_norm_backward(
                g,
                x[b],
                _slot(weight, b),
                _slot(running_mean, b),
                _slot(running_var, b),
                _slot(save_mean, b),
                _slot(save_invstd, b),
                ctx.batch_stats,
                ctx.eps,
                need,
            )
            for target, part in zip(grads, parts):
                if target is not None:
                    target[b] = part
        return None, None, None, None, None, None, *grads


class _SlotConvMixin:
    """Conv forward for arrays: one ordinary convolution per slot when each slot's work is large."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name: callers may pass input=
        out = None
        # outside vmap (an array of one, slots one by one) a slot's convolution is torch's own
        if under_vmap() and conv_per_slot(input.device, _per_slot_macs(self, input.shape)):
            out = physical_call(self._loop_kernel, input, self.weight, self.bias)
        return super().forward(input) if out is None else out  # small: vmap's grouped convolution

    def _loop_kernel(self, batch_size: int, in_dims, x, weight, bias, relu: bool = False):
        if in_dims[1] is None:
            return None  # one weight for all slots: not an array's layer; torch's own forward
        x, weight, bias = _autocast(x, weight, bias)
        x = _slot_first(x, in_dims[0], batch_size)
        weight = _slot_first(weight, in_dims[1], batch_size)
        bias = _slot_first(bias, in_dims[2], batch_size)
        padding = explicit_padding(self)
        if padding is not None and x.dim() == len(self.kernel_size) + 3:
            return _ConvLoop.apply(self, padding, relu, x, weight, bias), 0
        # Padding torch applies itself, or per-slot inputs without a batch dim:
        # the same loop through autograd. unbind (not x[b]) so that backward
        # stacks the slots' gradients in one copy instead of zero-filling a
        # full-size tensor per slot.
        xs, weights = x.unbind(0), weight.unbind(0)
        biases = bias.unbind(0) if bias is not None else [None] * batch_size
        out = torch.stack([self._conv_forward(xs[b], weights[b], biases[b]) for b in range(batch_size)])
        return (torch.relu(out) if relu else out), 0


class SlotConv1d(_SlotConvMixin, nn.Conv1d):
    pass


class SlotConv2d(_SlotConvMixin, nn.Conv2d):
    pass


class SlotConv3d(_SlotConvMixin, nn.Conv3d):
    pass


SLOT_OPS: dict[type[nn.Module], type[nn.Module]] = {
    nn.Linear: SlotLinear,
    nn.Conv1d: SlotConv1d,
    nn.Conv2d: SlotConv2d,
    nn.Conv3d: SlotConv3d,
}


# ---------------------------------------------------------------- without vmap
# For a template that is an nn.Sequential of the layers below, vmap itself is
# the remaining overhead: functional_call swaps every parameter in and out,
# vmap wraps and unwraps every tensor, and each layer re-enters torch through
# Python (~0.7 ms per forward for the 3-layer MLP, 5% of its training step).
# These layers have an exact implementation on the physical [B, ...] tensors,
# the same ops the vmap path runs (BatchNorm: the ops a model trained alone
# runs, slot by slot), so `native_forward` chains them directly.
# Anything else (another module type, hooks, a small convolution) makes the
# array use vmap, with the same results.

# Element-wise layers: the same op on [B, N, ...] as on each slot's [N, ...].
ELEMENTWISE = frozenset(
    {
        nn.Identity,
        nn.ReLU,
        nn.ReLU6,
        nn.LeakyReLU,
        nn.ELU,
        nn.SELU,
        nn.CELU,
        nn.GELU,
        nn.SiLU,
        nn.Mish,
        nn.Tanh,
        nn.Sigmoid,
        nn.Softplus,
        nn.Hardtanh,
        nn.Hardswish,
        nn.Hardsigmoid,
        nn.Softsign,
        nn.Tanhshrink,
        nn.LogSigmoid,
    }
)


# Pooling layers and their spatial dims: each sample is pooled on its own, so
# [B, N, ...] runs as a batch of B * N samples.
POOLING_DIMS = {
    **dict.fromkeys((nn.MaxPool1d, nn.AvgPool1d, nn.AdaptiveMaxPool1d, nn.AdaptiveAvgPool1d), 1),
    **dict.fromkeys((nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveMaxPool2d, nn.AdaptiveAvgPool2d), 2),
    **dict.fromkeys((nn.MaxPool3d, nn.AvgPool3d, nn.AdaptiveMaxPool3d, nn.AdaptiveAvgPool3d), 3),
}

# Per-slot input dims each BatchNorm accepts ([N, C] or [N, C, L] for 1d, ...).
_BATCH_NORM_DIMS = {nn.BatchNorm1d: (2, 3), nn.BatchNorm2d: (4,), nn.BatchNorm3d: (5,)}

# Layers whose kernel applies a following ReLU itself, in place.
_TAKES_RELU = frozenset({SlotLinear, SlotConv1d, SlotConv2d, SlotConv3d, *_BATCH_NORM_DIMS})


class NeedsVmap(Exception):
    """Raised by a native forward when this call (shapes, mode) needs the vmap path."""


def _has_hooks(module: nn.Module) -> bool:
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or getattr(module, "_backward_pre_hooks", None)
    )


def _only_skip_gate(module: nn.Module) -> bool:
    """Whether the module's one hook is the array's skip gate
    (`hfta_nas.envelope._padded_layers.gate_skipped_layer`)."""
    hooks = list(module._forward_hooks.values())
    gate = getattr(module, "_hfta_skip_gate", None)
    return (
        gate is not None
        and len(hooks) == 1
        and hooks[0] is gate
        and not module._forward_pre_hooks
        and not module._backward_hooks
        and not getattr(module, "_backward_pre_hooks", None)
    )


def _native_step(module: nn.Module, prefix: str, aliases: dict[str, str], relu: bool = False):
    """fn(leaves, x) computing `module` on physical [B, ...] tensors, or None if unsupported.
    `relu`: a convolution also applies the ReLU that follows it."""
    if _has_hooks(module):
        if not _only_skip_gate(module):
            return None
        step = _native_layer(module, prefix, aliases, relu)
        if step is None:
            return None
        present = prefix + "slot_present"

        def gated(leaves, x):  # a slot of smaller depth passes x through (the gate's rule, on [B, ...])
            y = step(leaves, x)
            if y.shape != x.shape:
                raise NeedsVmap  # the vmap path's gate raises the error that names the layer
            return torch.where(leaves[present].view(-1, *([1] * (x.dim() - 1))), y, x)

        return gated
    return _native_layer(module, prefix, aliases, relu)


def _native_layer(module: nn.Module, prefix: str, aliases: dict[str, str], relu: bool = False):
    kind = type(module)
    if kind is nn.Sequential:
        children = list(module.named_children())
        steps, index = [], 0
        while index < len(children):
            name, child = children[index]
            following = children[index + 1][1] if index + 1 < len(children) else None
            # Linear/Conv -> ReLU: the ReLU runs inside the layer's kernel, in place.
            relu = (
                type(child) in _TAKES_RELU
                and type(following) is nn.ReLU
                and not _has_hooks(following)
                and not _has_hooks(child)
            )
            steps.append(_native_step(child, f"{prefix}{name}.", aliases, relu=relu))
            index += 2 if relu else 1
        if any(step is None for step in steps):
            return None

        def sequential(leaves, x):
            for step in steps:
                x = step(leaves, x)
            return x

        return sequential
    if kind is SlotLinear or kind in (SlotConv1d, SlotConv2d, SlotConv3d):
        weight = aliases[prefix + "weight"]
        bias = aliases[prefix + "bias"] if module.bias is not None else None
        if kind is SlotLinear:

            def linear(leaves, x):
                return _linear_kernel(
                    module, x.shape[0], (0, 0, 0), x, leaves[weight], leaves[bias] if bias else None, relu
                )[0]

            return linear

        def conv(leaves, x):
            if x.dim() != len(module.kernel_size) + 3 or not conv_per_slot(
                x.device, _per_slot_macs(module, x.shape[1:])
            ):
                raise NeedsVmap  # unbatched per-slot input, or small: vmap's grouped convolution
            return module._loop_kernel(x.shape[0], (0, 0, 0), x, leaves[weight], leaves[bias] if bias else None, relu)[
                0
            ]

        return conv
    if kind in _BATCH_NORM_DIMS:
        return _native_batch_norm(module, prefix, aliases, relu)
    if kind in POOLING_DIMS and not getattr(module, "return_indices", False):
        spatial = POOLING_DIMS[kind]
        forward = functools.partial(_windows_max, _single(module.kernel_size)) if _tiles(module) else module.forward

        def pool(leaves, x):
            if x.dim() == spatial + 2:  # per-slot [C, *spatial]: the slots are the batch
                return module.forward(x)
            if x.dim() != spatial + 3:
                raise NeedsVmap  # a shape torch refuses: the vmap path raises torch's own error
            return forward(x.flatten(0, 1)).unflatten(0, x.shape[:2])  # [B * N, C, ...]: same op per sample

        return pool
    if kind in ELEMENTWISE:
        return lambda leaves, x: module.forward(x)
    if kind is nn.Flatten:

        def flatten(leaves, x):
            dims = x.dim() - 1  # per-slot dims
            if dims == 0:
                raise NeedsVmap
            return x.flatten(module.start_dim % dims + 1, module.end_dim % dims + 1)

        return flatten
    if hasattr(module, "native_step"):  # the array's own per-slot layers (dropout, activation choice)
        return module.native_step(prefix)
    return None


def _native_batch_norm(module: nn.modules.batchnorm._BatchNorm, prefix: str, aliases: dict[str, str], relu: bool):
    """BatchNorm on [B, N, C, ...] as nn.BatchNorm's forward does it, one slot at a time (`_BatchNormLoop`)."""
    if module.momentum is None:
        return None  # a cumulative average: left to vmap, which runs nn.BatchNorm's own forward
    weight = aliases[prefix + "weight"] if module.affine else None
    bias = aliases[prefix + "bias"] if module.affine else None
    slot_dims = _BATCH_NORM_DIMS[type(module)]

    def batch_norm(leaves, x):
        if x.dim() - 1 not in slot_dims or (module.training and x.shape[1] * math.prod(x.shape[3:]) == 1):
            raise NeedsVmap  # a shape torch refuses: the vmap path raises torch's own error
        if not batch_norm_per_slot(x.device):
            raise NeedsVmap  # one batch norm over the array's channels, by vmap's rule
        tracked = leaves.get(prefix + "num_batches_tracked")
        if module.training and module.track_running_stats and tracked is not None:
            tracked.add_(1)
        use_running = not module.training or module.track_running_stats
        stats = (
            (leaves.get(prefix + "running_mean"), leaves.get(prefix + "running_var")) if use_running else (None, None)
        )
        batch_stats = module.training or all(stat is None for stat in stats)
        return _BatchNormLoop.apply(
            module,
            relu,
            batch_stats,
            module.momentum,
            module.eps,
            stats,
            x,
            leaves[weight] if weight else None,
            leaves[bias] if bias else None,
        )

    return batch_norm


def _tiles(module: nn.Module) -> bool:
    """A MaxPool1d whose windows tile the input (kernel = stride, no padding or dilation): `_windows_max`."""
    return (
        type(module) is nn.MaxPool1d
        and _single(module.kernel_size) == _single(module.stride or module.kernel_size)
        and _single(module.padding) == 0
        and _single(module.dilation) == 1
        and not module.ceil_mode
    )


def _single(value: int | tuple[int, ...]) -> int:
    return value[0] if isinstance(value, (tuple, list)) else value


def _windows_max(kernel: int, x: torch.Tensor) -> torch.Tensor:
    """max_pool1d with kernel = stride as a max over the last axis cut into windows (a tail shorter
    than a window dropped, as max_pool1d drops it): the same values, and the gradient goes to the
    first maximum of each window as max_pool1d's does, ties included (tests/test_slot_ops.py). Forward
    and backward 1.6x faster on CPU ([800, 32, 40], an array of 8 MNIST-1D CNNs: 9.1 -> 5.5 ms)."""
    windows = x.shape[-1] // kernel
    return x[..., : windows * kernel].unflatten(-1, (windows, kernel)).max(-1).values


def native_forward(template: nn.Module, aliases: dict[str, str]):
    """fn(leaves, x) -> [B, ...] output of the template without vmap, or None if it has other layers.

    `leaves` maps canonical parameter names, buffer names and the dropout
    layers' per-slot random state to their [B, ...] tensors,
    `aliases` every parameter name (tied ones too) to its canonical name. The
    function raises NeedsVmap when a call must take the vmap path.
    """
    return _native_step(template, "", aliases)


def global_hooks_set() -> bool:
    """Whether module hooks are registered globally: they must see every module's call, which only vmap makes."""
    return bool(nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks)
