"""Counter-based random numbers that belong to one slot.

Inside `vmap` every slot must draw its own dropout masks from its own seed, so
that a slot's masks do not depend on the array size or on its neighbours (slot
independence) and can be reproduced from the slot's dropout seed alone.
torch's generators are global state that vmap cannot split per slot, so masks
are made from a stateless integer hash of (slot key, call counter, the entry's
coordinates) instead: plain tensor ops over all slots at once, the same
operations on every device and for any number of slots (no loop over slots).

Coordinates, not a flat index: an entry's hash takes its index in each dim,
hashed on its own (`_coordinate_hashes`), so it never depends on how long a dim
is. A slot padded into an envelope (its features, channels and hidden units
placed first in each dim, `hfta_nas.envelope._placement`) therefore draws at its own entries
exactly what it draws alone; entries in the padding draw something, but their
activations are zero and stay zero.

Cost: the coordinate hashes are made once per shape; per call, the slots'
states and one xor over the leading block ([B, N] for [B, N, C] activations)
are small, and over the whole activation run one xor, two xor-shift-multiply
rounds, one integer comparison and one multiply of that boolean mask by the
scale, which gives the multiplier in the activation's dtype (no `where`: it
runs an order of magnitude slower than integer ops on CPU). Arithmetic is int64 with values below 2**32
and multipliers below 2**31, so no product overflows (signed overflow is
undefined in C++). int32 would be cheaper per pass, but a multiply that cannot
overflow int32 (16-bit value, 15-bit multiplier) spreads a bit by at most 15
positions, which needs more rounds than it saves.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch

_MASK32 = 0xFFFFFFFF
# Odd multiplier below 2**31 with good avalanche for this xor-shift-multiply mix.
_MULTIPLIER = 0x45D9F3B
# The step counter advances the state by this odd constant (2**32 / golden ratio**2, below 2**31):
# a Weyl sequence, spread over all 32 bits by the rounds that follow.
_STEP = 0x61C88647


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


def _xorshift(x: torch.Tensor) -> torch.Tensor:
    return x ^ (x >> 16)


def _rounds_(x: torch.Tensor) -> torch.Tensor:
    """Two xor-shift-multiply rounds in place: x <- g(g(x)), g(x) = ((x ^ x >> 16) * M) mod 2**32.

    A bijection of [0, 2**32) (mix32 without its last xor-shift, which changes only the low 16
    bits); the bits used for decisions are the high ones, the best mixed bits of a product."""
    for _ in range(2):
        x.bitwise_xor_(x >> 16).mul_(_MULTIPLIER).bitwise_and_(_MASK32)
    return x


# Where the hashes of the leading coordinates and of the last coordinate start (any two values).
_LEADING_ORIGIN, _LAST_ORIGIN = 0x9E3779B9, 0x2545F491


@functools.lru_cache(maxsize=64)
def _coordinate_hashes(shape: tuple[int, ...], origin: int, trailing: int, device: torch.device) -> torch.Tensor:
    """Hashes of coordinates, dim by dim, xor-shifted: [*shape] and `trailing` dims of size 1 (to
    broadcast against the dims that follow), made once per shape and device.

    h <- g(g(h ^ index)) one dim at a time (broadcast) from `origin`, so an entry's hash does not
    depend on any dim's extent: a slot padded into a wider envelope finds its own entries' here."""
    h = torch.tensor(origin, dtype=torch.int64, device=device)
    for size in shape:
        h = _rounds_(h.unsqueeze(-1) ^ torch.arange(size, dtype=torch.int64, device=device))
    return _xorshift(h).view(*shape, *([1] * trailing))


def coordinate_bits(
    shape: Sequence[int], key: torch.Tensor, counter: torch.Tensor, device: torch.device | str | None = None
) -> torch.Tensor:
    """32-bit hashes (int64 values in [0, 2**32)) of (key, counter, coordinates) for every entry of
    one slot's `shape`: a pure function of the entry's coordinates, not of the extents.

    An entry (i..., j) gets g(g(s ^ r[i...] ^ c[j])): s = key + counter * STEP (mod 2**32) is the
    slot's state at this step, r and c hash the leading coordinates and the last one (cached,
    `_coordinate_hashes`), and g is a xor-shift-multiply round. Neither r nor c depends on how long
    any dim is, so a slot padded into a wider envelope (features, channels, hidden units placed
    first in each dim) draws at its own entries exactly what it draws alone. Hashed rather than
    raw coordinates make neighbouring entries' inputs differ in many bits (two rounds leave a
    measurable correlation between inputs that differ only in their low bits). Per call only the
    slots' states ([B]) and one xor over the leading block ([B, N] for [B, N, C]) run on small
    tensors; the xor with c and the two rounds run over the whole tensor, in place (the rounds'
    first xor-shift is applied to the operands, as xor-shifts distribute over xor). For a fixed
    entry the map from s is a bijection, so with a uniformly random key every entry's bits are
    uniform on [0, 2**32). `key` and `counter` are scalar int64 tensors, or [B, 1, ..., 1]
    (1 + len(shape) dims) for B slots at once: the result is then [B, *shape]. Counters below 2**32.
    """
    device = key.device if device is None else torch.device(device) if isinstance(device, str) else device
    state = _xorshift(torch.add(key, counter, alpha=_STEP).bitwise_and_(_MASK32))
    if len(shape) == 0:
        bits = state ^ _coordinate_hashes((), _LEADING_ORIGIN, 0, device)
    else:
        rows = state ^ _coordinate_hashes(tuple(shape[:-1]), _LEADING_ORIGIN, 1, device)
        bits = torch.bitwise_xor(rows, _coordinate_hashes((shape[-1],), _LAST_ORIGIN, 0, device))
    bits.mul_(_MULTIPLIER).bitwise_and_(_MASK32)
    return bits.bitwise_xor_(bits >> 16).mul_(_MULTIPLIER).bitwise_and_(_MASK32)


def uniform_like(x: torch.Tensor, key: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """Uniform [0, 1) values shaped like `x` (one slot's), a pure function of (key, counter,
    coordinates); the 24 high bits of the hash give floats exactly representable in float32."""
    bits = coordinate_bits(x.shape, key, counter, x.device)
    return (bits >> 8).to(x.dtype if x.is_floating_point() else torch.float32) * (1.0 / (1 << 24))


@functools.lru_cache(maxsize=256)
def _threshold(p: float, dtype: torch.dtype) -> int:
    """Keep where bits >= this: u = (bits >> 8) / 2**24 >= p exactly when bits >= ceil(p * 2**24) << 8,
    with p rounded to `dtype` as torch rounds a float rate (2**24 * p is exact in float64)."""
    return math.ceil(torch.tensor(p, dtype=dtype).item() * (1 << 24)) << 8


def _thresholds(p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`_threshold` of one rate per slot ([B, 1, ...] float)."""
    return torch.ceil(p.to(dtype).to(torch.float64) * (1 << 24)).to(torch.int64) << 8


