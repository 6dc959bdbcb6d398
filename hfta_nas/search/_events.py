"""What a search tells its caller as it goes (`optimize(..., on_event=...)`): one
dataclass per kind of event, so a progress display matches on types, not strings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hfta_nas.envelope._probe import padding_fraction


@dataclass(frozen=True)
class SearchStarted:
    study: str
    storage: str
    dashboard: str
    done: int  # finished trials already in the study that count against the budget
    n_trials: int | None
    timeout: float | None
    states: dict[str, int]  # trials by state, before this run
    metrics: list[str]
    directions: list[str]
    best_values: list[list[float]]  # the best trial's values, or the Pareto front's


@dataclass(frozen=True)
class ArraySizeChosen:
    """`array_size="auto"` measured a size for one structure of models."""

    structure: str
    size: int
    reason: str


@dataclass(frozen=True)
class ArrayStarted:
    array: int
    trials: list[int]
    array_size: int  # the slots an array may have
    architectures: int  # distinct models (shapes) among its slots
    useful_macs: int  # per sample, over its slots: what their own models need
    executed_macs: int  # per sample, over its slots: what the array runs (envelope x slots)
    estimated_s: float  # what the packing's cost model expects it to take

    @property
    def waste(self) -> float:
        return padding_fraction(self.useful_macs, self.executed_macs)


@dataclass(frozen=True)
class ArrayResumed:
    """An array a stopped run left mid-training continues from its checkpoint: the retried
    trials take their slots, after `epoch` epochs already trained."""

    array: int
    trials: list[int]
    epoch: int


@dataclass(frozen=True)
class EpochEnded:
    array: int
    epoch: int
    running: int
    array_size: int
    occupancy: float  # running slots / array size, this epoch
    mean_occupancy: float  # over every epoch of this run so far
    samples_per_s: float  # training samples of this run / its wall time, summed over slots


@dataclass(frozen=True)
class TrialStarted:
    """A trial took slot `attributes["slot"]` of array `attributes["array_id"]` (its user attributes, seeds too)."""

    trial: int
    params: dict[str, Any]
    attributes: dict[str, Any]


@dataclass(frozen=True)
class TrialEpochEnded:
    """One trial's metrics after `epoch` epochs (every metric its slot measured, objectives included)."""

    trial: int
    epoch: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class TrialEnded:
    trial: int
    state: str  # COMPLETE, PRUNED or FAIL
    values: list[float] = field(default_factory=list)
    reason: str = ""
    feasible: bool = True  # False: a COMPLETE trial past one of its constraints (it cannot be the best)


@dataclass(frozen=True)
class SlotRefilled:
    array: int
    slot: int
    old: int
    new: int
    why: str  # pruned or failed


@dataclass(frozen=True)
class TrialWaits:
    """An asked trial that does not fit the running array waits for a later one."""

    trial: int
    array: int


@dataclass(frozen=True)
class TrialRetried:
    trial: int
    why: str


@dataclass(frozen=True)
class ArraySplit:
    """Out of memory: these slots train in arrays of `half` from now on."""

    slots: int
    half: int
    reason: str


@dataclass(frozen=True)
class ArrayRefused:
    """A check refused a slot's place in array `array` (or its model): the `refused` trials train again
    in arrays of their own, the `again` ones (the refused among them) from the start."""

    array: int
    refused: list[int]
    again: list[int]
    reason: str


@dataclass(frozen=True)
class ArrayFailed:
    array: int
    error: str


@dataclass(frozen=True)
class ArrayEnded:
    array: int
    mean_occupancy: float


Event = Any  # one of the dataclasses above


@dataclass(frozen=True)
class PBTStarted:
    """A population-based training run began (or continued from its checkpoint after `resumed_from_epoch`)."""

    study: str
    storage: str
    dashboard: str
    trials: list[int]  # the members, in slot order
    epochs: int
    interval: int
    metric: str
    direction: str  # maximize or minimize
    resumed_from_epoch: int | None = None


@dataclass(frozen=True)
class PBTExploited:
    """After `epoch` epochs member `target` copied member `source` and explored to new values."""

    epoch: int
    target: int
    source: int
    changes: dict[str, tuple[float, float]]  # hyper-parameter -> (copied value, explored value)
