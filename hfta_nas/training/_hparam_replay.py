"""Replaying per-epoch hyper-parameter schedules (`hfta_nas.train(hparam_schedule=...)`).

Before a slot's epoch e (1-based) each of its scheduled values is set to schedule[name][e - 1]
(`_slot_values.write`: an optimizer hyper-parameter, the dropout rate or an augmentation
strength); under an LR schedule "lr" sets the base lr it scales, as population-based
training records it. The values are a function of the
slot's epoch only, so a trainer restored from a checkpoint is given the values it already
holds and continues bit-identically.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hfta_nas.errors import HftaNasError
from hfta_nas.optim import ArrayOptimizer, hparam_schedule_problems
from hfta_nas.training._slot_values import write
from hfta_nas.training._trainer import ArrayTrainer

Schedule = Mapping[str, Sequence[float]]


class HparamReplay:
    """Each slot id's schedule; `apply(trainer)` sets the values of every running slot's coming epoch
    (`prepare(trainer, replay.names)` first, when the trainer is built: per-slot dropout rates)."""

    def __init__(self, schedules: Mapping[Any, Schedule]) -> None:
        self.schedules = {sid: {name: list(values) for name, values in s.items()} for sid, s in schedules.items()}

    def apply(self, trainer: ArrayTrainer) -> None:
        for sid, schedule in self.schedules.items():
            result = trainer.results.get(sid)
            if result is None or result.status != "running":  # ended, failed (frozen) or not in this array
                continue
            coming = result.epochs  # 0-based index of the slot's next epoch
            values = {name: v[coming] for name, v in schedule.items() if coming < len(v)}
            if values:
                write(trainer, trainer.position_of(sid), values)

    @property
    def names(self) -> set[str]:
        """Everything any slot's schedule sets."""
        return {name for schedule in self.schedules.values() for name in schedule}


def checked_replay(
    hparam_schedule: Schedule | Sequence[Schedule | None] | None,
    slots: int,
    optimizer: type[ArrayOptimizer],
    epochs: int,
) -> HparamReplay | None:
    """`train`'s `hparam_schedule` (one schedule for every slot, or one or None per slot) as a replay
    of slot ids 0..slots-1; None when nothing is scheduled. HftaNasError naming the first bad value."""
    if hparam_schedule is None:
        return None
    if isinstance(hparam_schedule, Mapping):
        _check(hparam_schedule, "hparam_schedule", optimizer, epochs)
        return HparamReplay({slot: hparam_schedule for slot in range(slots)})
    if not isinstance(hparam_schedule, Sequence) or isinstance(hparam_schedule, (str, bytes)):
        raise HftaNasError(
            f"hparam_schedule must be a mapping (name -> one value per epoch) or one per slot, got {hparam_schedule!r}."
        )
    if len(hparam_schedule) != slots:
        raise HftaNasError(f"hparam_schedule has {len(hparam_schedule)} entries for {slots} slots; give one per slot.")
    for slot, schedule in enumerate(hparam_schedule):
        if schedule is not None:
            _check(schedule, f"hparam_schedule[{slot}]", optimizer, epochs)
    return HparamReplay({slot: s for slot, s in enumerate(hparam_schedule) if s})


def _check(schedule: Any, name: str, optimizer: type[ArrayOptimizer], epochs: int) -> None:
    problems = hparam_schedule_problems(optimizer, schedule, epochs)
    if problems:
        loc, message = problems[0]
        raise HftaNasError(f"{name}{''.join(f'[{part!r}]' for part in loc)}: {message}.")
