"""The rich Console every command prints its results with: output that survives terminals and pipes.

Text lines never wrap (`soft_wrap`): a printed command such as `optuna-dashboard
runs/x.journal --artifact-dir runs/artifacts` stays one line that copies and pastes.
Where the output is not a terminal (a pipe, a log file) and $COLUMNS is not set,
tables are laid out 160 columns wide instead of rich's default 80, so no column is cut.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

PIPE_WIDTH = 160


def command_console(*, stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    piped = not (hasattr(stream, "isatty") and stream.isatty()) and "COLUMNS" not in os.environ
    return Console(stderr=stderr, soft_wrap=True, width=PIPE_WIDTH if piped else None)


def plural(count: int, noun: str) -> str:
    """'1 array', '3 arrays'."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
