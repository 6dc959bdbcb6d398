"""Checks that need more than one key: what a dotted path may address, and what values fit there.

`validate` runs after the YAML is read (with lines): pydantic checks each
section's structure and types, then the rules here check what depends on
other sections (the optimizer's arguments, the schedule's, the model family's
config keys), every `params` entry (its path, its distribution, the values it
can produce), and the sampler and pruner arguments against Optuna's classes.
Every problem is collected with its location, so one run lists them all.
"""

from __future__ import annotations

import difflib
import inspect
import json
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from hfta_nas import LOSSES, loss_kind, trained_metric_names
from hfta_nas.data import DATASETS
from hfta_nas.errors import HftaNasError
from hfta_nas.models import FAMILIES, family_defaults, model_factory
from hfta_nas.optim import OPTIMIZERS, SCHEDULE_KINDS, LRSchedule

from . import _optuna
from ._constraints import check_constraints, warn_unaware_sampler
from ._errors import Problem, SpaceError
from ._pbt_checks import check_pbt
from ._schema import (
    DISTRIBUTIONS,
    FOREIGN_DISTRIBUTIONS,
    BatchSize,
    Categorical,
    Epochs,
    Fixed,
    Fraction,
    IntLogUniform,
    IntUniform,
    LogUniform,
    NonNegativeFloat,
    NonNegativeInt,
    Param,
    PositiveFloat,
    PositiveInt,
    SpaceFile,
    Uniform,
    UnitFactor,
    default_direction,
    describe_error,
    short,
    unknown_key_message,
    validation_problems,
)
from ._yaml import Loc, Where

# Shapes of the built-in datasets, so a family config can be checked (layer
# sizes fit the input) without generating the data.
BUILTIN_SHAPES: dict[str, tuple[tuple[int, ...], int]] = {
    "mnist1d": ((1, 40), 10),
    "digits": ((1, 8, 8), 10),
    "diabetes": ((10,), 1),
}
GRID_LIMIT = 10_000
_PRIMITIVE = (type(None), bool, int, float, str)
_IDENTIFIER_PATH = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")
STATIC_METRICS = ("params", "latency_ms")
_FUNCTION_SOURCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _adapter(tp: Any) -> TypeAdapter:
    return TypeAdapter(tp, config=ConfigDict(strict=True))


Checker = Callable[[Any], "str | None"]


def _checker(tp: Any) -> Checker:
    adapter = _adapter(tp)

    def check(value: Any) -> str | None:
        try:
            adapter.validate_python(value)
        except ValidationError as error:
            return describe_error(error.errors()[0], None)
        return None

    return check


_ANY: Checker = lambda value: None
_DATA_LEAVES: dict[str, Checker] = {
    "batch_size": _checker(BatchSize),
    "val_fraction": _checker(Fraction),
    "test_fraction": _checker(Fraction),
    "split_seed": _checker(NonNegativeInt),
    "num_samples": _checker(PositiveInt | None),
}
SCHEDULE_ARGS: tuple[str, ...] = tuple(
    name for name, p in inspect.signature(LRSchedule.__init__).parameters.items() if p.kind is p.KEYWORD_ONLY
)
_SCHEDULE_TYPES = {
    "step_size": PositiveInt,
    "gamma": PositiveFloat,
    "t_max": PositiveFloat,
    "eta_min": NonNegativeFloat,
    "warmup_steps": NonNegativeInt,
    "warmup_start_factor": UnitFactor,
}
_SCHEDULE_LEAVES: dict[str, Checker] = {
    "kind": _checker(Literal[SCHEDULE_KINDS]),  # type: ignore[valid-type]
    **{name: _checker(_SCHEDULE_TYPES.get(name, NonNegativeFloat)) for name in SCHEDULE_ARGS},
}
_BOOL = _checker(bool)
# No optimizer trains with a step above this (Goyal et al.'s largest-batch SGD used 3.2): a value
# like 1e308 is a typo, and would turn every weight to inf on the first step.
MAX_LR = 1e3
_LR = _checker(Annotated[float, Field(gt=0, le=MAX_LR, allow_inf_nan=False)])
_EPS = _checker(PositiveFloat)  # Adam's denominator: 0 divides by zero where a gradient is 0
_BETA = _checker(Fraction)
_BETAS = _checker(tuple[Fraction, Fraction] | list[Fraction])
_NON_NEGATIVE = _checker(NonNegativeFloat)
_OPTIMIZER_NAME = _checker(Literal[tuple(OPTIMIZERS)])  # type: ignore[valid-type]


def optimizer_args(name: str) -> list[str]:
    """Arguments the array optimizer `name` accepts: its hyper-parameters, flags and `betas` (Adam family)."""
    cls = OPTIMIZERS[name]
    names = [*cls.defaults, *cls.flags]
    if "beta1" in cls.defaults:
        names.append("betas")
    return names


