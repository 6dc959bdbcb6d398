"""Counter-based random numbers that belong to one slot.

Inside `vmap` every slot must draw its own dropout masks from its own seed, so
that a slot's masks do not depend on the array size or on its neighbours (slot
independence) and can be reproduced from the slot's dropout seed alone.
torch's generators are global state that vmap cannot split per slot, so masks
are made from a stateless integer hash of (slot key, call counter, element
index) instead: plain tensor ops that vmap batches like any other.

All arithmetic stays in int64 with values below 2**32 and multipliers below
2**31, so no product ever overflows (signed overflow is undefined in C++).
"""

from __future__ import annotations

import math

import torch

_MASK32 = 0xFFFFFFFF
# Odd multiplier below 2**31 with good avalanche for this xor-shift-multiply mix.
_MULTIPLIER = 0x45D9F3B


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit mix of int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * _MULTIPLIER) & _MASK32
    x = x ^ (x >> 16)
    x = (x * _MULTIPLIER) & _MASK32
    return x ^ (x >> 16)


def slot_keys(seeds: torch.Tensor, stream: int) -> torch.Tensor:
    """Per-slot 32-bit keys for one random stream (e.g. one dropout module).

    `seeds` are int64 (any non-negative value below 2**63); `stream` separates
    the modules of one model so that two dropout layers draw different masks.
    """
    low = seeds & _MASK32
    high = (seeds >> 32) & _MASK32
    key = mix32(low ^ mix32(high ^ mix32(torch.full_like(seeds, stream & _MASK32))))
    return key


def uniform_like(x: torch.Tensor, key: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """Uniform [0, 1) values shaped like `x`, a pure function of (key, counter, position).

    `key` and `counter` are scalar int64 tensors (one slot's, under vmap);
    the 24 high bits of the hash give floats exactly representable in float32.
    """
    state = mix32(key ^ mix32(counter & _MASK32))
    position = torch.arange(x.numel(), device=x.device, dtype=torch.int64).view(x.shape)
    bits = mix32(mix32((position & _MASK32) ^ state) ^ ((position >> 32) + state & _MASK32))
    return (bits >> 8).to(x.dtype if x.is_floating_point() else torch.float32) * (1.0 / (1 << 24))


def _mix32_(x: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """`mix32` in place on a tensor the caller owns, shifting into `scratch` (same shape):
    the same values without a fresh allocation per shift (each costs its size in page faults)."""
    for last in (False, False, True):
        x.bitwise_xor_(torch.bitwise_right_shift(x, 16, out=scratch))
        if not last:
            x.mul_(_MULTIPLIER).bitwise_and_(_MASK32)
    return x


def keep_mask(shape: torch.Size, key: torch.Tensor, counter: torch.Tensor, p: float | torch.Tensor, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    """`uniform_like(torch.empty(shape, dtype=dtype), key, counter) >= p` as a bool tensor, computed
    with about a third of the passes over memory and two int64 buffers instead of ~30.

    The hash of a dropout mask is most of a dropout layer's cost (int64 ops
    over the whole activation; ~60% of the stability default's step). For
    fewer than 2**32 elements the high-word terms of `uniform_like` are
    constants, the mixes can run in place, and `u >= p` is an integer
    comparison: u = (bits >> 8) / 2**24 exactly in float32 and float64, so
    u >= p (p rounded to `dtype`, as torch compares) holds exactly when
    bits >= ceil(p * 2**24) << 8. Other cases take `uniform_like` itself.
    Runs on physical tensors (not under vmap): `key` and `counter` (and `p`,
    where each slot has its own rate) are scalars, or [B, 1, ...] tensors that
    broadcast against `shape` ([1, ...]).
    """
    numel = math.prod(shape)
    if dtype not in (torch.float32, torch.float64) or numel >= 2**32:
        return uniform_like(torch.empty(shape, dtype=dtype, device=device), key, counter) >= p
    state = mix32(key ^ mix32(counter & _MASK32))
    bits = torch.arange(numel, device=device, dtype=torch.int64).view(shape) ^ state
    scratch = torch.empty_like(bits)
    _mix32_(bits, scratch).bitwise_xor_(state)
    if isinstance(p, torch.Tensor):  # one rate per slot ([B, 1, ...]); 2**24 * p is exact in float64
        threshold = torch.ceil(p.to(dtype).to(torch.float64) * (1 << 24)).to(torch.int64)
    else:
        threshold = math.ceil(torch.tensor(p, dtype=dtype).item() * (1 << 24))
    return _mix32_(bits, scratch) >= (threshold << 8)
