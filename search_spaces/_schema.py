"""The search space file's sections and parameter distributions as pydantic models.

Every model forbids unknown keys (a misspelt key is an error, never a silently
ignored default) and is strict (`epochs: "10"` or `epochs: 10.5` is an error,
not a guess). Values that depend on other sections (optimizer arguments,
schedule arguments, model config keys) are checked afterwards by `_checks`,
which knows the optimizer, schedule and family in use.
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hfta_nas import (
    DEFAULT_STORAGE_PATIENCE_S,
    MAX_ARRAY_SIZE,
    MAX_BATCH_SIZE,
    MAX_EPOCHS,
    MAX_STORAGE_PATIENCE_S,
    MAX_TRIALS,
    higher_is_better,
)

from ._yaml import Loc, Where

# ------------------------------------------------------------------ value types
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
# settings with a ceiling (hfta_nas._limits), as a fixed value and as a searched param's range alike
Epochs = Annotated[int, Field(ge=1, le=MAX_EPOCHS)]
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]
UnitFactor = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]

Metric = Literal[
    "val_acc",
    "val_loss",
    "test_acc",
    "test_loss",
    "train_loss",
    "train_acc",
    "params",
    "latency_ms",
    "val_rmse",
    "val_mae",
    "val_r2",
    "test_rmse",
    "test_mae",
    "test_r2",
    "train_rmse",
    "train_mae",
    "train_r2",
]
Direction = Literal["minimize", "maximize"]
SamplerName = Literal["tpe", "random", "cmaes", "gp", "grid", "nsga2"]
PrunerName = Literal["none", "median", "successive_halving", "hyperband"]

METRICS: tuple[str, ...] = get_args(Metric)
SAMPLERS: tuple[str, ...] = get_args(SamplerName)
PRUNERS: tuple[str, ...] = get_args(PrunerName)


def default_direction(metric: str) -> str:
    """Accuracy and R^2 are maximised; losses, errors, sizes and latencies minimised."""
    return "maximize" if higher_is_better(metric) else "minimize"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --------------------------------------------------------------------- sections
class StudySpec(_Strict):
    """What is optimised: metric names and their directions (filled in from the metrics), and
    storage_patience: seconds a worker waits for an unreachable storage to come back before it stops."""

    name: str | None = None
    # built-in names (METRICS) or `<split>_<name>` of a user metric in training.metrics
    metrics: Annotated[list[str], Field(min_length=1)] = ["val_acc"]
    directions: list[Direction] | None = None
    storage_patience: Annotated[float, Field(ge=0, le=MAX_STORAGE_PATIENCE_S, allow_inf_nan=False)] = (
        DEFAULT_STORAGE_PATIENCE_S
    )


class SamplerSpec(_Strict):
    """The Optuna sampler; `kwargs` go to its class (defaults merged for tpe)."""

    name: SamplerName = "tpe"
    kwargs: dict[str, Any] = {}

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:  # `sampler: tpe` is short for `sampler: {name: tpe}`
        return {"name": value} if isinstance(value, str) else value


class PrunerSpec(_Strict):
    """The Optuna pruner (None until filled: median, or none for multi-objective studies)."""

    name: PrunerName | None = None
    kwargs: dict[str, Any] = {}

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:  # `sampler: tpe` is short for `sampler: {name: tpe}`
        return {"name": value} if isinstance(value, str) else value


class BudgetSpec(_Strict):
    """When the search stops: after `n_trials` trials or `timeout` seconds, whichever is first."""

    n_trials: Annotated[int, Field(ge=1, le=MAX_TRIALS)] | None = 32
    timeout: PositiveFloat | None = None


class StepCostSpec(_Strict):
    """A fixed cost model for the packing (seconds per training step: fixed_s +
    per_gmac_s x GMACs of the step), to repeat a search's packing exactly; the
    measured one is stored in the study's user attributes (`step_cost:...`)."""

    fixed_s: Annotated[float, Field(ge=0)]
    per_gmac_s: Annotated[float, Field(ge=0)]


class ArraySpec(_Strict):
    """How candidates are put into arrays.

    size: slots per array ("auto", the default: the knee of the structure's measured step curve,
    bounded by memory and a third of the trial budget).
    fill: "pack" (every trial as the sampler proposed it, packed by measured
    cost) or "replicate" (each array's other slots copy its first trial's
    architecture: HPO over fixed architectures).
    max_waste: at most this fraction of an array's multiply-adds may be padding
    (default: no bound; 0 packs equal shapes only).
    step_cost: pin the packing's cost model instead of measuring it (see StepCostSpec).
    """

    size: int | str = "auto"
    fill: Literal["pack", "replicate"] = "pack"
    max_waste: Annotated[float, Field(ge=0, le=1)] | None = None
    step_cost: StepCostSpec | None = None

    @field_validator("size", mode="plain")
    @classmethod
    def _size(cls, value: Any) -> int | str:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_ARRAY_SIZE):
            return value
        raise ValueError(f"expected an integer from 1 to {MAX_ARRAY_SIZE} or 'auto'")


