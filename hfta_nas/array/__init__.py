"""`ModelArray`: B models stacked into one flat [B, P] tensor and run as one.

It owns the stacking (the flat parameter layout and its per-parameter views),
the fused forward (vmap over one template, or the vmap-free path), the
envelope state of arrays of different sizes, slot surgery (drop, replace,
load) and the fusion checks (`check_fusable`, `FusionSignature`). The public
names are re-exported by `hfta_nas`.
"""
