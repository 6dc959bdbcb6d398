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
