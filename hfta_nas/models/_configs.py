"""The config schema of each built-in model family, and its validation.

Search spaces sample these keys by name, so each family's config is a pydantic
model with `extra="forbid"` (a misspelt key is an error, not a silently
ignored default) and `strict=True` (`depth: "2"` or `bidirectional: "yes"` is
an error rather than a guess). Pydantic's `ValidationError` never reaches the
user: `validate_config` turns it into an `HftaNasError` that names the family,
the key, the problem and what is allowed.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hfta_nas.errors import HftaNasError

Activation = Literal["relu", "gelu", "tanh", "silu"]
Probability = Annotated[float, Field(ge=0.0, lt=1.0)]
PositiveInt = Annotated[int, Field(ge=1)]


class FamilyConfig(BaseModel):
    """Base of every family's config: unknown keys and loose types are errors."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class MLPConfig(FamilyConfig):
    """`mlp`: Flatten -> depth x [Linear -> norm -> activation -> Dropout] -> Linear head."""

    depth: Annotated[int, Field(ge=0)] = 2
    width: PositiveInt = 128
    activation: Activation = "relu"
    dropout: Probability = 0.0
    norm: Literal["none", "batch", "layer"] = "none"


class ConvConfig(FamilyConfig):
    """Shared keys of the convolutional families (`cnn1d`, `cnn2d`, `bn_cnn`).

    One block per entry of `channels`: Conv -> norm -> activation -> pool ->
    Dropout; then the head (`flatten` or global `avg` pooling) and a Linear.
    """

    channels: Annotated[list[PositiveInt], Field(min_length=1)]
    kernel_size: PositiveInt
    stride: PositiveInt = 1
    padding: str | int = "same"
    activation: Activation = "relu"
    pool: Literal["none", "max", "avg"] = "none"
    dropout: Probability = 0.0
    norm: Literal["none", "batch", "group"] = "none"
    head: Literal["flatten", "avg"] = "flatten"

    @field_validator("channels", mode="before")
    @classmethod
    def _tuple_to_list(cls, value: Any) -> Any:
        # YAML gives lists, Python users often tuples; both mean the same.
        return list(value) if isinstance(value, tuple) else value

    @field_validator("padding", mode="plain")
    @classmethod
    def _check_padding(cls, value: Any) -> str | int:
        if value in ("same", "valid"):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        raise ValueError("expected 'same' (kernel_size // 2 on each side), 'valid' (no padding) or an int >= 0")


class CNN1dConfig(ConvConfig):
    """`cnn1d`: MNIST-1D style convolutions over input (C, L)."""

    channels: Annotated[list[PositiveInt], Field(min_length=1)] = Field(default_factory=lambda: [32, 32, 32])
    kernel_size: PositiveInt = 5


class CNN2dConfig(ConvConfig):
    """`cnn2d`: small-image convolutions over input (C, H, W)."""

    channels: Annotated[list[PositiveInt], Field(min_length=1)] = Field(default_factory=lambda: [16, 32])
    kernel_size: PositiveInt = 3


class BNCNNConfig(ConvConfig):
    """`bn_cnn`: Conv1d or Conv2d by input rank, with BatchNorm on by default."""

    channels: Annotated[list[PositiveInt], Field(min_length=1)] = Field(default_factory=lambda: [32, 32])
    kernel_size: PositiveInt = 3
    norm: Literal["none", "batch", "group"] = "batch"


class GRUConfig(FamilyConfig):
    """`gru`: a recurrent sequence classifier (GRU or LSTM) with a Linear head."""

    hidden: PositiveInt = 64
    layers: PositiveInt = 1
    bidirectional: bool = False
    dropout: Probability = 0.0
    cell: Literal["gru", "lstm"] = "gru"


def _plain(value: Any) -> Any:
    """NumPy scalars -> Python scalars, so strict mode accepts `np.int64(3)`."""
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return value.item()
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def _key_name(loc: tuple[Any, ...]) -> str:
    name = str(loc[0]) if loc else "<config>"
    for part in loc[1:]:
        name += f"[{part}]" if isinstance(part, int) else f".{part}"
    return name


def _describe(family: str, schema: type[FamilyConfig], error: ValidationError) -> str:
    allowed = list(schema.model_fields)
    problems = []
    for item in error.errors():
        key = _key_name(item["loc"])
        if item["type"] == "extra_forbidden":
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            problems.append(f"unknown key '{key}'{hint}; allowed keys: {', '.join(allowed)}")
        else:
            message = item["msg"].removeprefix("Value error, ")
            got = item.get("input")
            problems.append(f"key '{key}': {message}; got {got!r} ({type(got).__name__})")
    return (
        f"model family '{family}': invalid config: {'; '.join(problems)}."  # one line: it becomes `file:line: key: ...`
    )


def validate_config(family: str, schema: type[FamilyConfig], config: Mapping[str, Any] | None) -> FamilyConfig:
    """`config` checked against `schema`, missing keys filled with defaults."""
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise HftaNasError(
            f"model family '{family}': config must be a mapping of keys to values "
            f"(allowed keys: {', '.join(schema.model_fields)}), got {type(config).__name__}."
        )
    non_str = [k for k in config if not isinstance(k, str)]
    if non_str:
        raise HftaNasError(f"model family '{family}': config keys must be strings, got {non_str[0]!r}.")
    try:
        return schema.model_validate({k: _plain(v) for k, v in config.items()})
    except ValidationError as error:
        raise HftaNasError(_describe(family, schema, error)) from None
