"""Per-epoch hyper-parameter schedules: what a slot keeps for itself, in each epoch.

A schedule maps what a slot keeps for itself to one value per epoch: its optimizer's
hyper-parameters (lr, weight_decay, momentum, beta1, ...), "dropout" (the rate of every
dropout layer) and "augment.noise" / "augment.mixup" / "augment.cutmix" (its noise std and
mixup / cutmix alpha; whether the model has dropout and the augmentation is on is checked
when training starts). Population-based training records one for each
member (the values its weights trained with, through every exploit), and
`hfta_nas.train` replays it: before epoch e the slot's hyper-parameter is set to
values[e - 1] (for lr under an LR schedule, the base lr the schedule scales, which is
what PBT records).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from hfta_nas.data._augment import STRENGTHS
from hfta_nas.optim._optimizer import ArrayOptimizer

Loc = tuple[str | int, ...]
DROPOUT, AUGMENT = "dropout", "augment."
BEYOND_THE_OPTIMIZER = (DROPOUT, *(AUGMENT + name for name in STRENGTHS))
ONLY_AT_START = ("initial_accumulator_value",)  # Adagrad's: it fills the state once; later values change nothing
_UNIT_INTERVAL = ("beta1", "beta2", DROPOUT)  # Adam's betas and dropout rates: in [0, 1)
POSITIVE = (AUGMENT + "mixup", AUGMENT + "cutmix")  # Beta(alpha, alpha) needs alpha > 0


def optimizer_values(optimizer: type[ArrayOptimizer]) -> list[str]:
    """The hyper-parameters of `optimizer` a slot keeps for itself and can change while it trains (the
    flags are shared by the array)."""
    return [name for name in optimizer.defaults if name not in optimizer.flags and name not in ONLY_AT_START]


def schedulable(optimizer: type[ArrayOptimizer]) -> list[str]:
    """What a slot of an array with `optimizer` keeps for itself and can change while it trains."""
    return [*optimizer_values(optimizer), *BEYOND_THE_OPTIMIZER]


def hparam_schedule_problems(optimizer: type[ArrayOptimizer], schedule: Any, epochs: int) -> list[tuple[Loc, str]]:
    """What is wrong with `schedule` for `optimizer` over `epochs` epochs: (where in the schedule,
    what was expected) pairs, at most one per hyper-parameter; [] when it can be replayed."""
    if not isinstance(schedule, Mapping):
        return [((), f"expected a mapping of hyper-parameter -> one value per epoch, got {type(schedule).__name__}")]
    names = schedulable(optimizer)
    problems: list[tuple[Loc, str]] = []
    for name, values in schedule.items():
        if name not in names:
            problems.append(
                (
                    (str(name),),
                    f"{optimizer.__name__} has no per-slot hyper-parameter '{name}'; expected one of "
                    f"{', '.join(names)}",
                )
            )
            continue
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            problems.append(((name,), f"expected a list of {epochs} values (one per epoch), got {values!r}"))
            continue
        if len(values) != epochs:
            problems.append(((name,), f"has {len(values)} values for {epochs} epochs; expected one per epoch"))
            continue
        bad = next(((i, v, why) for i, v in enumerate(values) if (why := _value_problem(name, v))), None)
        if bad is not None:
            index, value, why = bad
            problems.append(((name, index), f"epoch {index + 1}: {why}, got {value!r}"))
    return problems


def _value_problem(name: str, value: Any) -> str | None:
    """Why one value cannot be set (None when it can): the optimizer's own rules, said before training."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "expected a number"
    if name in ArrayOptimizer.clipping:  # inf: no clipping, as in the optimizer's hparams
        return None if value > 0 else "expected a number > 0 (inf: no clipping)"
    if not math.isfinite(value) or value < 0:
        return "expected a finite number >= 0"
    if name in _UNIT_INTERVAL and value >= 1:
        return "expected a number in [0, 1)"
    if name in POSITIVE and value == 0:
        return "expected a number > 0"
    return None
