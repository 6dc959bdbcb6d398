"""What every tracking backend does: runs grouped by study, each with its parameters,
attributes (where and how it trained), a curve per metric and final values."""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hfta_nas.errors import HftaNasError

# How a run ended: a trial's Optuna state, or INTERRUPTED (the search stopped while it trained).
STATES = ("COMPLETE", "PRUNED", "FAIL", "INTERRUPTED")


class TrackingError(HftaNasError):
    """A tracker cannot be used: an unknown backend, its library missing, a folder it cannot write."""


class Tracker(ABC):
    """One backend (MLflow, TensorBoard, W&B). `Runs` calls it from one thread only, so a
    backend needs no locks; a call that raises disables it (`Runs` warns once)."""

    name = "tracker"

    @abstractmethod
    def start(self, group: str, name: str, params: Mapping[str, Any], attributes: Mapping[str, Any]) -> Any:
        """Open run `name` of study `group`; returns the backend's handle of it."""

    @abstractmethod
    def log(self, run: Any, step: int, metrics: Mapping[str, float]) -> None:
        """One point of each metric's curve (step: the epoch)."""

    @abstractmethod
    def end(self, run: Any, final: Mapping[str, float], state: str, reason: str) -> None:
        """Close the run with its final metric values and how it ended (one of STATES)."""


def flat(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and None become text, as every backend takes scalars."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = str(value)
    return out


def folder_name(text: str) -> str:
    """A study or run name as one path component ('stability:cnn:ab12' -> 'stability_cnn_ab12')."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("._") or "_"


def writable_folder(path: str | Path, what: str) -> Path:
    """`path`, created if missing; TrackingError naming `what` when it cannot be written."""
    folder = Path(path).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise TrackingError(f"{what}: cannot create the folder '{folder}' ({error.strerror or error}).") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise TrackingError(f"{what}: the folder '{folder}' is not writable.")
    return folder