def keep_mask(
    shape: Sequence[int],
    key: torch.Tensor,
    counter: torch.Tensor,
    p: float | torch.Tensor,
    dtype: torch.dtype,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Keep (True) where the entry's uniform u = (bits >> 8) / 2**24 is >= p, with p rounded to
    `dtype` (as torch rounds a float rate): [*shape], or [B, *shape] for per-slot `key` / `counter`
    (and `p`) of shape [B, 1, ..., 1]. In float32 and float64 this is exactly
    `uniform_like(torch.empty(shape, dtype=dtype), key, counter) >= p`. `dropout_multiplier` is the
    same mask as the multiplier a dropout layer applies; this boolean form is for inspection.
    """
    bits = coordinate_bits(shape, key, counter, device)
    threshold = _thresholds(p, dtype) if isinstance(p, torch.Tensor) else _threshold(p, dtype)
    return bits >= threshold


def dropout_multiplier(
    shape: Sequence[int],
    key: torch.Tensor,
    counter: torch.Tensor,
    p: float | torch.Tensor,
    dtype: torch.dtype,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """What a dropout layer multiplies its input by: 1 / (1 - p) where `keep_mask` keeps, 0 where
    it drops, in `dtype` ([*shape], or [B, *shape] for per-slot `key` / `counter` and `p`).

    A float `p` must be below 1 (the layer returns zeros for p = 1 without drawing); a per-slot
    `p` ([B, 1, ...]) may be 1 for some slots, which then get 0 everywhere. The keep decision
    is one integer comparison; the boolean mask times the scale (a 0-dim tensor of `dtype`) is one
    more pass, no `where` (an order of magnitude slower on CPU).
    """
    bits = coordinate_bits(shape, key, counter, device)
    if isinstance(p, torch.Tensor):
        rate = p.to(torch.float64)
        scale = torch.where(rate < 1.0, 1.0 / (1.0 - rate), torch.zeros_like(rate)).to(dtype)
        return torch.ge(bits, _thresholds(p, dtype)) * scale
    threshold, scale = _threshold_and_scale(p, dtype, bits.device)
    return torch.ge(bits, threshold) * scale


@functools.lru_cache(maxsize=256)
def _threshold_and_scale(p: float, dtype: torch.dtype, device: torch.device) -> tuple[int, torch.Tensor]:
    """`_threshold(p, dtype)` and 1 / (1 - p) as a 0-dim tensor of `dtype` (a boolean mask times it
    is the multiplier in `dtype`)."""
    return _threshold(p, dtype), torch.tensor(1.0 / (1.0 - p), dtype=dtype, device=device)
