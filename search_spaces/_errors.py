"""The one exception a bad search space (or resolved config) file raises."""

from __future__ import annotations

from dataclasses import dataclass

from hfta_nas.errors import HftaNasError


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a file: where it is and what was expected."""

    source: str
    line: int | None
    key: str
    message: str

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line is not None else self.source
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class SpaceError(HftaNasError):
    """A search space or config file is unreadable or invalid.

    The message has one line per problem, `file:line: dotted.key: what was
    expected (got ...)`, so editors and terminals can jump to it. `problems`
    holds the same pieces for programs (`source`, `line`, `key`, `message`).
    """

    def __init__(self, problems: list[Problem] | Problem) -> None:
        self.problems: list[Problem] = [problems] if isinstance(problems, Problem) else list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    @property
    def source(self) -> str:
        return self.problems[0].source

    @property
    def line(self) -> int | None:
        return self.problems[0].line

    @property
    def key(self) -> str:
        return self.problems[0].key
