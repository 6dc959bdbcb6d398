"""Per-slot train / validation splits: each slot of an array draws its own partition.

The data-split source of randomness (Bouthillier et al. 2021 found the choice
of training data among the largest sources of variance) needs every slot to
train on its own subset and validate on the rest. The array keeps one pool of
samples on the device (the data's train and validation rows, in that order);
slot b's split is two index tensors into it, of the same sizes for every slot,
so batches stay `[B, N, ...]` and one gather picks them. The test set is not
re-split: every slot is measured on the same test samples.

A slot without a split seed keeps the data's own split (train rows first, then
validation rows), so an array can mix slots that vary the split and slots that
do not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from hfta_nas.data._datasets import Dataset
from hfta_nas.errors import HftaNasError


@dataclass(frozen=True)
class SlotSplits:
    """`train[b]` and `val[b]`: slot b's rows of the pool (`pooled(data)`), int64 on the data's device."""

    train: torch.Tensor  # [B, n_train]
    val: torch.Tensor  # [B, n_val]

    def keep(self, slots: Sequence[int]) -> SlotSplits:
        index = torch.tensor(list(slots), device=self.train.device)
        return SlotSplits(self.train.index_select(0, index), self.val.index_select(0, index))


def pooled(data: Dataset) -> Dataset:
    """The data with its train and validation rows as one pool (`x_train`), `x_val` empty: slots
    index their own rows of the pool with `SlotSplits`."""
    if not all(isinstance(t, torch.Tensor) for t in (data.x_train, data.y_train, data.x_val, data.y_val)):
        raise HftaNasError(
            "per-slot train/validation splits (--vary split) need the data held in memory; a "
            "streamed source (a .npy folder, a map-style dataset) keeps its one split"
        )
    return replace(
        data,
        x_train=torch.cat([data.x_train, data.x_val]),
        y_train=torch.cat([data.y_train, data.y_val]),
        x_val=data.x_val[:0],
        y_val=data.y_val[:0],
    )


def slot_splits(data: Dataset, split_seeds: Sequence[int | None]) -> SlotSplits:
    """Each slot's partition of `pooled(data)` into as many train and validation rows as `data` has:
    a seed draws a random partition (`torch.randperm` of the pool from a generator seeded with it:
    the validation rows first, then the train rows), None keeps the data's own split."""
    n_train, n_val = len(data.y_train), len(data.y_val)
    if n_val == 0:
        raise HftaNasError(
            "re-drawing the train/validation split per slot needs validation data; "
            "the data has none (val_fraction: 0?)."
        )
    trains, vals = [], []
    for seed in split_seeds:
        if seed is None:
            order = torch.cat([torch.arange(n_train, n_train + n_val), torch.arange(n_train)])
        else:
            if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
                raise HftaNasError(f"split seeds must be non-negative integers, got {seed!r}.")
            order = torch.randperm(n_train + n_val, generator=torch.Generator().manual_seed(seed))
        vals.append(order[:n_val])
        trains.append(order[n_val:])
    device = data.x_train.device
    return SlotSplits(torch.stack(trains).to(device), torch.stack(vals).to(device))
