"""Peak memory of one method, measured around its whole run (build, warm-up, timing).

CUDA: `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`, minus
what was allocated before (tensors the caching allocator handed out; the
cache itself is not counted).

CPU: tracemalloc does not see torch's allocations, and `ru_maxrss` is a
lifetime peak that never goes down, so it cannot tell methods apart inside one
process. Linux can reset the peak (writing "5" to /proc/self/clear_refs sets
VmHWM to the current RSS), so each method is measured in place as
VmHWM (peak RSS during the method) - VmRSS (before it), after returning freed
heap pages to the OS with `malloc_trim`. The result is the growth of resident
memory: parameters, gradients, optimizer state, activations, and any
workspace the kernels allocate. It can under-count when the method reuses
pages an earlier method left in the allocator (trim makes that rare), and it
counts pages, so numbers below ~1 MB are noise. Where /proc/self/clear_refs is
not writable (non-Linux, some sandboxes), memory is reported as null with the
reason.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

import torch

_MB = 1024.0 * 1024.0


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"{field} not in /proc/self/status")


def _malloc_trim() -> None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def cpu_memory_supported() -> tuple[bool, str]:
    """Whether RSS peaks can be reset here, and if not why."""
    try:
        _status_kb("VmHWM")
        _reset_peak_rss()
    except OSError as error:
        return False, f"peak RSS cannot be reset on this system ({error}); memory not measured"
    return True, ""


def current_rss_mb() -> float | None:
    try:
        return _status_kb("VmRSS") / 1024.0
    except OSError:
        return None


class PeakMemory:
    """Context manager: `.mb` is the peak growth (MB) inside the block, or None with `.note`."""

    METHOD_CPU = "peak RSS growth (VmHWM after reset via /proc/self/clear_refs, minus VmRSS before)"
    METHOD_CUDA = "torch.cuda.max_memory_allocated growth"

    def __init__(self, device: torch.device, enabled: bool = True) -> None:
        self.device = device
        self.enabled = enabled
        self.mb: float | None = None
        self.note = "" if enabled else "memory measurement disabled"
        self._base = 0

    def __enter__(self) -> PeakMemory:
        if not self.enabled:
            return self
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return self
        _malloc_trim()
        try:
            _reset_peak_rss()
            self._base = _status_kb("VmRSS")
        except OSError as error:
            self.enabled = False
            self.note = f"peak RSS cannot be reset on this system ({error})"
        return self

    def __exit__(self, *exc) -> None:
        if not self.enabled:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mb = (torch.cuda.max_memory_allocated(self.device) - self._base) / _MB
        else:
            self.mb = max(0, _status_kb("VmHWM") - self._base) / 1024.0