class DataSpec(_Strict):
    """The dataset and its split; `dataset` is a name, a .npz/.csv path or 'module:function'."""

    dataset: str = "mnist1d"
    batch_size: BatchSize = 100
    val_fraction: Fraction = 0.1
    test_fraction: Fraction = 0.1
    split_seed: NonNegativeInt = 0
    num_samples: PositiveInt | None = None


def _split_off(value: Any, main: str, rest: str) -> Any:
    """`{main: x, a: 1}` -> `{main: x, rest: {a: 1}}`: flat in the file, split in Python."""
    if isinstance(value, str):
        return {main: value, rest: {}}
    if isinstance(value, dict):
        out = {rest: {k: v for k, v in value.items() if k != main}}
        if main in value:
            out[main] = value[main]
        return out
    return value


class OptimizerSpec(_Strict):
    """`{name: adam, lr: 1e-3, ...}`: the array optimizer and its hyper-parameters."""

    name: str = "adam"
    hparams: dict[str, Any] = {}

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, value: Any) -> Any:
        return _split_off(value, "name", "hparams")


class ScheduleSpec(_Strict):
    """`{kind: cosine, t_max: 10, ...}`: an LRSchedule kind and its arguments."""

    kind: str | None = None
    args: dict[str, Any] = {}

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, value: Any) -> Any:
        return _split_off(value, "kind", "args")


class EarlyStoppingSpec(_Strict):
    """Stop a slot when `metric` has not improved by more than `min_delta` for `patience` epochs
    (`mode`: min or max; default max for *_acc metrics, else min)."""

    metric: str = "val_loss"  # any measured metric: val_loss, val_acc, val_rmse, val_<user metric>, ...
    patience: PositiveInt = 3
    min_delta: NonNegativeFloat = 0.0
    mode: Literal["min", "max"] | None = None


class LossSpec(_Strict):
    """`cross_entropy` (label_smoothing, class_weights), `mse`, `mae`, `huber` (delta), or a user
    'module:function' (per-sample losses, torch's reduction="none"; `task` says whether it
    classifies); `masked`: missing targets (-100 labels, NaN values) are left out."""

    name: str = "cross_entropy"
    label_smoothing: Fraction = 0.0
    class_weights: list[NonNegativeFloat] | None = None
    delta: PositiveFloat = 1.0
    masked: bool = False
    task: Literal["classification", "regression"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:  # `loss: mse` is short for `loss: {name: mse}`
        return {"name": value} if isinstance(value, str) else value


class AugmentSpec(_Strict):
    """On-device augmentation of each slot's training batches, seeded from its data seed:
    `shift` (pad and random crop, samples), `flip` (last axis, p=1/2), `noise` (Gaussian std),
    `mixup` and `cutmix` (Beta alpha; 0: off)."""

    shift: NonNegativeInt = 0
    flip: bool = False
    noise: NonNegativeFloat = 0.0
    mixup: NonNegativeFloat = 0.0
    cutmix: NonNegativeFloat = 0.0


class TrainingSpec(_Strict):
    """Epochs, the optimizer and schedule, per-slot gradient clipping (`clip_norm`,
    `clip_value`: searchable per slot), micro-batches per step (`accumulate`) and
    per-slot early stopping."""

    epochs: Epochs = 10
    optimizer: OptimizerSpec = OptimizerSpec()
    schedule: ScheduleSpec | None = None
    clip_norm: PositiveFloat | None = None
    clip_value: PositiveFloat | None = None
    accumulate: PositiveInt = 1
    early_stopping: EarlyStoppingSpec | None = None
    loss: LossSpec | None = None
    # user metrics: name -> 'module:function' (per-sample values), as <split>_<name>
    metrics: dict[str, str] = {}
    augment: AugmentSpec | None = None
    # bf16 / fp16: autocast (fp16 with per-slot loss scaling)
    precision: Literal["float32", "bf16", "fp16"] = "float32"


class ModelSpec(_Strict):
    """A built-in `family` or a user `factory` ('module:function' or 'file.py:function'), and its config."""

    family: str | None = None
    factory: str | None = None
    config: dict[str, Any] = {}

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"factory": value} if ":" in value else {"family": value}
        if isinstance(value, dict) and value.get("config", 0) is None:
            return {**value, "config": {}}
        return value


