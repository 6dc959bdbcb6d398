"""Errors a user can cause, and warnings about how an array runs.

`HftaNasError` carries an actionable message (what was wrong, where, what was
expected). The CLI prints it and exits with status 2 instead of a traceback, so
anything the user can fix must raise this class (or a subclass), never a bare
ValueError from deep inside the engine.
"""


class HftaNasError(Exception):
    """A problem with the user's input: models, data, configuration or files."""


class FusionError(HftaNasError):
    """The given models cannot be fused into one array (shapes or layers).

    `slot`: the slot whose check failed, when the refusal is about one slot's place in an
    array of different sizes (its model alone is not refused); None when it is about the model.
    """

    def __init__(self, message: str, slot: int | None = None) -> None:
        super().__init__(message)
        self.slot = slot


class FusionFallbackWarning(UserWarning):
    """An operator in the array runs as a per-slot loop instead of one fused kernel.

    Results stay exact; only speed suffers. Raised (as a warning) instead of
    falling back silently, so users know which layer to blame.
    """
