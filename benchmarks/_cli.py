"""Argument parsing and result writing shared by the benchmark commands."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def comma_list(
    kind: Callable[[str], Any] = str, allowed: Sequence[str] | None = None, empty_ok: bool = False
) -> Callable[[str], list[Any]]:
    """An argparse `type` for comma-separated values ('a,b,c'), each converted by `kind` and,
    with `allowed`, one of those; with `empty_ok`, '' or 'none' give an empty list."""

    def parse(text: str) -> list[Any]:
        if empty_ok and text.strip().lower() in ("", "none"):
            return []
        try:
            values = [kind(part.strip()) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"cannot parse {text!r}") from None
        bad = [v for v in values if allowed is not None and v not in allowed]
        if bad or not values:
            choices = f"; choose from {','.join(allowed)}" if allowed else ""
            raise argparse.ArgumentTypeError(f"unknown {bad or text!r}{choices}")
        return values

    return parse


def package_versions() -> dict[str, str]:
    """The versions a search benchmark's figures depend on, for its JSON (Ray's when it is installed)."""
    import numpy as np  # imported here: the engine benchmarks that parse arguments with this module need none
    import optuna
    import torch

    import hfta_nas

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "optuna": optuna.__version__,
        "numpy": np.__version__,
        "hfta_nas": hfta_nas.__version__,
    }
    try:
        import ray
    except ImportError:
        return versions
    return {**versions, "ray": ray.__version__}


def write_result(result: dict[str, Any], out: Path, module: str, argv: Sequence[str] | None) -> None:
    """Record the command and where the result goes, then write it as JSON to `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    result["command"] = ["python", "-m", module, *(sys.argv[1:] if argv is None else argv)]
    result["out"] = str(out)
    out.write_text(json.dumps(result, indent=2) + "\n")
