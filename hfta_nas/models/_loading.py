"""Loading a user's own model factory from a "module:function" string.

This is how a search space or the CLI points at a model that is not a built-in
family. The user's code is imported as it is (never edited); every way the
lookup can fail becomes an `HftaNasError` that says what to fix.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from torch import nn

from hfta_nas.errors import HftaNasError

_FORMAT = "expected 'module:function' (e.g. 'my_models:build_net') or 'path/to/file.py:function'"


def _import_file(path: str, spec_text: str) -> ModuleType:
    file = Path(path)
    if not file.is_file():
        raise HftaNasError(f"model factory {spec_text!r}: file '{file}' does not exist (looked from {os.getcwd()}).")
    # A name unique to the file, so two files called models.py do not collide.
    digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:10]
    name = f"_hfta_nas_user_{file.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise HftaNasError(f"model factory {spec_text!r}: '{file}' cannot be imported as a Python module.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        raise HftaNasError(
            f"model factory {spec_text!r}: running '{file}' failed with {type(error).__name__}: {error}"
        ) from error
    return module


def _import_module(name: str, spec_text: str) -> ModuleType:
    # Like `python -m`, a module next to where the user runs the command wins.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    importlib.invalidate_caches()
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is not None and (name == error.name or name.startswith(error.name + ".")):
            raise HftaNasError(
                f"model factory {spec_text!r}: no module named '{error.name}' in the current directory "
                f"({cwd}) or on sys.path; check the spelling, run from the folder that holds it, "
                "or give a file path 'path/to/file.py:function'."
            ) from None
        raise HftaNasError(
            f"model factory {spec_text!r}: module '{name}' was found but importing it failed: {error} "
            "(a package it imports is missing; install it)."
        ) from error
    except Exception as error:
        raise HftaNasError(
            f"model factory {spec_text!r}: importing module '{name}' failed with {type(error).__name__}: {error}"
        ) from error


def load_factory(path: str) -> Callable[..., nn.Module]:
    """The callable named by `path` ("module:function", "module:Class" or "file.py:function").

    The module is imported with the current directory on `sys.path`, so a
    `my_models.py` next to the search space's working directory is found.
    The callable is returned as it is; what arguments it takes is up to the
    caller's contract. Raises `HftaNasError` when the module cannot be
    imported, lacks the name, or the name is not callable.
    """
    if not isinstance(path, str):
        raise HftaNasError(f"model factory must be a string, {_FORMAT}; got {type(path).__name__}.")
    module_name, _, attribute = path.strip().rpartition(":")
    if not module_name or not attribute:
        raise HftaNasError(f"model factory {path!r}: {_FORMAT}.")
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        module = _import_file(module_name, path)
    else:
        module = _import_module(module_name, path)

    target: object = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            available = sorted(
                n
                for n, v in vars(module).items()
                if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
            )
            listing = ", ".join(available) if available else "none"
            raise HftaNasError(
                f"model factory {path!r}: module '{module_name}' has no attribute '{attribute}'; "
                f"callables defined there: {listing}."
            ) from None
    if not callable(target):
        raise HftaNasError(
            f"model factory {path!r}: '{attribute}' is a {type(target).__name__}, not callable; point to a "
            "function or class that returns a torch.nn.Module."
        )
    return target  # type: ignore[return-value]
