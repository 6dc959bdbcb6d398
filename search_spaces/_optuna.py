"""From the `sampler` / `pruner` sections to Optuna objects, and their argument checks.

Arguments are checked against the Optuna class's own signature (names and
annotated types), so a new Optuna release needs no change here; arguments that
take Python objects (callables, other samplers, trials) cannot be written in
YAML and are not offered.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import re
import warnings
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import optuna
from pydantic import ConfigDict, TypeAdapter, ValidationError

from ._schema import describe_error


class AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler that can be used with ask-and-tell.

    When the grid is exhausted, Optuna's GridSampler calls `study.stop()`, which
    raises RuntimeError outside `study.optimize` (after the trial was stored).
    The search driver asks and tells in batches and stops at `grid_size` itself,
    so here the stop request is dropped instead of failing the `tell`.
    """

    def after_trial(self, study, trial, state, values) -> None:  # type: ignore[no-untyped-def]
        try:
            super().after_trial(study, trial, state, values)
        except RuntimeError:
            if getattr(getattr(study, "_thread_local", None), "in_optimize_loop", True):  # inside optimize: keep it
                raise


SAMPLER_CLASSES: dict[str, type[optuna.samplers.BaseSampler]] = {
    "tpe": optuna.samplers.TPESampler,
    "random": optuna.samplers.RandomSampler,
    "cmaes": optuna.samplers.CmaEsSampler,
    "gp": optuna.samplers.GPSampler,
    "grid": AskTellGridSampler,
    "nsga2": optuna.samplers.NSGAIISampler,
}
PRUNER_CLASSES: dict[str, type[optuna.pruners.BasePruner]] = {
    "none": optuna.pruners.NopPruner,
    "median": optuna.pruners.MedianPruner,
    "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
    "hyperband": optuna.pruners.HyperbandPruner,
}
# Merged under the user's kwargs. constant_liar: trials asked in one batch (one
# array) are spread out instead of all landing on the same point.
SAMPLER_DEFAULTS: dict[str, dict[str, Any]] = {"tpe": {"constant_liar": True, "multivariate": True}}
# Packages a sampler needs beyond Optuna itself (Optuna only fails when sampling).
SAMPLER_PACKAGES: dict[str, tuple[str, ...]] = {"cmaes": ("cmaes",), "gp": ("scipy", "torch")}
SINGLE_OBJECTIVE_SAMPLERS = ("cmaes",)

RESERVED = {
    "seed": "set the top-level 'seed' key instead (or pass seed= to make_sampler)",
    "search_space": "the grid is built from 'params' (categorical, int_uniform, int_log_uniform or uniform with step)",
}

_YAML_TYPES = re.compile(r"^(?:int|float|str|bool|None|dict|list|tuple|Any|[\s\[\],|])+$")


@cache
def settable_args(cls: type) -> dict[str, TypeAdapter | None]:
    """Keyword arguments of `cls` that a YAML value can give, with a type checker (None: unchecked)."""
    args: dict[str, TypeAdapter | None] = {}
    for name, param in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or name in RESERVED or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = param.annotation
        if annotation is inspect.Parameter.empty:
            args[name] = None
            continue
        text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
        if not isinstance(annotation, str):
            try:
                args[name] = TypeAdapter(annotation, config=ConfigDict(strict=True))
            except Exception:  # an annotation pydantic cannot check: accept any value
                args[name] = None
            continue
        if not _YAML_TYPES.match(text):
            continue  # takes a Python object (a callable, a sampler, trials): not settable from YAML
        try:
            hint = eval(text, {"Any": Any, "tuple": tuple})  # noqa: S307 - text matched the whitelist above
            args[name] = TypeAdapter(hint, config=ConfigDict(strict=True))
        except Exception:
            args[name] = None
    return args


def _message(error: ValidationError) -> str:
    return describe_error(error.errors()[0], None)


def check_kwargs(kind: str, name: str, cls: type, kwargs: Mapping[str, Any]) -> list[tuple[tuple, str]]:
    """(loc below `kwargs`, message) for every bad argument; empty when all are fine."""
    problems: list[tuple[tuple, str]] = []
    allowed = settable_args(cls)
    listing = ", ".join(allowed) if allowed else "none"
    for key, value in kwargs.items():
        if key in RESERVED and key in inspect.signature(cls.__init__).parameters:
            problems.append(((key,), f"{kind} '{name}' argument '{key}' is not set here: {RESERVED[key]}"))
            continue
        if key not in allowed:
            close = difflib.get_close_matches(str(key), list(allowed), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            problems.append(
                (
                    (key,),
                    f"{kind} '{name}' ({cls.__name__}) has no argument '{key}'{hint}; valid arguments: {listing}",
                )
            )
            continue
        adapter = allowed[key]
        if adapter is not None:
            try:
                adapter.validate_python(value)
            except ValidationError as error:
                problems.append(((key,), f"{kind} '{name}' argument '{key}': {_message(error)}"))
                continue
        if _is_count(key) and isinstance(value, int) and not isinstance(value, bool) and value < 0:
            # Optuna takes n_startup_trials=-1 and the like without a word, and then behaves as if 0
            problems.append(((key,), f"{kind} '{name}' argument '{key}' counts something: expected >= 0, got {value}"))
    return problems


def _is_count(key: str) -> bool:
    """Arguments that count trials, steps or candidates (n_startup_trials, n_warmup_steps, n_ei_candidates, ...)."""
    return key.startswith("n_") or key.endswith(("_trials", "_steps"))


def missing_packages(sampler: str) -> list[str]:
    return [p for p in SAMPLER_PACKAGES.get(sampler, ()) if importlib.util.find_spec(p) is None]


def sampler_kwargs(name: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    return {**SAMPLER_DEFAULTS.get(name, {}), **kwargs}


def build_sampler(
    name: str, kwargs: Mapping[str, Any], seed: int | None, grid: Mapping[str, Sequence[Any]] | None = None
) -> optuna.samplers.BaseSampler:
    """The sampler instance (raises what Optuna raises; callers turn it into SpaceError)."""
    cls = SAMPLER_CLASSES[name]
    arguments = sampler_kwargs(name, kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "grid":
            return cls(dict(grid or {}), seed=seed, **arguments)
        return cls(seed=seed, **arguments)


def build_pruner(name: str, kwargs: Mapping[str, Any]) -> optuna.pruners.BasePruner:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return PRUNER_CLASSES[name](**kwargs)