class PBTExploreSpec(_Strict):
    """How explore changes one hyper-parameter: multiplied by one of `factors` (clipped to [min, max]),
    or drawn afresh from [min, max] (log-uniformly when `log`) with the run's resample probability.
    min, max and log default to the param's distribution in `params` when it is searched there."""

    factors: Annotated[list[Annotated[float, Field(gt=0, allow_inf_nan=False)]], Field(min_length=1)] = [0.8, 1.25]
    min: FiniteFloat | None = None
    max: FiniteFloat | None = None
    log: bool | None = None


class PBTSpec(_Strict):
    """Population-based training instead of a search: `population` members (one Optuna trial each, the
    slots of one array) train `training.epochs` epochs; every `interval` epochs the worst `quantile` copy
    a member of the best `quantile` (weights, optimizer state, schedule position) and explore."""

    population: Annotated[int, Field(ge=2, le=MAX_ARRAY_SIZE)] = 8
    interval: PositiveInt = 4
    metric: str | None = None  # default: the study's metric
    quantile: Annotated[float, Field(gt=0, le=0.5)] = 0.25
    resample_probability: Annotated[float, Field(ge=0, le=1)] = 0.25
    explore: Annotated[dict[str, PBTExploreSpec], Field(min_length=1)]


# ---------------------------------------------------------------- distributions
class _Distribution(_Strict):
    distribution: str


class Uniform(_Distribution):
    """Floats in [min, max] (on a grid of `step` from min when step is given)."""

    distribution: Literal["uniform"]
    min: FiniteFloat
    max: FiniteFloat
    step: PositiveFloat | None = None


class LogUniform(_Distribution):
    """Floats in [min, max], uniform in log space (min > 0)."""

    distribution: Literal["log_uniform"]
    min: FiniteFloat
    max: FiniteFloat


class IntUniform(_Distribution):
    """Integers min, min+step, ..., max: both ends included."""

    distribution: Literal["int_uniform"]
    min: int
    max: int
    step: PositiveInt = 1


class IntLogUniform(_Distribution):
    """Integers in [min, max] (both included), uniform in log space (min >= 1)."""

    distribution: Literal["int_log_uniform"]
    min: int
    max: int


class Categorical(_Distribution):
    """One of `values`; a value may be a list or mapping (e.g. a channels list)."""

    distribution: Literal["categorical"]
    values: Annotated[list[Any], Field(min_length=1)]


class Fixed(_Strict):
    """A parameter set to one value (written as a plain value in the file)."""

    value: Any


Distribution = Uniform | LogUniform | IntUniform | IntLogUniform | Categorical
Param = Distribution | Fixed

DISTRIBUTIONS: dict[str, type[_Distribution]] = {
    "uniform": Uniform,
    "log_uniform": LogUniform,
    "int_uniform": IntUniform,
    "int_log_uniform": IntLogUniform,
    "categorical": Categorical,
}

# Names other tools use, so the error can say what this one is called.
FOREIGN_DISTRIBUTIONS = {
    "loguniform": "log_uniform",
    "log-uniform": "log_uniform",
    "reciprocal": "log_uniform",
    "float": "uniform",
    "quniform": "uniform (with 'step')",
    "q_uniform": "uniform (with 'step')",
    "randint": "int_uniform (note: here 'max' is included)",
    "int": "int_uniform",
    "integer": "int_uniform",
    "qrandint": "int_uniform (with 'step')",
    "int_loguniform": "int_log_uniform",
    "lograndint": "int_log_uniform",
    "choice": "categorical",
    "choices": "categorical",
    "constant": "a plain value (a fixed parameter)",
    "fixed": "a plain value (a fixed parameter)",
}
FOREIGN_KEYS = {
    "low": "min",
    "high": "max",
    "lower": "min",
    "upper": "max",
    "choices": "values",
    "q": "step",
    "log": None,
}


# --------------------------------------------------------- error descriptions
_ROOT_KEYS = (
    "study",
    "sampler",
    "pruner",
    "budget",
    "array",
    "data",
    "training",
    "model",
    "pbt",
    "seed",
    "params",
    "constraints",
)


