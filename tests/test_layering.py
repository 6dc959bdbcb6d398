"""The layers import one way, by public names, without cycles.

The engine and the search core (`hfta_nas.*`) import nothing from
`hfta_nas.search_spaces`, `hfta_nas.stability` or `hfta_nas.cli` (the repository's
`search_spaces/`, `stability/` and `cli.py`, imported under the `hfta_nas` name);
`search_spaces` may use the engine; `stability` may use both; `cli` uses everything,
and so may `benchmarks` (which nothing imports). A package uses another's
public names only (no `from other._private import`), and no two modules import
each other, directly or around a longer loop (imports inside functions count).

Inside the engine, its parts stack the same way: `layers` (fused operators)
<- `envelope` (models of different sizes in one shape) <- `array`
(`ModelArray`) <- `train` <- `search`; a part never imports one above it.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("hfta_nas", "search_spaces", "stability", "benchmarks")
# a module's layer, by the longest prefix of its import name
LAYERS = {
    "hfta_nas.cli": "cli",
    "hfta_nas.stability": "stability",
    "hfta_nas.search_spaces": "search_spaces",
    "hfta_nas": "engine",
    "benchmarks": "benchmarks",
}
PACKAGES = ("hfta_nas", "hfta_nas.stability", "hfta_nas.search_spaces", "benchmarks")  # their __init__ re-exports
MAY_IMPORT = {
    "engine": {"engine"},
    "search_spaces": {"engine", "search_spaces"},
    "stability": {"engine", "search_spaces", "stability"},
    "cli": {"engine", "search_spaces", "stability"},
    "benchmarks": {"engine", "search_spaces", "stability", "cli", "benchmarks"},
}
ENGINE_PARTS = ("layers", "envelope", "array", "training", "search")  # bottom to top


def import_name(relative: Path) -> str:
    """The name a repository file is imported by (`stability/_runner.py` -> `hfta_nas.stability._runner`)."""
    parts = relative.with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(parts if parts[0] in ("hfta_nas", "benchmarks") else ("hfta_nas", *parts))


def layer_of(name: str) -> tuple[str, str]:
    """(layer, its prefix) of an import name."""
    prefix = max((p for p in LAYERS if name == p or name.startswith(p + ".")), key=len)
    return LAYERS[prefix], prefix


def modules() -> dict[str, Path]:
    found = {"hfta_nas.cli": ROOT / "cli.py"}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            found[import_name(path.relative_to(ROOT))] = path
    return found


def absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a `from ... import` names, a relative one (`from ._x import`) resolved in `package`."""
    if not node.level:
        return node.module
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def imports(path: Path, known: set[str]) -> list[str]:
    """Modules of this project that `path` imports (a `from m import name` of a submodule counts as it;
    a relative import counts as the absolute one it stands for)."""
    tree = ast.parse(path.read_text())
    own = import_name(path.relative_to(ROOT)) if path != ROOT / "cli.py" else "hfta_nas.cli"
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and getattr(block.test, "id", getattr(block.test, "attr", None)) == "TYPE_CHECKING"
        for statement in block.body
        for n in ast.walk(statement)
    }  # annotations only: not imported at run time
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
            module = absolute(node, package)
            found += [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
    return [name for name in found if name.split(".")[0] in ("hfta_nas", "benchmarks")]


def test_layers_import_one_way_by_public_names():
    known = modules()
    problems = []
    for module, path in known.items():
        top, _ = layer_of(module)
        for name in imports(path, set(known)):
            other, prefix = layer_of(name)
            if other not in MAY_IMPORT[top]:
                problems.append(f"{module} imports {name}: {top} may not import {other}")
            elif other != top and any(part.startswith("_") for part in name[len(prefix) :].split(".")):
                problems.append(f"{module} imports {name}: a private name of {other}")
    assert not problems, "\n".join(problems)


def test_no_import_cycles():
    known = modules()
    graph = {m: {n for n in imports(p, set(known)) if n in known and n != m} for m, p in known.items()}
    # a package's __init__ re-exports its modules; edges into an __init__ stand for its public names
    cycles = []

    def visit(node, stack, on_stack, done):
        on_stack.add(node)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt in on_stack:
                cycle = stack[stack.index(nxt) :] + [nxt]
                if not any(part in PACKAGES for part in cycle):  # loops through a package __init__ are re-exports
                    cycles.append(" -> ".join(cycle))
            elif nxt not in done:
                visit(nxt, stack, on_stack, done)
        stack.pop()
        on_stack.discard(node)
        done.add(node)

    done: set[str] = set()
    for module in sorted(graph):
        if module not in done:
            visit(module, [], set(), done)
    assert not cycles, "\n".join(sorted(set(cycles)))


def test_engine_parts_import_downwards():
    known = modules()
    part_of = {
        m: m.split(".")[1]
        for m in known
        if layer_of(m)[0] == "engine" and m.split(".")[1:2] in [[p] for p in ENGINE_PARTS]
    }
    problems = [
        f"{module} imports {name}: {part_of[module]} sits below {part_of[name]}"
        for module, part in part_of.items()
        for name in imports(known[module], set(known))
        if name in part_of and ENGINE_PARTS.index(part_of[name]) > ENGINE_PARTS.index(part)
    ]
    assert not problems, "\n".join(problems)
