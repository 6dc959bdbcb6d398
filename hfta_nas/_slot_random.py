"""Counter-based random numbers that belong to one slot.

Inside `vmap` every slot must draw its own dropout masks from its own seed, so
that a slot's masks do not depend on the array size or on its neighbours (slot
independence) and can be reproduced from the slot's dropout seed alone.
torch's generators are global state that vmap cannot split per slot, so masks
are made from a stateless integer hash of (slot key, call counter, the entry's
coordinates) instead: plain tensor ops over all slots at once. Hashing
coordinates rather than a flat index makes a slot padded into an envelope draw
at its own entries what it draws alone.

All arithmetic stays in int64 with values below 2**32 and multipliers below
2**31, so no product ever overflows (signed overflow is undefined in C++).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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


def slot_keys(seeds: torch.Tensor, stream: int | torch.Tensor) -> torch.Tensor:
    """Per-slot 32-bit keys for one random stream (e.g. one dropout module).

    `seeds` are int64 (any non-negative value below 2**63); `stream` separates
    the modules of one model so that two dropout layers draw different masks:
    one int for all slots, or an int64 tensor shaped like `seeds` (one per slot).
    """
    low = seeds & _MASK32
    high = (seeds >> 32) & _MASK32
    streams = stream & _MASK32 if isinstance(stream, torch.Tensor) else torch.full_like(seeds, stream & _MASK32)
    key = mix32(low ^ mix32(high ^ mix32(streams)))
    return key


def coordinate_bits(shape: Sequence[int], key: torch.Tensor, counter: torch.Tensor,
                    device: torch.device | str | None = None) -> torch.Tensor:
    """32-bit hashes (int64 values in [0, 2**32)) of (key, counter, coordinates) for every entry of
    one slot's `shape`: a pure function of the entry's coordinates, not of the extents.

    The coordinates are hashed one dim at a time (h = mix32(h ^ index), broadcast), so an
    entry's bits do not depend on how long any dim is: a slot padded into a wider envelope
    (features, channels, hidden units placed first in each dim) draws at its own entries exactly
    what it draws alone. Only the last dim's mix runs over the whole tensor (in place); the
    others run over the smaller leading blocks. `key` and `counter` are scalar int64 tensors, or
    [B, 1, ..., 1] (1 + len(shape) dims) for B slots at once: the result is then [B, *shape].
    """
    state = mix32(key ^ mix32(counter & _MASK32))
    batched = state.dim() == len(shape) + 1
    bits = state
    for dim, size in enumerate(shape):
        index = torch.arange(size, device=device or state.device, dtype=torch.int64)
        view = [1] * (len(shape) + batched)
        view[dim + batched] = size
        if dim < len(shape) - 1:
            bits = mix32(bits ^ index.view(view))
        else:  # the full-size mix: in place, shifting into one scratch buffer
            bits = bits ^ index.view(view)
            _mix32_(bits, torch.empty_like(bits))
    return bits


def uniform_like(x: torch.Tensor, key: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """Uniform [0, 1) values shaped like `x` (one slot's), a pure function of (key, counter,
    coordinates); the 24 high bits of the hash give floats exactly representable in float32."""
    bits = coordinate_bits(x.shape, key, counter, x.device)
    return (bits >> 8).to(x.dtype if x.is_floating_point() else torch.float32) * (1.0 / (1 << 24))


def _mix32_(x: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """`mix32` in place on a tensor the caller owns, shifting into `scratch` (same shape):
    the same values without a fresh allocation per shift (each costs its size in page faults)."""
    for last in (False, False, True):
        x.bitwise_xor_(torch.bitwise_right_shift(x, 16, out=scratch))
        if not last:
            x.mul_(_MULTIPLIER).bitwise_and_(_MASK32)
    return x


def keep_mask(shape: Sequence[int], key: torch.Tensor, counter: torch.Tensor, p: float | torch.Tensor,
              dtype: torch.dtype, device: torch.device | str | None = None) -> torch.Tensor:
    """Keep (True) where the entry's uniform u = (bits >> 8) / 2**24 is >= p, with p rounded to
    `dtype` (as torch rounds a float rate): [*shape], or [B, *shape] for per-slot `key` / `counter`
    (and `p`) of shape [B, 1, ..., 1]. In float32 and float64 this is exactly
    `uniform_like(torch.empty(shape, dtype=dtype), key, counter) >= p`; u >= p holds exactly when
    bits >= ceil(p * 2**24) << 8, an integer comparison with no float tensor. Runs on physical
    tensors (not under vmap).
    """
    bits = coordinate_bits(shape, key, counter, device)
    if isinstance(p, torch.Tensor):  # one rate per slot ([B, 1, ...]); 2**24 * p is exact in float64
        threshold = torch.ceil(p.to(dtype).to(torch.float64) * (1 << 24)).to(torch.int64)
    else:
        threshold = math.ceil(torch.tensor(p, dtype=dtype).item() * (1 << 24))
    return bits >= (threshold << 8)