def _allowed_keys(model: type[BaseModel], loc: Loc) -> list[str] | None:
    """Keys accepted at `loc` (a path into `model`), for unknown-key messages."""
    current: Any = model
    keyed = False  # the part is a key of a mapping of models (constraints: {metric: {...}})
    for part in loc:
        if keyed:
            keyed = False
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        info = current.model_fields.get(str(part))
        if info is None:
            return None
        keyed = getattr(info.annotation, "__origin__", None) is dict
        current = next(
            (
                a
                for a in (info.annotation, *get_args(info.annotation))
                if isinstance(a, type) and issubclass(a, BaseModel)
            ),
            None,
        )
    if not (isinstance(current, type) and issubclass(current, BaseModel)):
        return None
    if current is OptimizerSpec:
        return None
    return list(current.model_fields)


def short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def unknown_key_message(key: Any, allowed: list[str], hints: dict[str, str | None] | None = None) -> str:
    hint = ""
    if hints and str(key) in hints and hints[str(key)]:
        hint = f" (did you mean '{hints[str(key)]}'?)"
    else:
        close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
        if close:
            hint = f" (did you mean '{close[0]}'?)"
    return f"unknown key '{key}'{hint}; allowed keys: {', '.join(allowed)}"


def describe_error(item: dict[str, Any], allowed: list[str] | None) -> str:
    """One pydantic error as `what was expected, got what`."""
    kind, got = item["type"], item.get("input")
    loc = item["loc"]
    if kind == "extra_forbidden":
        return unknown_key_message(loc[-1] if loc else "?", allowed or [], FOREIGN_KEYS)
    if kind == "missing":
        return f"missing required key '{loc[-1]}'" if loc else "missing value"
    message = item["msg"].removeprefix("Value error, ")
    message = message.replace("Input should be", "expected").replace("input should be", "expected")
    if kind == "literal_error":
        choices = [c.strip("'") for c in item.get("ctx", {}).get("expected", "").replace(" or ", ", ").split(", ")]
        close = difflib.get_close_matches(str(got), choices, n=1) if isinstance(got, str) else []
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return f"expected one of {', '.join(repr(c) for c in choices)}, got {short(got)}{hint}"
    ctx = item.get("ctx") or {}
    plain = {
        "dict_type": "expected a mapping (key: value lines)",
        "model_type": "expected a mapping (key: value lines)",
        "model_attributes_type": "expected a mapping (key: value lines)",
        "list_type": "expected a list",
        "tuple_type": "expected a list",
        "int_type": "expected an integer",
        "float_type": "expected a number",
        "string_type": "expected a string",
        "bool_type": "expected true or false",
        "finite_number": "expected a finite number",
        "greater_than_equal": f"expected a value >= {ctx.get('ge')}",
        "greater_than": f"expected a value > {ctx.get('gt')}",
        "less_than_equal": f"expected a value <= {ctx.get('le')}",
        "less_than": f"expected a value < {ctx.get('lt')}",
        "too_short": f"expected at least {ctx.get('min_length')} item(s)",
        "too_long": f"expected at most {ctx.get('max_length')} item(s)",
    }
    message = plain.get(kind, message)
    return f"{message}, got {short(got)} ({type(got).__name__})"


def validation_problems(where: Where, error: ValidationError, model: type[BaseModel], prefix: Loc = ()) -> list:
    problems = []
    for item in error.errors():
        loc = tuple(p for p in item["loc"] if p != "[key]")
        allowed = _allowed_keys(model, loc[:-1]) if item["type"] == "extra_forbidden" else None
        if item["type"] == "extra_forbidden" and not prefix and len(loc) == 1:
            allowed = list(_ROOT_KEYS)
        # An unknown key first: it usually explains the missing one next to it (low: -> min).
        rank = 0 if item["type"] == "extra_forbidden" else 1
        problems.append((rank, where.problem((*prefix, *loc), describe_error(item, allowed))))
    problems.sort(key=lambda p: (p[1].line or 0, p[0]))
    return [problem for _, problem in problems]


class ConstraintSpec(_Strict):
    """An outcome constraint on one metric of a completed trial: at most `max`, at least `min`
    (Optuna's constraints: a trial is feasible when every one holds)."""

    max: FiniteFloat | None = None
    min: FiniteFloat | None = None


class SpaceFile(_Strict):
    """The top level of a search space file (what the YAML may contain)."""

    study: StudySpec = StudySpec()
    sampler: SamplerSpec = SamplerSpec()
    pruner: PrunerSpec = PrunerSpec()
    budget: BudgetSpec = BudgetSpec()
    array: ArraySpec = ArraySpec()
    data: DataSpec = DataSpec()
    training: TrainingSpec = TrainingSpec()
    model: ModelSpec = ModelSpec()
    pbt: PBTSpec | None = None
    seed: NonNegativeInt | None = 0
    params: dict[str, Any] = {}
    constraints: dict[str, ConstraintSpec] = {}
