"""How a population-based training run exploits and explores: `Explore` per hyper-parameter and
`PBTSettings` for the run, each checked once, with one line naming what is wrong.

The names follow Ray Tune's `PopulationBasedTraining` (quantile, resample probability,
perturbation factors), so a Ray user reads them as they know them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hfta_nas._limits import MAX_ARRAY_SIZE
from hfta_nas.errors import HftaNasError


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Explore:
    """How explore changes one hyper-parameter of a member that has just copied a better one.

    With probability `resample_probability` (a setting of the run) the value is drawn afresh
    from [low, high] (log-uniformly when `log`); otherwise it is multiplied by one of `factors`,
    chosen uniformly, and clipped to [low, high].
    """

    low: float
    high: float
    log: bool = False
    factors: tuple[float, ...] = (0.8, 1.25)

    def __post_init__(self) -> None:
        if not (_number(self.low) and _number(self.high) and self.low < self.high):
            raise HftaNasError(f"explore needs finite low < high, got low={self.low!r}, high={self.high!r}.")
        if self.log and self.low <= 0:
            raise HftaNasError(f"a log-scale explore needs low > 0, got {self.low!r}.")
        factors = tuple(self.factors) if isinstance(self.factors, (list, tuple)) else ()
        if not factors or not all(_number(f) and f > 0 for f in factors):
            raise HftaNasError(f"explore factors must be positive numbers, got {self.factors!r}.")
        object.__setattr__(self, "factors", tuple(float(f) for f in factors))

    def new_value(self, value: float, rng: np.random.Generator, resample_probability: float) -> float:
        """The explored value (`rng` draws the coin, then the factor or the fresh value)."""
        if rng.random() < resample_probability:
            if self.log:
                return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
            return float(rng.uniform(self.low, self.high))
        factor = self.factors[int(rng.integers(len(self.factors)))]
        return float(min(max(value * factor, self.low), self.high))


@dataclass(frozen=True)
class PBTSettings:
    """One PBT run: `population` members (the array's slots, one Optuna trial each) train together;
    every `interval` epochs the worst `quantile` of them (by `metric`) copy a member of the best
    `quantile` (exploit) and change the hyper-parameters in `explore` (explore)."""

    population: int = 8
    interval: int = 4
    metric: str | None = None  # default: the study's metric name, else val_acc
    quantile: float = 0.25
    resample_probability: float = 0.25
    explore: Mapping[str, Explore] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("population", "interval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (2 if name == "population" else 1):
                least = "2 (a population copies between members)" if name == "population" else "1"
                raise HftaNasError(f"pbt {name} must be an integer of at least {least}, got {value!r}.")
        if self.population > MAX_ARRAY_SIZE:
            raise HftaNasError(f"pbt population must be at most {MAX_ARRAY_SIZE} (one array), got {self.population}.")
        if not (_number(self.quantile) and 0 < self.quantile <= 0.5):
            raise HftaNasError(
                f"pbt quantile must be in (0, 0.5] (the bottom share copies the top share), got {self.quantile!r}."
            )
        if not (_number(self.resample_probability) and 0 <= self.resample_probability <= 1):
            raise HftaNasError(f"pbt resample_probability must be in [0, 1], got {self.resample_probability!r}.")
        if not isinstance(self.explore, Mapping) or not self.explore:
            raise HftaNasError("pbt explore names no hyper-parameter; give at least one, e.g. {'lr': Explore(...)}.")
        for name, how in self.explore.items():
            if not isinstance(how, Explore):
                raise HftaNasError(f"pbt explore['{name}'] must be an hfta_nas.Explore, got {how!r}.")
        if self.metric is not None and not (isinstance(self.metric, str) and self.metric):
            raise HftaNasError(f"pbt metric must be a metric name such as val_acc, got {self.metric!r}.")

    def movers(self, running: int) -> int:
        """How many of `running` members copy another at an exploit: the quantile of them, at least one
        and at most half."""
        return max(1, min(math.ceil(running * self.quantile), running // 2))
