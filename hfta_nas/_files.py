"""Writes that a re-run may trust: write to a temporary file, then rename.

A kill in the middle leaves the old file (or none), never a truncated one.
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any

import torch


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _atomic(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        # mkstemp creates 0600; give the file the permissions a plain open() would (0666 & ~umask)
        # so reports and exported configs stay readable by collaborators.
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    _atomic(Path(path), lambda stream: stream.write(text.encode()))


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    _atomic(Path(path), lambda stream: stream.write(data))


def save_weights(state_dict: dict[str, torch.Tensor], path: str | Path) -> None:
    # serialised in memory first: torch's zip writer reports a failed write to a file (a full
    # disk) as a RuntimeError; the plain write below raises the OSError that says what happened
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def cache_dir() -> Path | None:
    """Where results worth keeping between runs go (generated data, measured step costs):
    `$HFTA_NAS_CACHE_DIR` (empty or "off": no file cache), else `$XDG_CACHE_HOME/hfta-nas`,
    else `~/.cache/hfta-nas`; None when the cache is off or there is no home directory."""
    setting = os.environ.get("HFTA_NAS_CACHE_DIR")
    if setting is not None and setting.strip().lower() in ("", "0", "off", "none"):
        return None
    if setting:
        return Path(setting)
    try:
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hfta-nas"
    except RuntimeError:  # no home directory
        return None
