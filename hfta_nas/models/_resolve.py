"""One entry point from "what model" (a family name, a user factory path or a
callable) plus its config to the zero-argument factory that ModelArray needs."""

from __future__ import annotations

import functools
import inspect
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import nn

from hfta_nas.errors import HftaNasError
from hfta_nas.models._families import FAMILIES, model_factory
from hfta_nas.models._loading import load_factory


def resolve_model(
    model: str | Callable[..., nn.Module],
    config: Mapping[str, Any] | None = None,
    *,
    input_shape: Sequence[int],
    num_classes: int,
) -> Callable[[], nn.Module]:
    """A zero-argument factory for `model` with `config`.

    `model` is a built-in family (see FAMILIES), a "module:function" /
    "file.py:function" path, or a callable. A user factory is called as
    `function(**config, input_shape=..., num_classes=...)`, where the last two
    are passed only if the function's signature names them (or takes **kwargs).
    """
    if isinstance(model, str) and model in FAMILIES:
        return model_factory(model, config, input_shape=input_shape, num_classes=num_classes)
    if isinstance(model, str) and ":" not in model:
        raise HftaNasError(
            f"unknown model '{model}': expected a built-in family {list(FAMILIES)} or a user factory 'module:function'."
        )
    function = load_factory(model) if isinstance(model, str) else model
    if not callable(function):
        raise HftaNasError(f"model must be a family name, 'module:function' or a callable; got {type(model).__name__}.")
    kwargs = dict(config or {})
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        parameters = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    for name, value in (("input_shape", tuple(input_shape)), ("num_classes", num_classes)):
        if takes_any or name in parameters:
            kwargs.setdefault(name, value)
    return functools.partial(_call_user_factory, function, kwargs)


def _call_user_factory(function: Callable[..., nn.Module], kwargs: dict[str, Any]) -> nn.Module:
    name = getattr(function, "__qualname__", repr(function))
    try:
        built = function(**kwargs)
    except TypeError as error:
        raise HftaNasError(f"model factory {name} could not be called with {sorted(kwargs)}: {error}") from error
    except Exception as error:  # noqa: BLE001 - the user's code: say where it failed, without a traceback
        frame = traceback.extract_tb(error.__traceback__)[-1]
        raise HftaNasError(
            f"model factory {name} raised {type(error).__name__}: {error} "
            f"(at {frame.filename}:{frame.lineno}, called with {sorted(kwargs)})"
        ) from error
    if not isinstance(built, nn.Module):
        raise HftaNasError(f"model factory {name} returned a {type(built).__name__}, not a torch.nn.Module.")
    return built
