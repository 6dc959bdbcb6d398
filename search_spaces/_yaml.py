"""Reading YAML while remembering the line of every key, for errors that point at it.

PyYAML's `safe_load` forgets where things were, so a file is composed into a
node tree first: walking the nodes records the 1-based line of every mapping
key (and sequence item) under its path, refuses duplicate keys (which
`safe_load` silently overwrites) and self-referencing aliases, and only then
are the nodes turned into plain Python values. `Where` maps the `loc` of a
problem (a path into the data) to the nearest line it knows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from ._errors import Problem, SpaceError

Loc = tuple[Any, ...]

# A file whose aliases expand past this many nodes is refused (a "billion
# laughs" file would otherwise hang the validation).
_MAX_NODES = 200_000
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-3` as a float.

    YAML 1.1 (PyYAML) wants `1.0e-3`; everyone writes `1e-3` for a learning
    rate, and reading it as the string "1e-3" would only move the error.
    """


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


@dataclass
class Located:
    """A parsed document and the line of each path in it."""

    data: Any
    lines: dict[Loc, int] = field(default_factory=dict)


def _key_name(loc: Sequence[Any]) -> str:
    name = ""
    for part in loc:
        if isinstance(part, int):
            name += f"[{part}]"
        else:
            name += f".{part}" if name else str(part)
    return name


class Where:
    """Turns (loc, message) into `Problem`s with the file name and line."""

    def __init__(self, source: str, lines: dict[Loc, int], translate: Callable[[Loc], Loc] | None = None) -> None:
        self.source = source
        self.lines = lines
        self.translate = translate or (lambda loc: loc)

    def line(self, loc: Loc) -> int | None:
        loc = tuple(str(p) for p in loc)
        for end in range(len(loc), -1, -1):
            if loc[:end] in self.lines:
                return self.lines[loc[:end]]
        return None

    def problem(self, loc: Loc, message: str) -> Problem:
        loc = self.translate(tuple(loc))
        return Problem(self.source, self.line(loc), _key_name(loc), message)

    def error(self, loc: Loc, message: str) -> SpaceError:
        return SpaceError(self.problem(loc, message))


def _syntax_error(source: str, text: str, error: yaml.YAMLError) -> SpaceError:
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        parts = [p for p in (error.context, error.problem) if p]
        what = "; ".join(parts) if parts else "invalid YAML"
        return SpaceError(Problem(source, mark.line + 1, "", f"YAML syntax error at column {mark.column + 1}: {what}"))
    if isinstance(error, yaml.reader.ReaderError):
        before = text[: error.position]
        line, column = before.count("\n") + 1, error.position - (before.rfind("\n") + 1) + 1
        what = (
            f"character {error.character!r} (#x{error.character:04x})"
            if isinstance(error.character, int)
            else "a character"
        )
        return SpaceError(
            Problem(source, line, "", f"YAML error at column {column}: {what} is not allowed: {error.reason}")
        )
    return SpaceError(Problem(source, None, "", f"YAML error: {str(error).replace(chr(10), ' ')}"))


class _Walk:
    """Records lines, checks duplicates/cycles and counts nodes after alias expansion."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: dict[Loc, int] = {}
        self.active: set[int] = set()
        self.sizes: dict[int, int] = {}

    def fail(self, node: yaml.Node, message: str) -> SpaceError:
        return SpaceError(Problem(self.source, node.start_mark.line + 1, "", message))

    def __call__(self, node: yaml.Node, path: Loc) -> int:
        ident = id(node)
        if ident in self.active:
            raise self.fail(
                node, "an alias refers to a node that contains it (a recursive structure); expand it by hand"
            )
        if ident in self.sizes:  # an alias seen before: its size is known, its lines are recorded elsewhere
            return self.sizes[ident]
        self.active.add(ident)
        size = 1
        if isinstance(node, yaml.MappingNode):
            seen: dict[tuple[str, str], int] = {}
            merges = []
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE_TAG:
                    merges.append(value_node)
                    continue
                if isinstance(key_node, yaml.ScalarNode):
                    ident_key = (key_node.tag, key_node.value)
                    line = key_node.start_mark.line + 1
                    if ident_key in seen:
                        raise SpaceError(
                            Problem(
                                self.source,
                                line,
                                _key_name((*path, key_node.value)),
                                f"duplicate key '{key_node.value}' (first given on line {seen[ident_key]}); "
                                "give each key once",
                            )
                        )
                    seen[ident_key] = line
                    child = (*path, key_node.value)
                    self.lines.setdefault(child, line)
                else:
                    child = (*path, "?")
                size += self(key_node, path) + self(value_node, child)
            for merged in merges:  # after own keys, so an overriding key keeps its own line
                size += self(merged, path)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                child = (*path, str(index))
                self.lines.setdefault(child, item.start_mark.line + 1)
                size += self(item, child)
        self.active.discard(ident)
        self.sizes[ident] = size
        if size > _MAX_NODES:
            raise self.fail(
                node, f"the document expands to more than {_MAX_NODES} values (through aliases); it is too large"
            )
        return size


def parse_yaml(text: str, source: str) -> Located:
    """`text` as Python data plus key lines; `SpaceError` on any YAML problem."""
    if not isinstance(text, str):
        raise SpaceError(Problem(source, None, "", f"expected YAML text (str), got {type(text).__name__}"))
    loader = None
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
        if node is None:
            return Located(None)
        walk = _Walk(source)
        walk.lines[()] = node.start_mark.line + 1
        walk(node, ())
        data = loader.construct_document(node)
        return Located(data, walk.lines)
    except yaml.YAMLError as error:
        raise _syntax_error(source, text, error) from None
    except RecursionError:
        raise SpaceError(Problem(source, None, "", "the YAML is nested too deeply")) from None
    except (TypeError, ValueError, OverflowError) as error:
        # e.g. an unhashable mapping key ({[1]: 2}) or a timestamp out of range
        raise SpaceError(Problem(source, None, "", f"YAML could not be read: {error}")) from None
    finally:
        if loader is not None:
            loader.dispose()


class _Dumper(yaml.SafeDumper):
    """Block style, except lists of plain values on one line (`channels: [16, 32]`)."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flat = all(isinstance(v, (type(None), bool, int, float, str)) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat)


_Dumper.add_representer(list, _represent_list)


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=100)
