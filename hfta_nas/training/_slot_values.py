"""The values a slot keeps for itself, by name, read and written in a trainer one slot at a time:
what population-based training explores and `hfta_nas.train(hparam_schedule=...)` replays.

- an optimizer hyper-parameter a slot keeps (lr, weight_decay, momentum, beta1, beta2, eps, clip_value,
  clip_norm, ...): `optimizer.hparams`; under an LR schedule "lr" is the base lr it scales;
- "dropout": the rate of every dropout layer of the slot (`ModelArray.set_dropout_rate`);
- "augment.noise", "augment.mixup", "augment.cutmix": the slot's noise std and mixup / cutmix alpha
  (`SlotAugmenter.set_strength`), for augmentations the candidate turns on.

Anything else (a width, a kernel, the batch size) changes shapes or what the array shares.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from hfta_nas.data._augment import STRENGTHS
from hfta_nas.errors import HftaNasError
from hfta_nas.optim import OPTIMIZERS
from hfta_nas.optim._hparam_schedule import AUGMENT, DROPOUT, optimizer_values
from hfta_nas.training._trainer import ArrayTrainer


def slot_value_names(optimizer: str, augmentation: Any = None) -> list[str]:
    """The names a slot of an array with this optimizer (and augmentation) keeps for itself and can
    change while it trains."""
    on = [f"{AUGMENT}{name}" for name in STRENGTHS if augmentation is not None and getattr(augmentation, name)]
    return [*optimizer_values(OPTIMIZERS[optimizer]), DROPOUT, *on]


def prepare(trainer: ArrayTrainer, names: Collection[str]) -> None:
    """Per-slot dropout rates in the array when `names` holds dropout (before a checkpoint is restored);
    HftaNasError when the model has no dropout layer or layers of different rates, or a named augmentation
    is off or shared by every slot (one data order for all)."""
    for name in (n for n in names if n.startswith(AUGMENT)):
        if trainer.augmenter is None or not getattr(trainer.augmenter.augmentation, name.removeprefix(AUGMENT)):
            raise HftaNasError(f"'{name}' cannot change per slot: that augmentation is off (turn it on first).")
        if trainer.shared_order:
            raise HftaNasError(f"'{name}' cannot change per slot: every slot shares one augmented batch.")
    if DROPOUT in names:
        trainer.array.use_slot_dropout_rates()
        if not trainer.array.has_slot_dropout_rates():
            raise HftaNasError("'dropout' cannot change per slot: the model has no dropout layer (nn.Dropout).")
        for slot in range(len(trainer.array)):
            trainer.array.dropout_rate(slot)  # one rate per slot, or the one line saying its layers differ


def read(trainer: ArrayTrainer, slot: int, name: str) -> float:
    """The slot's current value of one explored name."""
    if name == DROPOUT:
        return trainer.array.dropout_rate(slot)
    if name.startswith(AUGMENT):
        return trainer.augmenter.strength(slot, name.removeprefix(AUGMENT))
    if name == "lr" and trainer.schedule is not None:
        return float(trainer.schedule.base_lr[slot])
    return float(trainer.optimizer.hparams[name][slot])


def write(trainer: ArrayTrainer, slot: int, values: Mapping[str, float]) -> None:
    """Give the slot these values (no other slot changes)."""
    hparams = {}
    for name, value in values.items():
        if name == DROPOUT:
            trainer.array.set_dropout_rate(slot, value)
        elif name.startswith(AUGMENT):
            trainer.augmenter.set_strength(slot, name.removeprefix(AUGMENT), value)
        else:
            hparams[name] = value
    if hparams:
        trainer.optimizer.set_hparams(slot, **hparams)
