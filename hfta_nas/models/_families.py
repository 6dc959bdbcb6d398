"""Built-in model families, each built from a small config dict.

Every model is a plain composition of standard `torch.nn` layers: randomness
only through `nn.Dropout` modules (which the array swaps for per-slot dropout),
no functional random ops, no parameter tricks, and forward code written for one
model's batch [N, ...]. Parameter shapes depend only on (config, input_shape,
num_classes), so any number of models built from one config fuse into one array
whatever their seeds.

Validation happens before any layer is created (`_check`), so `model_factory`
can reject a bad config eagerly without touching torch's global RNG.
"""

from __future__ import annotations

import difflib
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hfta_nas.errors import HftaNasError
from hfta_nas.models._configs import (
    BNCNNConfig,
    CNN1dConfig,
    CNN2dConfig,
    ConvConfig,
    FamilyConfig,
    GRUConfig,
    MLPConfig,
    validate_config,
)

_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "silu": nn.SiLU}
_CONV = {1: nn.Conv1d, 2: nn.Conv2d}
_BATCH_NORM = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d}
_POOL = {("max", 1): nn.MaxPool1d, ("max", 2): nn.MaxPool2d, ("avg", 1): nn.AvgPool1d, ("avg", 2): nn.AvgPool2d}
_GLOBAL_AVG = {1: nn.AdaptiveAvgPool1d, 2: nn.AdaptiveAvgPool2d}


# --------------------------------------------------------------------------- mlp
def _check_mlp(cfg: MLPConfig, input_shape: tuple[int, ...]) -> None:
    """Any rank is fine: the MLP flattens each sample."""


