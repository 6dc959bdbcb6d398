"""Fused layers: the operators that run B slots' layers as one.

`_slot_ops` holds the faster array kernels for Linear, convolutions and
BatchNorm on [B, ...] tensors (and the vmap-free forward of plain Sequential
models); `_slot_layers` the drop-in stand-ins for the layers plain `vmap`
cannot fuse correctly (dropout, recurrent layers, attention); `_slot_random`
the counter-based random numbers that give each slot its own dropout stream.
Nothing here knows about envelopes or training: every part above builds on it.
"""

from hfta_nas.layers._slot_layers import SlotDropout
from hfta_nas.layers._slot_random import mix32, slot_keys

# What the dropout benchmark measures on its own (benchmarks/dropout.py); the
# engine's parts import the modules here directly.
__all__ = ["SlotDropout", "mix32", "slot_keys"]
