"""Argument parsing shared by the benchmark commands."""

from __future__ import annotations

import argparse
import json
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


def write_result(result: dict[str, Any], out: Path, module: str, argv: Sequence[str] | None) -> None:
    """Record the command and where the result goes, then write it as JSON to `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    result["command"] = ["python", "-m", module, *(sys.argv[1:] if argv is None else argv)]
    result["out"] = str(out)
    out.write_text(json.dumps(result, indent=2) + "\n")