def _build_mlp(cfg: MLPConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    layers: OrderedDict[str, nn.Module] = OrderedDict(flatten=nn.Flatten())
    features = math.prod(input_shape)
    for i in range(cfg.depth):
        layers[f"fc{i}"] = nn.Linear(features, cfg.width)
        if cfg.norm == "batch":
            layers[f"norm{i}"] = nn.BatchNorm1d(cfg.width)
        elif cfg.norm == "layer":
            layers[f"norm{i}"] = nn.LayerNorm(cfg.width)
        layers[f"act{i}"] = _ACTIVATIONS[cfg.activation]()
        if cfg.dropout > 0:
            layers[f"drop{i}"] = nn.Dropout(cfg.dropout)
        features = cfg.width
    layers["head"] = nn.Linear(features, num_classes)
    return nn.Sequential(layers)


# ------------------------------------------------------------------ convolutions
def _conv_dims(family: str, input_shape: tuple[int, ...]) -> int:
    """Number of spatial dims (1 or 2) the family's convolutions run over."""
    wanted = {"cnn1d": (2,), "cnn2d": (3,), "bn_cnn": (2, 3)}[family]
    if len(input_shape) not in wanted:
        forms = " or ".join({2: "(C, L)", 3: "(C, H, W)"}[r] for r in wanted)
        raise HftaNasError(
            f"model family '{family}' expects input_shape {forms} (per sample, channels first), "
            f"got {input_shape} with {len(input_shape)} dim(s). Use 'cnn1d' for signals (C, L), "
            "'cnn2d' for images (C, H, W), 'mlp' for flat features (F,)."
        )
    return len(input_shape) - 1


def _padding(cfg: ConvConfig) -> int:
    if cfg.padding == "same":
        return cfg.kernel_size // 2
    if cfg.padding == "valid":
        return 0
    return int(cfg.padding)


def _group_count(channels: int) -> int:
    """GroupNorm groups: the largest of min(4, C), ..., 1 that divides C."""
    return next(g for g in range(min(4, channels), 0, -1) if channels % g == 0)


def _conv_sizes(family: str, cfg: ConvConfig, input_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Spatial size after each conv block; an error naming the key if one reaches 0."""
    size = tuple(input_shape[1:])
    pad, k = _padding(cfg), cfg.kernel_size
    sizes = []
    for i in range(len(cfg.channels)):
        stride = cfg.stride if i == 0 else 1
        out = tuple((n + 2 * pad - k) // stride + 1 for n in size)
        if min(out) < 1:
            raise HftaNasError(
                f"model family '{family}': conv layer {i} (kernel_size={k}, padding={cfg.padding!r}) does not fit "
                f"its input of spatial size {size} (input_shape {input_shape}); use padding 'same', a smaller "
                "'kernel_size', fewer pooled layers ('channels' / 'pool') or a smaller 'stride'."
            )
        if cfg.pool != "none":
            if min(out) < 2:
                raise HftaNasError(
                    f"model family '{family}': key 'pool': pool={cfg.pool!r} halves the size after each of the "
                    f"{len(cfg.channels)} conv layers in 'channels', but after conv layer {i} the size is already "
                    f"{out} (input_shape {input_shape}), so pooling would shrink it to 0. Use fewer entries in "
                    "'channels', pool 'none', or a smaller 'stride'."
                )
            out = tuple(n // 2 for n in out)
        sizes.append(out)
        size = out
    return sizes


def _check_conv(family: str) -> Callable[[ConvConfig, tuple[int, ...]], None]:
    def check(cfg: ConvConfig, input_shape: tuple[int, ...]) -> None:
        _conv_dims(family, input_shape)
        _conv_sizes(family, cfg, input_shape)

    return check


def _build_conv(family: str) -> Callable[[ConvConfig, tuple[int, ...], int], nn.Module]:
    def build(cfg: ConvConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        dims = _conv_dims(family, input_shape)
        sizes = _conv_sizes(family, cfg, input_shape)
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        in_channels = input_shape[0]
        for i, out_channels in enumerate(cfg.channels):
            stride = cfg.stride if i == 0 else 1
            layers[f"conv{i}"] = _CONV[dims](
                in_channels, out_channels, cfg.kernel_size, stride=stride, padding=_padding(cfg)
            )
            if cfg.norm == "batch":
                layers[f"norm{i}"] = _BATCH_NORM[dims](out_channels)
            elif cfg.norm == "group":
                layers[f"norm{i}"] = nn.GroupNorm(_group_count(out_channels), out_channels)
            layers[f"act{i}"] = _ACTIVATIONS[cfg.activation]()
            if cfg.pool != "none":
                layers[f"pool{i}"] = _POOL[(cfg.pool, dims)](2)
            if cfg.dropout > 0:
                layers[f"drop{i}"] = nn.Dropout(cfg.dropout)
            in_channels = out_channels
        if cfg.head == "avg":
            layers["gap"] = _GLOBAL_AVG[dims](1)
            features = in_channels
        else:
            features = in_channels * math.prod(sizes[-1])
        layers["flatten"] = nn.Flatten()
        layers["head"] = nn.Linear(features, num_classes)
        return nn.Sequential(layers)

    return build


# ------------------------------------------------------------------- recurrent
class RecurrentClassifier(nn.Module):
    """GRU/LSTM over a sequence read from a channels-first sample, then a Linear head.

    Input (C, L) is read as L steps of C features; input (1, H, W) as H steps
    of W features (rows of the image). The head reads each direction's final
    state: the output at the last step, and for a bidirectional network the
    backward half at the first step, so both halves have seen the whole
    sequence (the same numbers as the last layer's h_n).
    """

    def __init__(self, rnn: nn.GRU | nn.LSTM, dropout: float, num_classes: int, image_rows: bool) -> None:
        super().__init__()
        self.image_rows = image_rows
        self.rnn = rnn
        self.drop = nn.Dropout(dropout) if dropout > 0 else None
        directions = 2 if rnn.bidirectional else 1
        self.head = nn.Linear(directions * rnn.hidden_size, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [N, 1, H, W] -> [N, H, W] ; [N, C, L] -> [N, L, C]
        steps = x.flatten(1, 2) if self.image_rows else x.transpose(1, 2)
        out, _ = self.rnn(steps)
        if self.rnn.bidirectional:
            hidden = self.rnn.hidden_size
            last = torch.cat([out[:, -1, :hidden], out[:, 0, hidden:]], dim=1)
        else:
            last = out[:, -1]
        if self.drop is not None:
            last = self.drop(last)
        return self.head(last)


def _check_gru(cfg: GRUConfig, input_shape: tuple[int, ...]) -> None:
    if len(input_shape) == 2 or (len(input_shape) == 3 and input_shape[0] == 1):
        return
    raise HftaNasError(
        f"model family 'gru' expects input_shape (C, L) (read as L steps of C features) or (1, H, W) "
        f"(read as H steps of W features), got {input_shape}. Use 'mlp' for flat features (F,) and "
        "'cnn2d' for multi-channel images."
    )


def _build_gru(cfg: GRUConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    _check_gru(cfg, input_shape)
    image_rows = len(input_shape) == 3
    features = input_shape[-1] if image_rows else input_shape[0]
    rnn_class = nn.LSTM if cfg.cell == "lstm" else nn.GRU
    rnn = rnn_class(
        features,
        cfg.hidden,
        num_layers=cfg.layers,
        batch_first=True,
        bidirectional=cfg.bidirectional,
        # torch applies (and warns about) inter-layer dropout only with >1 layer.
        dropout=cfg.dropout if cfg.layers > 1 else 0.0,
    )
    return RecurrentClassifier(rnn, cfg.dropout, num_classes, image_rows)


# -------------------------------------------------------------------- registry
@dataclass(frozen=True)
class _Family:
    schema: type[FamilyConfig]
    check: Callable[[Any, tuple[int, ...]], None]
    build: Callable[[Any, tuple[int, ...], int], nn.Module]


_FAMILIES: dict[str, _Family] = {
    "mlp": _Family(MLPConfig, _check_mlp, _build_mlp),
    "cnn1d": _Family(CNN1dConfig, _check_conv("cnn1d"), _build_conv("cnn1d")),
    "cnn2d": _Family(CNN2dConfig, _check_conv("cnn2d"), _build_conv("cnn2d")),
    "bn_cnn": _Family(BNCNNConfig, _check_conv("bn_cnn"), _build_conv("bn_cnn")),
    "gru": _Family(GRUConfig, _check_gru, _build_gru),
}

FAMILIES: tuple[str, ...] = tuple(_FAMILIES)
"""Names of the built-in model families, in the order the docs list them."""


def _family(family: str) -> _Family:
    if isinstance(family, str) and family in _FAMILIES:
        return _FAMILIES[family]
    close = difflib.get_close_matches(str(family).lower(), FAMILIES, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise HftaNasError(f"unknown model family {family!r}; choose one of: {', '.join(FAMILIES)}.{hint}")


def _shape_args(family: str, input_shape: Sequence[int], num_classes: int) -> tuple[int, ...]:
    if isinstance(input_shape, (str, bytes)) or not isinstance(input_shape, Sequence):
        raise HftaNasError(
            f"model family '{family}': input_shape must be a tuple of positive ints (one sample's shape, "
            f"e.g. (1, 40)), got {input_shape!r}."
        )
    shape = tuple(input_shape)
    if not shape or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in shape):
        raise HftaNasError(
            f"model family '{family}': input_shape must be a non-empty tuple of positive ints (one sample's "
            f"shape without the batch dim, e.g. (1, 40)), got {input_shape!r}."
        )
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise HftaNasError(f"model family '{family}': num_classes must be an int >= 1, got {num_classes!r}.")
    return shape


def _validated(family: str, config: Mapping[str, Any] | None, input_shape: Sequence[int], num_classes: int):
    spec = _family(family)
    cfg = validate_config(family, spec.schema, config)
    shape = _shape_args(family, input_shape, num_classes)
    spec.check(cfg, shape)
    return spec, cfg, shape


def build_model(
    family: str,
    config: Mapping[str, Any] | None = None,
    *,
    input_shape: Sequence[int],
    num_classes: int,
) -> nn.Module:
    """Build one classifier of a built-in family: input [N, *input_shape] -> logits [N, num_classes].

    `config` holds the family's keys (see `family_defaults`); missing keys take
    their defaults, unknown keys or bad values raise `HftaNasError`. The
    parameters are initialised from torch's global RNG, so seed it first (the
    array does, per slot).
    """
    spec, cfg, shape = _validated(family, config, input_shape, num_classes)
    return spec.build(cfg, shape, num_classes)


@dataclass(frozen=True)
class _FamilyFactory:
    """Zero-argument model factory: what `ModelArray.from_factory` calls per slot."""

    family: str
    config: FamilyConfig
    input_shape: tuple[int, ...]
    num_classes: int

    def __call__(self) -> nn.Module:
        return _FAMILIES[self.family].build(self.config, self.input_shape, self.num_classes)

    def __repr__(self) -> str:
        return (
            f"model_factory({self.family!r}, {self.config.model_dump()!r}, "
            f"input_shape={self.input_shape}, num_classes={self.num_classes})"
        )


def model_factory(
    family: str,
    config: Mapping[str, Any] | None = None,
    *,
    input_shape: Sequence[int],
    num_classes: int,
) -> Callable[[], nn.Module]:
    """A zero-argument callable that builds `build_model(family, config, ...)`.

    The config and shapes are validated now, so a bad config fails before any
    array is allocated; no model is built (torch's RNG is untouched) until the
    factory is called.
    """
    _, cfg, shape = _validated(family, config, input_shape, num_classes)
    return _FamilyFactory(family, cfg, shape, num_classes)


def family_defaults(family: str) -> dict[str, Any]:
    """The full default config of `family` (every key it accepts, with its default)."""
    return _family(family).schema().model_dump()


def count_parameters(model: nn.Module, *, trainable_only: bool = False) -> int:
    """Number of scalar parameters in `model` (shared tensors counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
