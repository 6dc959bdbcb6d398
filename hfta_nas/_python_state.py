"""The Python state a forward keeps on its modules, read, put back and carried across.

A forward may keep plain Python values on its modules (a step counter, a warm-up flag,
`self.calls += 1`). The array's template runs once per call for all slots, as each slot's
own model would, so that state advances exactly as in one plain call per step. Anything
else that runs a forward (a check on a copy, a fused attempt that falls back) must leave
it as it was: these helpers snapshot it, put it back, and carry what a forward changed
onto another module tree (a slot's own model, before the running check compares them).

Python state here is every plain value in a module's `__dict__` that torch's own
`nn.Module` does not keep there (parameters, buffers, submodules and hooks live apart).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

# What every nn.Module keeps in its __dict__ (hooks, parameter dicts, `training`): not the user's state.
_TORCH_ATTRIBUTES = frozenset(vars(nn.Module()))
# Values copied as state; anything else (a dataset, a callable) is configuration, never changed by a call.
_PLAIN = (int, float, bool, complex, str, bytes, type(None), tuple, list, dict, set, frozenset)

PythonState = dict[str, dict[str, Any]]  # module path -> attribute -> value


def python_state(root: nn.Module) -> PythonState:
    """A deep copy of every module's plain Python attributes, by module path."""
    state: PythonState = {}
    for path, module in root.named_modules(remove_duplicate=False):
        state[path] = {
            name: copy.deepcopy(value)
            for name, value in vars(module).items()
            if name not in _TORCH_ATTRIBUTES and isinstance(value, _PLAIN) and not _holds_tensors(value)
        }
    return state


def put_back(root: nn.Module, state: PythonState) -> None:
    """Make `root`'s plain Python attributes what `state` (of `python_state(root)`) recorded."""
    for path, values in state.items():
        module = root.get_submodule(path)
        for name, value in values.items():
            module.__dict__[name] = copy.deepcopy(value)


def changes(root: nn.Module, since: PythonState) -> PythonState:
    """The attributes of `root` whose value is no longer what `since` recorded (or that are new)."""
    now = python_state(root)
    changed: PythonState = {}
    for path, values in now.items():
        before = since.get(path, {})
        diff = {name: value for name, value in values.items() if name not in before or not _same(before[name], value)}
        if diff:
            changed[path] = diff
    return changed


def carry(changed: PythonState, target: nn.Module, paths: Mapping[str, str]) -> None:
    """Set on `target` what a forward changed on another tree: `paths` maps each of `target`'s module
    paths to the path of the module it corresponds to in that tree."""
    for own_path, other_path in paths.items():
        for name, value in changed.get(other_path, {}).items():
            target.get_submodule(own_path).__dict__[name] = copy.deepcopy(value)


def _same(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - a value whose == is not a bool: take it as changed
        return False


def _holds_tensors(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list, set, frozenset)):
        return any(_holds_tensors(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_tensors(v) for v in value.values())
    return False
