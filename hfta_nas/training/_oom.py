"""Arrays that do not fit: detect, split in two, retry, down to one model.

An array of B models needs about B times one model's memory. When it runs out
(a CUDA out-of-memory error, or on CPU a configurable memory budget that the
array's estimate exceeds), `train_in_halves` retries each half on its own,
recursively, so the work is never lost: a model that does not fit even alone
is reported as failed with the reason, and every other model trains.

The CPU budget comes from `HFTA_NAS_MEMORY_BUDGET` (e.g. "8GiB", "500MB",
or bytes). Exceeding RAM on CPU does not raise a catchable error, it gets the
process killed, which is why the check happens before the array is built.
"""

from __future__ import annotations

import gc
import logging
import os
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch import nn

from hfta_nas.errors import HftaNasError

log = logging.getLogger("hfta_nas")
T = TypeVar("T")
R = TypeVar("R")

BUDGET_VARIABLE = "HFTA_NAS_MEMORY_BUDGET"
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
# Optimizer state tensors kept per parameter (Adam: exp_avg and exp_avg_sq; SGD: momentum buffer).
_STATES = {"adam": 2, "adamw": 2, "sgd": 1, "rmsprop": 2}


class ArrayOutOfMemory(RuntimeError):
    """An array does not fit its device memory or the configured budget."""


def parse_bytes(text: str) -> int:
    """'8GiB', '500 MB', '1e9' -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", str(text).lower())
    if not match or match.group(2) not in _UNITS:
        raise HftaNasError(f"{BUDGET_VARIABLE}: cannot read {text!r} as a size; expected e.g. 8GiB, 500MB or 1000000.")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def memory_budget() -> int | None:
    """The CPU memory budget in bytes from the environment, or None for no limit."""
    text = os.environ.get(BUDGET_VARIABLE, "").strip()
    return parse_bytes(text) if text else None


def estimate_array_bytes(
    factory: Callable[[], nn.Module],
    input_shape: Sequence[int],
    *,
    batch_size: int,
    slots: int,
    dtype: torch.dtype,
    optimizer: str = "adam",
) -> int:
    """Memory an array of `slots` models needs for training, estimated without allocating.

    One model is built and run on the meta device: weights, gradients and optimizer state
    per parameter, plus every module's output for one batch twice (kept for backward, and
    its gradient). It is an estimate, good to tens of percent, not an allocator trace. A
    forward the meta device cannot run (it makes tensors on a fixed device) runs on the CPU.
    """
    try:
        with torch.device("meta"):
            parameters, activations = _tensor_counts(factory().to(dtype=dtype), input_shape, batch_size, dtype)
    except Exception:  # noqa: BLE001 - the user's forward on shapes only; the CPU run below says what fails
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            parameters, activations = _tensor_counts(factory().to(dtype=dtype), input_shape, batch_size, dtype)
    per_model = parameters * (2 + _STATES.get(optimizer, 2)) + 2 * activations
    return slots * per_model * torch.empty((), dtype=dtype).element_size()


def _tensor_counts(
    model: nn.Module, input_shape: Sequence[int], batch_size: int, dtype: torch.dtype
) -> tuple[int, int]:
    """(parameter and buffer elements, elements of every leaf module's output for one batch)."""
    parameters = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    activations = 0

    def count(_module: nn.Module, _inputs: Any, output: Any) -> None:
        nonlocal activations
        tensors = output if isinstance(output, (tuple, list)) else (output,)
        activations += sum(t.numel() for t in tensors if isinstance(t, torch.Tensor))

    hooks = [m.register_forward_hook(count) for m in model.modules() if not list(m.children())]
    try:
        model(torch.zeros(batch_size, *input_shape, dtype=dtype))
    finally:
        for hook in hooks:
            hook.remove()
    return parameters, activations


def check_budget(
    factory: Callable[[], nn.Module],
    input_shape: Sequence[int],
    *,
    batch_size: int,
    slots: int,
    dtype: torch.dtype,
    optimizer: str,
    device: torch.device,
    budget: int | None = None,
) -> None:
    """Raise ArrayOutOfMemory before building a CPU array whose estimate exceeds the budget."""
    budget = memory_budget() if budget is None else budget
    if budget is None or device.type != "cpu":
        return  # CUDA reports its own out-of-memory errors, which train_in_halves catches
    try:
        needed = estimate_array_bytes(
            factory, input_shape, batch_size=batch_size, slots=slots, dtype=dtype, optimizer=optimizer
        )
    except Exception as error:  # noqa: BLE001 - a model the meta device cannot run (data-dependent ops)
        log.warning(
            "cannot estimate the array's memory (%s: %s); the budget is not checked", type(error).__name__, error
        )
        return
    if needed > budget:
        raise ArrayOutOfMemory(
            f"an array of {slots} models needs about {needed / 2**20:.1f} MiB, "
            f"over the memory budget of {budget / 2**20:.1f} MiB ({BUDGET_VARIABLE})"
        )


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA's and the CPU allocator's out-of-memory errors (the CPU one is a plain RuntimeError:
    "DefaultCPUAllocator: can't allocate memory ... Error code 12"), the budget's, Python's."""
    if isinstance(error, (ArrayOutOfMemory, torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def train_in_halves(
    items: Sequence[T], train: Callable[[list[T]], R], on_split: Callable[[int, int, str], None] | None = None
) -> list[tuple[list[T], R | str]]:
    """Train `items` as one array; on out-of-memory, split in two and retry each half.

    Returns (chunk, result) pairs in the original order; a chunk of one item that still does
    not fit gets the error message as its result instead. Other errors propagate.
    """
    items = list(items)
    try:
        return [(items, train(items))]
    except Exception as error:  # noqa: BLE001 - anything that is not out-of-memory is re-raised
        if not is_out_of_memory(error):
            raise
        reason = f"{type(error).__name__}: {error}"
    _release_memory()
    if len(items) == 1:
        log.warning("out of memory with a single model: %s", reason)
        return [(items, f"out of memory even alone: {reason}")]
    half = (len(items) + 1) // 2
    log.warning(
        "array of %d models out of memory (%s); retrying as arrays of %d and %d",
        len(items),
        reason,
        half,
        len(items) - half,
    )
    if on_split is not None:
        on_split(len(items), half, reason)
    return train_in_halves(items[:half], train, on_split) + train_in_halves(items[half:], train, on_split)


def _release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
