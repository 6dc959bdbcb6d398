"""The CPU allocator setting of the training commands (hfta_nas/training/_allocator.py).

Each case runs in a fresh interpreter: the setting is process-wide and
irreversible, and must not leak into the test process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt/mallinfo2")

MB = 1024 * 1024

# Frees a 64 MB tensor and reports what the heap kept for reuse.
_PROBE = textwrap.dedent("""
    import json, sys, torch
    from hfta_nas.training._allocator import retained_free_bytes
    from hfta_nas.training._run import set_up_command_process
    if sys.argv[1] == "command":
        set_up_command_process(None)
    x = torch.ones(16 * 1024 * 1024)  # 64 MB
    del x
    print(json.dumps({"retained": retained_free_bytes()}))
""")


def _retained_after_free(mode: str, env: dict[str, str] | None = None) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **(env or {})},
    )
    return json.loads(done.stdout)["retained"]


def test_commands_keep_freed_memory_for_the_next_step():
    # glibc's default returns a freed 64 MB block to the OS at once (it was an mmap);
    # the commands' setting keeps it in the heap, where the next step's activations reuse it.
    assert _retained_after_free("plain") < 16 * MB
    assert _retained_after_free("command") >= 64 * MB


def test_environment_switch_turns_it_off():
    assert _retained_after_free("command", {"HFTA_NAS_KEEP_FREED_MEMORY": "0"}) < 16 * MB


def test_keep_freed_memory_reports_what_it_set():
    code = "from hfta_nas.training._allocator import keep_freed_memory; print(keep_freed_memory())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "M_MMAP_THRESHOLD=" in out and "M_TRIM_THRESHOLD=2147483647" in out