def _hparam_checker(name: str, optimizer_names: Iterable[str]) -> Checker:
    if any(name in OPTIMIZERS[o].flags for o in optimizer_names):
        return _BOOL
    if name == "lr":
        return _LR
    if name == "eps":
        return _EPS
    if name in ("beta1", "beta2"):
        return _BETA
    if name == "betas":

        def betas(value: Any) -> str | None:
            if not isinstance(value, (list, tuple)) or len(value) != 2:
                return f"expected a pair [beta1, beta2], got {short(value)}"
            return _BETAS(list(value))

        return betas
    return _NON_NEGATIVE


# ------------------------------------------------------------ categorical values
def json_able(value: Any, depth: int = 0) -> bool:
    if depth > 32:
        return False
    if isinstance(value, _PRIMITIVE):
        return True
    if isinstance(value, list):
        return all(json_able(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and json_able(v, depth + 1) for k, v in value.items())
    return False


def encode_choice(value: Any) -> Any:
    """A categorical choice as Optuna can store it: lists and mappings become their JSON text."""
    return value if isinstance(value, _PRIMITIVE) else json.dumps(value)


# --------------------------------------------------------------------- results
@dataclass
class Validated:
    file: SpaceFile
    params: dict[str, Param]


@dataclass
class _Run:
    where: Where
    problems: list[Problem] = field(default_factory=list)

    def add(self, loc: Loc, message: str) -> None:
        self.problems.append(self.where.problem(loc, message))

    def raise_if_any(self) -> None:
        if self.problems:
            raise SpaceError(sorted(self.problems, key=lambda p: p.line or 0))


def _top_level(data: Any, where: Where) -> dict[str, Any]:
    if data is None:
        raise where.error(
            (), "the file is empty; expected a mapping of sections such as 'params:' (see search_spaces/README.md)"
        )
    if not isinstance(data, dict):
        raise where.error(
            (),
            f"expected a mapping of sections (study, sampler, ..., params) at the top level, "
            f"got {type(data).__name__} {short(data)}",
        )
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise where.error((), f"section names must be strings, got {short(bad[0])} ({type(bad[0]).__name__})")
    # An empty section (`sampler:`) means its defaults; `seed: null` means unseeded.
    cleaned = {k: v for k, v in data.items() if v is not None or k in ("params", "seed")}
    if cleaned.get("params") is None:
        cleaned["params"] = {}
    cleaned.setdefault("model", {"family": "cnn1d"})  # no model section: the MNIST-1D CNN
    return cleaned


def validate(data: Any, where: Where) -> Validated:
    """The checked, normalised file; `SpaceError` listing every problem otherwise."""
    raw = _top_level(data, where)
    try:
        file = SpaceFile.model_validate(raw)
    except ValidationError as error:
        raise SpaceError(validation_problems(where, error, SpaceFile)) from None
    run = _Run(where)
    _check_loss(run, file)
    file = _check_study(run, file)
    _check_model(run, file)
    _check_data(run, file)
    params = _parse_params(run, file)
    context = _Context(file, params)
    _check_training(run, context)
    _check_model_config(run, context)
    for path, param in params.items():
        _check_param(run, context, path, param)
    _check_fractions(run, context)
    _check_metric_splits(run, context)
    _warn_strong_mixing(where, file, params)
    check_pbt(run.add, file, params)
    check_constraints(run.add, file, [*measured_metrics(file), *STATIC_METRICS], _unknown_metric)
    if file.budget.n_trials is None and file.budget.timeout is None:
        run.add(("budget",), "give 'n_trials' or 'timeout' (or both); with neither the search would never stop")
    file = _check_sampler_and_pruner(run, file, params)
    run.raise_if_any()
    _warn_pruner_never_reached(where, file, params)
    warn_unaware_sampler(where, file)
    return Validated(file, params)


def _largest_epochs(file: SpaceFile, params: dict[str, Any]) -> int | None:
    """The most epochs a trial of the space trains (None when the file does not say in numbers)."""
    param = params.get("training.epochs")
    if param is None:
        values = [file.training.epochs]
    elif isinstance(param, Fixed):
        values = [param.value]
    elif isinstance(param, Categorical):
        values = param.values
    else:
        values = [getattr(param, "max", None)]
    values = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return max(values) if values else None


def _warn_pruner_never_reached(where: Where, file: SpaceFile, params: dict[str, Any]) -> None:
    """A warning (the `hfta_nas` logger) for a hyperband pruner whose first rung (min_resource, a W&B
    sweep's min_iter) lies past the last epoch: it never prunes a trial, and nothing else would say so."""
    if file.pruner.name != "hyperband":
        return
    first_rung, epochs = file.pruner.kwargs.get("min_resource"), _largest_epochs(file, params)
    if not isinstance(first_rung, int) or isinstance(first_rung, bool) or epochs is None or first_rung <= epochs:
        return
    message = (
        f"hyperband's first rung is at epoch {first_rung} (min_resource; a W&B sweep's min_iter), past the "
        f"{epochs} epoch{'s' if epochs != 1 else ''} a trial trains: it never prunes; lower it or train longer"
    )
    logging.getLogger("hfta_nas").warning(f"warning: {where.problem(('pruner', 'kwargs', 'min_resource'), message)}")


# Zhang et al. (mixup) and Yun et al. (CutMix) use alpha 0.1-1: above it Beta(alpha, alpha) draws
# lambda near 1/2, so most samples are half one image, half another: legal, but rarely meant.
MAX_USUAL_MIX_ALPHA = 1.0


def _warn_strong_mixing(where: Where, file: SpaceFile, params: dict[str, Any]) -> None:
    """A warning (the `hfta_nas` logger) for a mixup or cutmix alpha above the usual range."""
    augment = file.training.augment
    for name in ("mixup", "cutmix"):
        param = params.get(f"training.augment.{name}")
        values = [getattr(augment, name, 0.0) if augment is not None else 0.0]
        values += [param.value] if isinstance(param, Fixed) else [getattr(param, "max", 0.0)]
        alpha = max(v for v in values if isinstance(v, (int, float)))
        if alpha > MAX_USUAL_MIX_ALPHA:
            message = (
                f"alpha {alpha:g} mixes most samples about half and half (Beta({alpha:g}, {alpha:g})); "
                "the usual alpha is 0.1-1"
            )
            logging.getLogger("hfta_nas").warning(f"warning: {where.problem(('training', 'augment', name), message)}")


# ----------------------------------------------------------------------- study
def space_loss_kind(file: SpaceFile) -> str:
    """classification or regression: what the space's loss trains (and so which metrics exist)."""
    loss = file.training.loss
    return loss_kind(loss.name, loss.task) if loss is not None else "classification"


def measured_metrics(file: SpaceFile) -> list[str]:
    """The metrics training records for this space, every split (without importing a user loss)."""
    kind = space_loss_kind(file)
    return [
        name
        for split in ("train", "val", "test")
        for name in trained_metric_names(kind, list(file.training.metrics), split)
    ]


def _check_loss(run: _Run, file: SpaceFile) -> None:
    loss, kind = file.training.loss, space_loss_kind(file)
    if loss is not None:
        if loss.name not in LOSSES and not (":" in loss.name and _IDENTIFIER_PATH.match(loss.name.rpartition(":")[2])):
            close = difflib.get_close_matches(loss.name, LOSSES, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            run.add(
                ("training", "loss", "name"),
                f"unknown loss {short(loss.name)}{hint}; expected one of {', '.join(LOSSES)}, or 'module:function'",
            )
        if kind == "regression" and (loss.label_smoothing or loss.class_weights):
            run.add(
                ("training", "loss"),
                "label_smoothing and class_weights are options of a classification "
                f"loss (cross_entropy), not of '{loss.name}'",
            )
    for name, function in file.training.metrics.items():
        if not _IDENTIFIER.match(str(name)):
            run.add(
                ("training", "metrics", name),
                f"a metric name must be an identifier (it becomes val_{name}, ...), got {short(name)}",
            )
        elif ":" not in function or not _IDENTIFIER_PATH.match(function.rpartition(":")[2]):
            run.add(("training", "metrics", name), f"expected 'module:function', got {short(function)}")
    stopping = file.training.early_stopping
    if stopping is not None and stopping.metric not in measured_metrics(file):
        run.add(("training", "early_stopping", "metric"), _unknown_metric(stopping.metric, measured_metrics(file)))


def _unknown_metric(metric: str, known: list[str]) -> str:
    close = difflib.get_close_matches(str(metric), known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"metric {short(metric)} is not measured here{hint}; measured: {', '.join(known)}"


def _check_study(run: _Run, file: SpaceFile) -> SpaceFile:
    study = file.study
    metrics = list(study.metrics)
    seen: set[str] = set()
    known = [*measured_metrics(file), *STATIC_METRICS]
    for i, metric in enumerate(metrics):
        if metric in seen:
            run.add(("study", "metrics", i), f"metric '{metric}' is listed twice")
        elif metric not in known:
            run.add(("study", "metrics", i), _unknown_metric(metric, known))
        seen.add(metric)
    directions = study.directions
    if directions is None:
        if len(metrics) > 1:
            run.add(
                ("study",),
                f"missing key 'directions': with {len(metrics)} metrics {metrics} give one direction "
                "per metric, e.g. directions: [maximize, minimize]",
            )
            directions = [default_direction(m) for m in metrics]
        else:
            directions = [default_direction(metrics[0])]
    elif len(directions) != len(metrics):
        run.add(
            ("study", "directions"),
            f"expected {len(metrics)} direction(s), one per metric {metrics}, got {len(directions)}: {directions}",
        )
    else:
        _check_directions(run, file, metrics, directions)
    return file.model_copy(update={"study": study.model_copy(update={"directions": list(directions)})})


def _check_directions(run: _Run, file: SpaceFile, metrics: list[str], directions: list[str]) -> None:
    """A built-in metric searched the wrong way (val_acc minimized) would find the worst models."""
    kind = space_loss_kind(file)
    built_in = {name for split in ("train", "val", "test") for name in trained_metric_names(kind, [], split)}
    user = {f"{split}_{name}" for name in file.training.metrics for split in ("train", "val", "test")}
    for i, (metric, direction) in enumerate(zip(metrics, directions)):
        if metric in user or metric not in built_in:
            continue  # a user metric or a static value: its better side is the user's to say
        expected = default_direction(metric)
        if direction != expected:
            better = "higher" if expected == "maximize" else "lower"
            run.add(
                ("study", "directions", i),
                f"{direction} for {metric} would search for the worst models ({metric} is better {better}); "
                f"give {expected}, or leave directions out (they follow the metrics)",
            )


# ----------------------------------------------------------------------- model
def _check_model(run: _Run, file: SpaceFile) -> None:
    model = file.model
    if model.family is None and model.factory is None:
        run.add(
            ("model",),
            f"give exactly one of 'family' (one of {', '.join(FAMILIES)}) or 'factory' "
            "('module:function' or 'path/to/file.py:function')",
        )
        return
    if model.family is not None and model.factory is not None:
        run.add(("model",), "give exactly one of 'family' or 'factory', not both")
        return
    if model.family is not None and model.family not in FAMILIES:
        close = difflib.get_close_matches(model.family, FAMILIES, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        run.add(
            ("model", "family"),
            f"unknown model family '{model.family}'{hint}; expected one of "
            f"{', '.join(FAMILIES)}, or use 'factory' for your own model",
        )
    if model.factory is not None:
        module, _, attribute = model.factory.strip().rpartition(":")
        if not module.strip() or not _IDENTIFIER_PATH.match(attribute):
            run.add(
                ("model", "factory"),
                f"expected 'module:function' (e.g. 'my_models:build_net') or "
                f"'path/to/file.py:function', got {short(model.factory)}",
            )


def _family(file: SpaceFile) -> str | None:
    family = file.model.family
    return family if family in FAMILIES and file.model.factory is None else None


# ------------------------------------------------------------------------ data
def dataset_problem(name: str) -> str | None:
    text = name.strip()
    if text.lower() in DATASETS:
        return None
    if text.lower().endswith((".npz", ".csv")) or Path(text).expanduser().is_dir():
        return None
    if _FUNCTION_SOURCE.match(text):
        return None
    close = difflib.get_close_matches(text.lower(), DATASETS, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return (
        f"unknown dataset {short(name)}{hint}; expected one of the built-in datasets {', '.join(DATASETS)}, "
        "a path to a .npz or .csv file, a folder of .npy files, or 'module:function'"
    )


def _is_mnist1d(file: SpaceFile) -> bool:
    return file.data.dataset.strip().lower() == "mnist1d"


def _check_data(run: _Run, file: SpaceFile) -> None:
    data = file.data
    problem = dataset_problem(data.dataset)
    if problem:
        run.add(("data", "dataset"), problem)
    if data.num_samples is not None and not _is_mnist1d(file):
        run.add(
            ("data", "num_samples"),
            f"num_samples only applies to the generated 'mnist1d' dataset, not {data.dataset!r}; remove it",
        )


# ---------------------------------------------------------------------- params
_DISTRIBUTION_KEYS = {"min", "max", "values", "step", "low", "high", "choices", "log", "q", "lower", "upper"}


def _parse_params(run: _Run, file: SpaceFile) -> dict[str, Param]:
    params: dict[str, Param] = {}
    for path, raw in file.params.items():
        loc = ("params", path)
        if isinstance(raw, dict) and "distribution" in raw:
            name = raw["distribution"]
            if not isinstance(name, str) or name not in DISTRIBUTIONS:
                names = list(DISTRIBUTIONS)
                if isinstance(name, str) and name.lower() in FOREIGN_DISTRIBUTIONS:
                    hint = f" (did you mean {FOREIGN_DISTRIBUTIONS[name.lower()]}?)"
                else:
                    close = difflib.get_close_matches(str(name), names, n=1)
                    hint = f" (did you mean '{close[0]}'?)" if close else ""
                run.add(
                    (*loc, "distribution"),
                    f"unknown distribution {short(name)}{hint}; expected one of "
                    f"{', '.join(names)}, or a plain value to fix the parameter",
                )
                continue
            cls = DISTRIBUTIONS[name]
            try:
                params[path] = cls.model_validate(raw)
            except ValidationError as error:
                run.problems.extend(validation_problems(run.where, error, cls, prefix=loc))
        elif isinstance(raw, dict) and set(raw) == {"values"} and isinstance(raw["values"], list):
            # `{values: [...]}` alone is a categorical (as in Weights & Biases sweep files)
            try:
                params[path] = Categorical(distribution="categorical", values=raw["values"])
            except ValidationError as error:
                run.problems.extend(validation_problems(run.where, error, Categorical, prefix=loc))
        elif isinstance(raw, dict) and raw and _DISTRIBUTION_KEYS & set(raw):
            run.add(
                loc,
                f"missing key 'distribution' (one of {', '.join(DISTRIBUTIONS)}); a mapping with "
                f"{', '.join(sorted(str(k) for k in raw))} looks like a distribution",
            )
        else:
            params[path] = Fixed(value=raw)
    return params


@dataclass
class _Context:
    file: SpaceFile
    params: dict[str, Param]
    _base: dict[str, Any] | None = field(default=None, init=False)
    _base_done: bool = field(default=False, init=False)

    def possible(self, path: str, base: Any) -> list[Any]:
        """Values the setting at `path` can take: its fixed value, its categorical choices or `base`."""
        param = self.params.get(path)
        if isinstance(param, Fixed):
            return [param.value]
        if isinstance(param, Categorical):
            return list(param.values)
        return [base]

    @property
    def optimizer_names(self) -> list[str]:
        names = self.possible("training.optimizer.name", self.file.training.optimizer.name)
        return [n for n in names if isinstance(n, str) and n in OPTIMIZERS]

    @property
    def family(self) -> str | None:
        return _family(self.file)

    @property
    def shape(self) -> tuple[tuple[int, ...], int] | None:
        return BUILTIN_SHAPES.get(self.file.data.dataset.strip().lower())

    def model_base(self) -> dict[str, Any] | None:
        """The fixed model config that params vary: the section's config plus each valid fixed param.

        None when the section's config itself is invalid (reported once, not per param).
        """
        if self._base_done:
            return self._base
        base: dict[str, Any] | None = dict(self.file.model.config)
        family = self.family
        if family is not None and (
            any(k not in family_defaults(family) for k in base) or _model_config_problem(self, base)
        ):
            base = None
        elif family is not None:
            for path, param in self.params.items():
                key = path.removeprefix("model.config.")
                if (
                    path.startswith("model.config.")
                    and isinstance(param, Fixed)
                    and key in family_defaults(family)
                    and _model_config_problem(self, {**base, key: param.value}) is None
                ):
                    base[key] = param.value
        self._base, self._base_done = base, True
        return base


def _check_training(run: _Run, context: _Context) -> None:
    file = context.file
    optimizer = file.training.optimizer
    problem = _OPTIMIZER_NAME(optimizer.name)
    if problem and "training.optimizer.name" not in context.params:
        close = difflib.get_close_matches(str(optimizer.name), list(OPTIMIZERS), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        run.add(
            ("training", "optimizer", "name"),
            f"unknown optimizer {short(optimizer.name)}{hint}; expected one of {', '.join(OPTIMIZERS)}",
        )
    names = context.optimizer_names
    for key, value in optimizer.hparams.items():
        loc = ("training", "optimizer", key)
        message = _optimizer_arg_problem(str(key), names)
        if message:
            run.add(loc, message)
        elif (problem := _hparam_checker(str(key), names)(value)) is not None:
            run.add(loc, problem)
    given = set(optimizer.hparams) | {p.split(".")[-1] for p in context.params if p.startswith("training.optimizer.")}
    if "betas" in given and given & {"beta1", "beta2"}:
        run.add(("training", "optimizer"), "give either 'betas' or 'beta1'/'beta2', not both")

    schedule = file.training.schedule
    schedule_params = [p for p in context.params if p.startswith("training.schedule.")]
    if schedule is not None:
        for key, value in schedule.args.items():
            loc = ("training", "schedule", key)
            if key not in _SCHEDULE_LEAVES:
                run.add(loc, unknown_key_message(key, ["kind", *SCHEDULE_ARGS]))
            elif (problem := _SCHEDULE_LEAVES[key](value)) is not None:
                run.add(loc, problem)
        if schedule.kind is not None and (problem := _SCHEDULE_LEAVES["kind"](schedule.kind)) is not None:
            close = difflib.get_close_matches(str(schedule.kind), SCHEDULE_KINDS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            run.add(
                ("training", "schedule", "kind"),
                f"unknown schedule kind {short(schedule.kind)}{hint}; expected one of {', '.join(SCHEDULE_KINDS)}",
            )
    needs_kind = schedule is None or schedule.kind is None
    if (schedule is not None or schedule_params) and "training.schedule.kind" not in context.params and needs_kind:
        loc = ("training", "schedule") if schedule is not None else ("params", schedule_params[0])
        run.add(
            loc,
            f"a schedule needs 'kind' (one of {', '.join(SCHEDULE_KINDS)}); "
            "set training.schedule.kind or search it in params",
        )


def _optimizer_arg_problem(key: str, names: list[str]) -> str | None:
    for name in names:
        allowed = optimizer_args(name)
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            also = " (it is one of the searched optimizer names)" if len(names) > 1 else ""
            return f"optimizer '{name}'{also} has no argument '{key}'{hint}; it takes {', '.join(allowed)}"
    return None


def _model_config_problem(context: _Context, config: dict[str, Any]) -> str | None:
    family, shape = context.family, context.shape
    if family is None or shape is None:
        return None
    try:
        model_factory(family, config, input_shape=shape[0], num_classes=shape[1])
    except HftaNasError as error:
        return str(error)
    return None


def _check_model_config(run: _Run, context: _Context) -> None:
    """The model section's own config: its keys, and (for a built-in dataset) that it builds."""
    family = context.family
    if family is None:
        return
    allowed = list(family_defaults(family))
    unknown = [key for key in context.file.model.config if key not in allowed]
    for key in unknown:
        run.add(("model", "config", key), f"model family '{family}': " + unknown_key_message(key, allowed))
    if unknown:
        return
    problem = _model_config_problem(context, dict(context.file.model.config))
    if problem:
        if "expects input_shape" in problem:  # the family does not suit the dataset
            run.add(("model", "family"), f"{problem} (data.dataset is '{context.file.data.dataset}')")
        else:
            run.add(("model", "config"), problem)


def _leaf(context: _Context, path: str) -> Checker | str:
    """The value checker for the setting at dotted `path`, or why `path` names no setting."""
    parts = path.split(".")
    root = parts[0]
    if root in ("study", "sampler", "pruner", "budget", "array", "seed"):
        return (
            f"'{root}' settings cannot be params: only settings of one candidate (data.*, training.*, "
            f"model.config.*) can be searched or fixed there; set it in the '{root}' section"
        )
    if len(parts) == 1 or (
        root in ("training", "model") and parts[1] in ("optimizer", "schedule", "config") and len(parts) == 2
    ):
        inside = [p for p in _suggestions(context) if p.startswith(path + ".")] or _suggestions(context)
        return (
            f"'{path}' is a section, not one setting; params keys are dotted paths to one setting, "
            f"such as {', '.join(inside[:4])}"
        )
    if root == "data" and len(parts) == 2:
        if parts[1] == "dataset":
            return "the dataset cannot be a param: candidates of one study must be compared on the same data"
        if parts[1] in _DATA_LEAVES:
            return _DATA_LEAVES[parts[1]]
    if root == "training":
        if parts[1:] == ["epochs"]:
            return _checker(Epochs)
        if parts[1:] == ["accumulate"]:
            return _checker(PositiveInt)
        if parts[1:] in (["clip_norm"], ["clip_value"]):
            return _checker(PositiveFloat)
        if parts[1] == "optimizer" and len(parts) == 3:
            if parts[2] == "name":
                return _OPTIMIZER_NAME
            problem = _optimizer_arg_problem(parts[2], context.optimizer_names)
            return problem or _hparam_checker(parts[2], context.optimizer_names)
        if parts[1] == "schedule" and len(parts) == 3 and parts[2] in _SCHEDULE_LEAVES:
            return _SCHEDULE_LEAVES[parts[2]]
    if root == "model":
        if parts[1] in ("family", "factory") and len(parts) == 2:
            return (
                "the model family or factory cannot be a param (configs differ per family); write one space per family"
            )
        if parts[1] == "config" and len(parts) == 3:
            family = context.family
            if family is None:
                return _ANY  # a user factory: its arguments are its own business
            allowed = list(family_defaults(family))
            if parts[2] not in allowed:
                return f"model family '{family}': " + unknown_key_message(parts[2], allowed)
            base = context.model_base()

            def check(value: Any) -> str | None:
                if base is None:  # the model section is wrong; that is reported on its own
                    return None
                return _model_config_problem(context, {**base, parts[2]: value})

            return check
    close = _closest_setting(path, _suggestions(context))
    hint = f" (did you mean '{close}'?)" if close else ""
    return f"unknown setting '{path}'{hint}; params can address: {', '.join(_suggestions(context))}"


_LEAF_ALIASES = {"learning_rate": "lr", "wd": "weight_decay"}  # other libraries' names for our leaves


def _closest_setting(path: str, settings: list[str]) -> str | None:
    """The setting `path` most likely means: one with the same last name (or its alias:
    optimizer.config.learning_rate means training.optimizer.lr), the one sharing the longest start
    with `path` among them; else the closest spelling."""
    leaf = path.rpartition(".")[2]
    same_leaf = [s for s in settings if s.rpartition(".")[2] == _LEAF_ALIASES.get(leaf, leaf)]
    if same_leaf:
        return max(same_leaf, key=lambda s: len(os.path.commonprefix([s, path])))
    close = difflib.get_close_matches(path, settings, n=1, cutoff=0.6)
    return close[0] if close else None


def _suggestions(context: _Context) -> list[str]:
    paths = [f"data.{k}" for k in _DATA_LEAVES] + [
        "training.epochs",
        "training.clip_norm",
        "training.clip_value",
        "training.accumulate",
        "training.optimizer.name",
    ]
    for name in context.optimizer_names or ["adam"]:
        paths += [f"training.optimizer.{k}" for k in optimizer_args(name) if f"training.optimizer.{k}" not in paths]
    paths += [f"training.schedule.{k}" for k in _SCHEDULE_LEAVES]
    family = context.family
    paths += [f"model.config.{k}" for k in family_defaults(family)] if family else ["model.config.<argument>"]
    return paths


def _decimal(value: float) -> Decimal:
    return Decimal(repr(value))


def _divides(low: float, high: float, step: float) -> bool:
    try:
        return (_decimal(high) - _decimal(low)) % _decimal(step) == 0
    except (InvalidOperation, ArithmeticError):
        return False


def _distribution_problems(param: Param) -> list[tuple[str | None, str]]:
    """(sub-key, message) for bounds that do not make a distribution."""
    out: list[tuple[str | None, str]] = []
    if isinstance(param, (Uniform, LogUniform)):
        if not param.min < param.max:
            out.append(
                (
                    None,
                    f"'min' must be < 'max' (got min={param.min}, max={param.max}); "
                    "to fix a parameter write its value instead of a distribution",
                )
            )
        if isinstance(param, LogUniform) and param.min <= 0:
            out.append(
                ("min", f"log_uniform needs 'min' > 0 (got min={param.min}); use uniform for ranges that include 0")
            )
        uniform_with_step = isinstance(param, Uniform) and param.step is not None and param.min < param.max
        if uniform_with_step and not _divides(param.min, param.max, param.step):
            out.append(
                (
                    "step",
                    f"step {param.step} does not divide max - min = {param.max} - {param.min}; "
                    "Optuna would silently lower 'max' to the last multiple, so make "
                    "max - min a multiple of step",
                )
            )
    elif isinstance(param, (IntUniform, IntLogUniform)):
        if not param.min <= param.max:
            out.append((None, f"'min' must be <= 'max' (got min={param.min}, max={param.max})"))
        if isinstance(param, IntLogUniform) and param.min < 1:
            out.append(("min", f"int_log_uniform needs 'min' >= 1 (got min={param.min})"))
        if isinstance(param, IntUniform) and param.min <= param.max and (param.max - param.min) % param.step:
            last = param.max - (param.max - param.min) % param.step
            out.append(
                (
                    "step",
                    f"step {param.step} does not reach max: from min={param.min} the values are "
                    f"{param.min}, {param.min + param.step}, ..., {last}; Optuna would silently use "
                    f"max={last}, so set max to {last} or {last + param.step}",
                )
            )
    elif isinstance(param, Categorical):
        for i, value in enumerate(param.values):
            if not json_able(value):
                out.append(
                    (
                        f"values[{i}]",
                        f"choices must be numbers, strings, booleans, null, or lists / "
                        f"mappings of those, got {short(value)} ({type(value).__name__})",
                    )
                )
        if not out:
            seen: dict[Any, int] = {}
            for i, value in enumerate(param.values):
                encoded = encode_choice(value)
                if encoded in seen:
                    out.append(
                        (
                            f"values[{i}]",
                            f"choice {short(value)} repeats choice {seen[encoded]} "
                            f"({short(param.values[seen[encoded]])}); Optuna cannot tell them "
                            "apart (note 1, 1.0 and true are equal), list each choice once",
                        )
                    )
                    break
                seen[encoded] = i
    return out


def _samples(param: Param) -> list[tuple[str, Any]]:
    """Values a param can produce that are worth checking: its ends, each choice, or its value."""
    if isinstance(param, (Uniform, LogUniform)):
        return [("min", float(param.min)), ("max", float(param.max))]
    if isinstance(param, (IntUniform, IntLogUniform)):
        return [("min", param.min), ("max", param.max)]
    if isinstance(param, Categorical):
        return [(f"values[{i}]", v) for i, v in enumerate(param.values)]
    return [("", param.value)]


def _check_param(run: _Run, context: _Context, path: str, param: Param) -> None:
    loc = ("params", path)
    leaf = _leaf(context, path)
    if isinstance(leaf, str):
        run.add(loc, leaf)
        return
    problems = _distribution_problems(param)
    for sub, message in problems:
        run.add(loc, f"'{sub}': {message}" if sub else message)
    if problems:
        return
    for label, value in _samples(param):
        message = leaf(value)
        if message:
            if label.startswith("values["):
                run.add(loc, f"'{label}' = {short(value)}: {message}")
            elif label:
                if isinstance(param, (Uniform, LogUniform)) and message.startswith("expected an integer"):
                    message += "; this setting takes integers, use int_uniform or int_log_uniform"
                run.add(loc, f"'{label}': {message}")
            else:
                run.add(loc, message)
            return
    if (
        path == "data.num_samples"
        and not _is_mnist1d(context.file)
        and not (isinstance(param, Fixed) and param.value is None)
    ):
        run.add(loc, f"num_samples only applies to the generated 'mnist1d' dataset, not {context.file.data.dataset!r}")


def _numbers(param: Param) -> list[float] | None:
    """The numbers a searched setting can take at its ends or choices (None if not all are numbers)."""
    values = _samples(param)
    numbers = [v for _, v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return numbers if numbers and len(numbers) == len(values) else None


def _largest(param: Param | None, base: float) -> float | None:
    """The largest number a setting can take (None if its values are not numbers: reported elsewhere)."""
    if param is None:
        return base
    numbers = _numbers(param)
    return max(numbers) if numbers else None


def _smallest(param: Param) -> float | None:
    """The smallest number a searched setting can take (None if its values are not numbers)."""
    numbers = _numbers(param)
    return min(numbers) if numbers else None


def _check_fractions(run: _Run, context: _Context) -> None:
    """val_fraction + test_fraction < 1 for every candidate, not only for the section's values."""
    paths = ("data.val_fraction", "data.test_fraction")
    data = context.file.data
    largest = [_largest(context.params.get(p), b) for p, b in zip(paths, (data.val_fraction, data.test_fraction))]
    if None in largest or sum(largest) < 1:  # type: ignore[arg-type]
        return
    searched = [p for p in paths if p in context.params]
    loc = ("params", searched[0]) if searched else ("data",)
    run.add(
        loc,
        f"val_fraction + test_fraction must be < 1 to leave training data, but they can reach "
        f"{largest[0]} + {largest[1]}",
    )


def _check_metric_splits(run: _Run, context: _Context) -> None:
    """A val_* or test_* metric needs that split: a fraction of 0 (or one a param can make 0) leaves it empty."""
    data = context.file.data
    for metric in context.file.study.metrics:
        split = metric.split("_", 1)[0]
        if split not in ("val", "test") or metric.split("_", 1)[-1] not in ("acc", "loss"):
            continue
        path = f"data.{split}_fraction"
        param = context.params.get(path)
        smallest = getattr(data, f"{split}_fraction") if param is None else _smallest(param)
        if smallest == 0:
            loc = ("params", path) if param is not None else ("data", f"{split}_fraction")
            run.add(
                loc,
                f"the study's metric '{metric}' needs {'validation' if split == 'val' else 'test'} data, "
                f"but {split}_fraction can be 0; give it a fraction > 0 or choose another metric",
            )


# ---------------------------------------------------------- sampler and pruner
def grid_values(param: Param) -> list[Any] | str:
    """The grid points of a param for GridSampler, or why it has none."""
    if isinstance(param, Categorical):
        return [encode_choice(v) for v in param.values]
    if isinstance(param, IntUniform):
        count = (param.max - param.min) // param.step + 1
        if count > GRID_LIMIT:
            return f"has {count} grid values (more than {GRID_LIMIT}); use a larger 'step' or categorical"
        return list(range(param.min, param.max + 1, param.step))
    if isinstance(param, IntLogUniform):
        count = param.max - param.min + 1
        if count > GRID_LIMIT:
            return f"has {count} grid values (more than {GRID_LIMIT}); use categorical to list the points"
        return list(range(param.min, param.max + 1))
    if isinstance(param, Uniform) and param.step is not None:
        count = int((_decimal(param.max) - _decimal(param.min)) / _decimal(param.step)) + 1
        if count > GRID_LIMIT:
            return f"has {count} grid values (more than {GRID_LIMIT}); use a larger 'step' or categorical"
        return [float(_decimal(param.min) + i * _decimal(param.step)) for i in range(count)]
    name = param.distribution if not isinstance(param, Fixed) else "fixed"
    return (
        f"the grid sampler needs a finite set of values, but {name} is continuous; use categorical "
        "(values: [...]), int_uniform, or uniform with 'step'"
    )


def grid_space(params: dict[str, Param]) -> dict[str, Any]:
    """GridSampler's search_space: {path: grid values} (a str where a param has no grid)."""
    return {path: grid_values(param) for path, param in params.items() if not isinstance(param, Fixed)}


def _check_sampler_and_pruner(run: _Run, file: SpaceFile, params: dict[str, Param]) -> SpaceFile:
    sampler, pruner = file.sampler, file.pruner
    metrics = file.study.metrics
    multi = len(metrics) > 1
    cls = _optuna.SAMPLER_CLASSES[sampler.name]
    kwarg_problems = _optuna.check_kwargs("sampler", sampler.name, cls, sampler.kwargs)
    for sub, message in kwarg_problems:
        run.add(("sampler", "kwargs", *sub), message)
    if multi and sampler.name in _optuna.SINGLE_OBJECTIVE_SAMPLERS:
        run.add(
            ("sampler", "name"),
            f"sampler '{sampler.name}' optimises a single metric, but study.metrics has "
            f"{len(metrics)}; use nsga2, tpe, gp or random",
        )
    grid: dict[str, list[Any]] | None = None
    if sampler.name == "grid":
        grid = grid_space(params)
        for path, values in grid.items():
            if isinstance(values, str):
                run.add(("params", path), values)
    if not kwarg_problems and not run.problems:
        try:
            _optuna.build_sampler(sampler.name, sampler.kwargs, file.seed, grid)
        except Exception as error:  # Optuna's own argument checks (ValueError, TypeError, ...)
            run.add(("sampler", "kwargs"), f"sampler '{sampler.name}' rejected its arguments: {error}")

    name = pruner.name or ("none" if multi or file.pbt is not None else "median")  # pbt never prunes
    if multi and name != "none":
        run.add(
            ("pruner", "name"),
            f"pruner '{name}' cannot be used with {len(metrics)} metrics: Optuna prunes "
            "single-objective studies only; use pruner: none",
        )
    cls = _optuna.PRUNER_CLASSES[name]
    kwarg_problems = _optuna.check_kwargs("pruner", name, cls, pruner.kwargs)
    for sub, message in kwarg_problems:
        run.add(("pruner", "kwargs", *sub), message)
    if not kwarg_problems:
        try:
            _optuna.build_pruner(name, pruner.kwargs)
        except Exception as error:
            run.add(("pruner", "kwargs"), f"pruner '{name}' rejected its arguments: {error}")
    return file.model_copy(update={"pruner": pruner.model_copy(update={"name": name})})
