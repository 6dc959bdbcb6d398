"""CPU memory: keep freed memory in the process, as a caching allocator does.

By default glibc serves big allocations (the activations of an array: tens of
MB) with a fresh mmap and unmaps them on free, so every training step
page-faults its activations in again and the kernel zero-fills them. On the
project's CPU machine that was a quarter of a cnn1d array's step (B=32:
~15,000 minor page faults and ~37 ms of sys time per ~300 ms step;
`python -m benchmarks._profile --workload cnn1d` with and without
`--keep-freed-memory`). Raising glibc's mmap and trim thresholds keeps freed
memory in the heap for the next step, which is what PyTorch's CUDA caching
allocator does on GPUs.

The setting is process-wide and cannot be undone, so the library never makes
it on its own: the `hfta-nas` commands do (unless HFTA_NAS_KEEP_FREED_MEMORY=0),
and Python users call `keep_freed_memory()`. The process's resident memory
then stays at its peak; `retained_free_bytes` tells how much of it is free for
reuse, which `--array-size auto` counts as available.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_LARGEST = 2**31 - 1  # mallopt takes an int
ENV_SWITCH = "HFTA_NAS_KEEP_FREED_MEMORY"


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def keep_freed_memory() -> str:
    """Make glibc keep freed memory for reuse instead of returning it to the OS.

    Process-wide and irreversible. Returns what was set (or why nothing was),
    for logs and benchmark records.
    """
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return "not applied: no glibc mallopt here"
    mmap_threshold = next((v for v in (_LARGEST, 32 * 1024 * 1024) if libc.mallopt(_M_MMAP_THRESHOLD, v) == 1), None)
    trim_ok = libc.mallopt(_M_TRIM_THRESHOLD, _LARGEST) == 1
    return f"mallopt(M_MMAP_THRESHOLD={mmap_threshold}, M_TRIM_THRESHOLD={_LARGEST if trim_ok else 'rejected'})"


def keep_freed_memory_unless_disabled() -> str | None:
    """`keep_freed_memory()` unless the environment says HFTA_NAS_KEEP_FREED_MEMORY=0 (what the commands call)."""
    if os.environ.get(ENV_SWITCH, "1").strip() in ("0", "false", "no", "off"):
        return None
    return keep_freed_memory()


def retained_free_bytes() -> int:
    """Bytes glibc holds free in this process's heap (reusable without asking the OS), 0 if unknown."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return 0
    libc.mallinfo2.restype = _MallInfo2
    return int(libc.mallinfo2().fordblks)
