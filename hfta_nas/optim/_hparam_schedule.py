"""Per-epoch hyper-parameter schedules: a slot's optimizer hyper-parameters in each epoch.

A schedule maps hyper-parameters a slot keeps for itself (lr, weight_decay, momentum,
beta1, ...) to one value per epoch. Population-based training records one for each
member (the values its weights trained with, through every exploit), and
`hfta_nas.train` replays it: before epoch e the slot's hyper-parameter is set to
values[e - 1] (for lr under an LR schedule, the base lr the schedule scales, which is
what PBT records).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from hfta_nas.optim._optimizer import ArrayOptimizer

Loc = tuple[str | int, ...]
_UNIT_INTERVAL = ("beta1", "beta2")  # Adam's betas: in [0, 1), as the optimizer checks them


def schedulable(optimizer: type[ArrayOptimizer]) -> list[str]:
    """The hyper-parameters of `optimizer` a slot keeps for itself (its flags are shared by the array)."""
    return [name for name in optimizer.defaults if name not in optimizer.flags]


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
    return None
