"""Throughput and memory benchmarks of model arrays against the usual alternatives.

`python -m benchmarks.throughput` (or `benchmarks.throughput.run_benchmark`)
trains the same B models on the same data five ways (serial, processes, vmap,
array, limit), prints a table of samples/s and ratios, and writes JSON.
See benchmarks/README.md for what each method means and measured numbers.
"""
