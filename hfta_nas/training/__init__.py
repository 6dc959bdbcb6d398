"""Training an array: the loop, what it optimises, and what keeps it running.

`_trainer` is `ArrayTrainer`, the epoch loop read top to bottom; `_objectives`
what each slot minimises and measures; `_checkpoint` the per-epoch checkpoints
that make a killed run resume bit-identically; `_run` is `hfta_nas.train`, one
call from names and numbers to a trained array; `_oom`, `_autosize` and
`_allocator` keep an array inside the device's memory (split in halves on
out-of-memory, size an array for `--array-size auto`, keep freed CPU memory).
"""
