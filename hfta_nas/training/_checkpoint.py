"""Per-epoch checkpoints of a training array, so that a killed run loses at most one epoch.

At every epoch's end the trainer's `state_dict()` is written to one file,
atomically (temporary file, fsync, rename): a kill leaves the previous epoch's
checkpoint or the new one, never half of one. A re-run that builds the same
array restores it and continues bit-identically (`ArrayTrainer.restore`); the
file is removed when the array ends. `HFTA_NAS_CHECKPOINT=off` turns it off.

A checkpoint that cannot be written (a full disk) or read (damaged, from
another version) costs its progress, never the run: a warning, and training
goes on (or starts from epoch 0).
"""

from __future__ import annotations

import io
import logging
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hfta_nas._files import atomic_write_bytes

log = logging.getLogger(__name__)
SWITCH = "HFTA_NAS_CHECKPOINT"
FORMAT = 2  # bumped when the saved state changes shape or meaning; other formats are not resumed
# (2: dropout masks hashed by coordinates, one stream per layer path)


def enabled() -> bool:
    """Whether checkpoints are written: yes unless $HFTA_NAS_CHECKPOINT is off / 0 / false / no."""
    return os.environ.get(SWITCH, "on").strip().lower() not in ("off", "0", "false", "no")


def save(path: Path, state: dict[str, Any]) -> bool:
    """Write `state` to `path` as one unit; False (and a warning) when it could not be written."""
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, **state}, buffer)
    try:
        atomic_write_bytes(path, buffer.getvalue())
    except OSError as error:
        log.warning("could not write the checkpoint %s (%s); training goes on without it", path, error)
        return False
    return True


def load(path: Path, *, remove_unreadable: bool = True) -> dict[str, Any] | None:
    """The state saved at `path`, or None when there is none or it is unreadable (then removed, unless
    `remove_unreadable` is False: a file another process may still be writing or using)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:  # none, or removed by its array's end meanwhile
        return None
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as error:
        log.warning("ignoring the unreadable checkpoint %s (%s)", path, error)
        state = None
    if state is not None and (not isinstance(state, dict) or state.get("format") != FORMAT):
        log.warning("ignoring the checkpoint %s: written by another version", path)
        state = None
    if state is None and remove_unreadable:
        remove(path)
    return state


def remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        log.warning("could not remove the checkpoint %s (%s)", path, error)


def remove_empty_folders(folder: Path | None) -> None:
    """A study's checkpoint folder and the `checkpoints` folder above it, when nothing is left in them
    (another worker's files keep them)."""
    for empty in (folder, folder.parent) if folder is not None else ():
        try:
            empty.rmdir()
        except OSError:  # not empty, or gone
            return


class Checkpointer:
    """The checkpoint file of one array: `resume(make_trainer, build)` at the start, then
    `trainer.fit(..., checkpoint=checkpointer)`, then `finish()` when the array ends.

    `extra` is saved beside the trainer's state and must be equal on resume: a fingerprint of
    what the array trains (seeds, hyper-parameters, data, device, dtype), so a file left by a
    different call is never continued."""

    def __init__(self, path: Path, extra: dict[str, Any] | None = None) -> None:
        self.path, self.extra = Path(path), dict(extra or {})
        self.state: dict[str, Any] | None = None  # what was saved, once `resume` restored it

    def resume(self, make_trainer: Callable[[], Any], build: Any = None) -> Any:
        """A trainer from `make_trainer()`, restored from the file when there is one for this
        array (`self.state` then holds what was saved); else, or when the file is of another
        array, a fresh one."""
        state = load(self.path)
        if state is not None and any(state.get(key) != value for key, value in self.extra.items()):
            log.warning("ignoring the checkpoint %s: it was saved by an array with other settings", self.path)
            remove(self.path)
            state = None
        trainer = make_trainer()
        if state is None:
            return trainer
        try:
            trainer.restore(state["trainer"], build)
        except Exception as error:  # noqa: BLE001 - a checkpoint of another array: start over
            log.warning("ignoring the checkpoint %s: %s", self.path, error)
            remove(self.path)
            return make_trainer()
        self.state = state
        return trainer

    def __call__(self, trainer: Any) -> None:
        save(self.path, {"trainer": trainer.state_dict(), **self.extra})

    def finish(self) -> None:
        remove(self.path)
