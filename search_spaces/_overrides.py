"""`--set key=value`: settings given on the command line over those of a file.

A key is a dotted path of the file (`training.epochs`, `data.batch_size`,
`model.config.channels`); under `params` the rest of the key is one param name
(`params.training.optimizer.lr`). A value is read as YAML (`[16, 32]`, `true`,
`1e-3`). Overrides are applied to the parsed file before it is validated, so
they meet exactly the checks the file does; a problem with an overridden
setting names the `--set` it came from instead of a file line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from ._errors import Problem, SpaceError
from ._yaml import Loc, Where, _Loader


@dataclass(frozen=True)
class Override:
    text: str  # as given: "training.epochs=2"
    loc: Loc
    value: Any


def parse_overrides(items: Sequence[str], translate: Callable[[Loc], Loc] | None = None) -> list[Override]:
    """`key=value` strings as Overrides; `translate` maps a path to the file's layout (config files)."""
    overrides, problems = [], []
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            problems.append(
                Problem(f"--set {item}", None, "", "expected key=value with a dotted key, e.g. training.epochs=2")
            )
            continue
        head, _, rest = key.partition(".")
        loc: Loc = (head, rest) if head == "params" and rest else tuple(key.split("."))
        if translate is not None:
            loc = translate(loc) or loc
        try:
            value = yaml.load(text, Loader=_Loader) if text.strip() else None
        except yaml.YAMLError as error:
            problems.append(Problem(f"--set {item}", None, key, f"the value is not YAML: {str(error).splitlines()[0]}"))
            continue
        overrides.append(Override(item, loc, value))
    if problems:
        raise SpaceError(problems)
    return overrides


def apply_overrides(data: Any, overrides: Sequence[Override]) -> Any:
    """`data` (a parsed file's top-level mapping) with every override set in it."""
    if not overrides:
        return data
    if not isinstance(data, dict):
        return data  # the file's own top-level problem is reported by its validation
    for override in overrides:
        node = data
        for depth, part in enumerate(override.loc[:-1]):
            if node.get(part) is None:
                node[part] = {}
            elif not isinstance(node[part], dict):
                where = ".".join(map(str, override.loc[: depth + 1]))
                raise SpaceError(
                    Problem(
                        f"--set {override.text}",
                        None,
                        where,
                        f"'{where}' is {type(node[part]).__name__} in the file, not a mapping of settings",
                    )
                )
            node = node[part]
        node[override.loc[-1]] = override.value
    return data


class OverriddenWhere(Where):
    """Problems with an overridden setting name its `--set`; all others the file's line."""

    def __init__(self, inner: Where, overrides: Sequence[Override]) -> None:
        super().__init__(inner.source, inner.lines, inner.translate)
        self.inner, self.overrides = inner, list(overrides)

    def problem(self, loc: Loc, message: str) -> Problem:
        parts = tuple(str(p) for p in self.translate(tuple(loc)))  # in the file's layout, as the overrides are
        for override in reversed(self.overrides):  # the last one given wins, as it does in the data
            mine = tuple(str(p) for p in override.loc)
            if parts[: len(mine)] == mine:
                return Problem(f"--set {override.text}", None, ".".join(parts), message)
        return self.inner.problem(loc, message)
