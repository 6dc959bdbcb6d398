"""Envelopes: models of one structure and different sizes, padded into one shape.

`_merge` builds the envelope tree (the largest size of every layer);
`_placement` says where each slot's own tensors sit in it; `_padded_layers`
holds the stand-ins that keep a smaller slot exact (activation and dropout
choices, skipped blocks); `_template` is the `Envelope` an array trains; and
`_probe` is the check that makes it safe: each slot's own model against its
place in the envelope, in float64, plus the multiply-add count of both.
"""
