"""Per-slot data order: which training samples each slot of an array sees, step by step.

Contract (tested against plain PyTorch): slot b's batches, epoch after epoch, are
exactly those of

    DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=drop_last,
               generator=torch.Generator().manual_seed(data_seeds[b]))

so a slot trained inside an array sees the data a model trained alone would see.
Each slot owns a CPU generator and nothing else, so its order depends on its own
data seed only: not on B, not on its neighbours, not on slots dropped or replaced.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import torch

from hfta_nas.errors import HftaNasError


class EpochOrder:
    """Per-slot shuffling of `n` training samples; one index tensor per step for the whole array.

    Give exactly one of `data_seeds` (slot b shuffles with `data_seeds[b]`, B =
    `len(data_seeds)`) or `shared_seed` (one order that every slot follows).

    `next_epoch()` returns a list with one int64 index tensor per step, on
    `device`: `[B, N_step]` for per-slot orders, `[N_step]` for a shared one.
    `N_step` is `batch_size`, except for a smaller last step when `n % batch_size`
    is not 0 and `drop_last` is False; a list handles that ragged step without
    padding or masks. Feed the indices to `gather` to get `[B, N_step, ...]` batches.
    """

    def __init__(
        self,
        n: int,
        batch_size: int,
        data_seeds: Sequence[int] | None,
        *,
        shared_seed: int | None = None,
        drop_last: bool = False,
        device: str | torch.device = "cpu",
    ) -> None:
        self._n = _positive(n, "n (the number of training samples)")
        self._batch_size = _positive(batch_size, "batch_size")
        if (data_seeds is None) == (shared_seed is None):
            raise HftaNasError(
                "give exactly one of data_seeds (one data-order seed per slot) or shared_seed "
                f"(one order for all slots); got data_seeds={data_seeds!r}, shared_seed={shared_seed!r}"
            )
        if drop_last and self._n < self._batch_size:
            raise HftaNasError(
                f"batch_size {self._batch_size} exceeds the {self._n} training samples, so drop_last=True "
                "leaves no batch in an epoch; expected a smaller batch_size or drop_last=False"
            )
        self._drop_last = bool(drop_last)
        self._device = torch.device(device)
        self._shared = shared_seed is not None
        seeds = [shared_seed] if self._shared else list(data_seeds)  # type: ignore[arg-type]
        if not seeds:
            raise HftaNasError("data_seeds is empty; expected one data-order seed per slot")
        self._seeds = [_seed(seed) for seed in seeds]
        self._generators = [torch.Generator().manual_seed(seed) for seed in self._seeds]
        self._epochs = [0] * len(seeds)

    @property
    def num_slots(self) -> int | None:
        """B, the number of per-slot orders; None for a shared order, which has no slot dimension."""
        return None if self._shared else len(self._generators)

    @property
    def shared(self) -> bool:
        """Whether all slots follow one order (index tensors then have no slot dimension)."""
        return self._shared

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def steps_per_epoch(self) -> int:
        """Number of index tensors `next_epoch` returns."""
        return self._n // self._batch_size if self._drop_last else math.ceil(self._n / self._batch_size)

    @property
    def data_seeds(self) -> tuple[int, ...]:
        """The seed of each order: one per slot, or just the shared seed."""
        return tuple(self._seeds)

    @property
    def epochs(self) -> tuple[int, ...]:
        """Epochs drawn so far by each order; a replaced slot starts again at 0."""
        return tuple(self._epochs)

    def next_epoch(self) -> list[torch.Tensor]:
        """The next epoch's indices: one int64 tensor per step, `[B, N_step]` or `[N_step]` when shared."""
        used = self.steps_per_epoch * self._batch_size if self._drop_last else self._n
        orders = torch.stack([self._draw(generator) for generator in self._generators])
        # One host-to-device copy per epoch; the steps are views into it.
        orders = orders[:, :used].to(self._device)
        self._epochs = [epoch + 1 for epoch in self._epochs]
        if self._shared:
            orders = orders[0]
        return list(torch.split(orders, self._batch_size, dim=-1))

    def drop_slots(self, keep: Sequence[int]) -> None:
        """Keep only the slots `keep`, in that order (slot keep[i] becomes slot i).

        Kept slots go on with their own generators, so their orders are unchanged.
        A shared order has no slots to drop and is left as it is.
        """
        if self._shared:
            return
        keep = [self._slot_index(b) for b in keep]
        if not keep:
            raise ValueError("drop_slots needs at least one slot to keep")
        if len(set(keep)) != len(keep):
            # Two slots sharing one generator would each skip the other's draws.
            raise ValueError(f"drop_slots got repeated slots {list(keep)}; each slot can be kept once")
        self._seeds = [self._seeds[b] for b in keep]
        self._generators = [self._generators[b] for b in keep]
        self._epochs = [self._epochs[b] for b in keep]

    def replace_slot(self, b: int, data_seed: int) -> None:
        """Slot b starts a new order from `data_seed`, as a fresh DataLoader would, at epoch 0."""
        if self._shared:
            raise HftaNasError(
                "a shared data order cannot restart for one slot: a refilled slot would join the other "
                "slots mid-stream; use per-slot data_seeds to replace slots"
            )
        b = self._slot_index(b)
        self._seeds[b] = _seed(data_seed)
        self._generators[b] = torch.Generator().manual_seed(self._seeds[b])
        self._epochs[b] = 0

    def copy_slot(self, source: int, target: int) -> None:
        """Slot `target` continues slot `source`'s order: its seed, epochs drawn and generator state,
        so both draw the same batches from now on. A shared order has no slots and is left as it is."""
        if self._shared:
            return
        source, target = self._slot_index(source), self._slot_index(target)
        self._seeds[target], self._epochs[target] = self._seeds[source], self._epochs[source]
        self._generators[target] = torch.Generator().set_state(self._generators[source].get_state())

    def state_dict(self) -> dict[str, Any]:
        """Where every order stands (seeds, generator states, epochs drawn), for a checkpoint."""
        return {
            "seeds": list(self._seeds),
            "generators": [g.get_state() for g in self._generators],
            "epochs": list(self._epochs),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where `state_dict()` of an order with as many slots stood."""
        if len(state["seeds"]) != len(self._generators):
            raise HftaNasError(
                f"the saved data order has {len(state['seeds'])} slots, this one {len(self._generators)}."
            )
        self._seeds = [_seed(seed) for seed in state["seeds"]]
        self._generators = [torch.Generator().set_state(g) for g in state["generators"]]
        self._epochs = list(state["epochs"])

    def __repr__(self) -> str:
        seeds = f"shared_seed={self._seeds[0]}" if self._shared else f"data_seeds={self._seeds}"
        return (
            f"EpochOrder(n={self._n}, batch_size={self._batch_size}, {seeds}, "
            f"drop_last={self._drop_last}, device={self._device})"
        )

    def _draw(self, generator: torch.Generator) -> torch.Tensor:
        # One epoch of DataLoader(shuffle=True, generator=g) makes three draws from g
        # (torch 2.x, num_workers=0), and all three must be replayed to stay in step:
        # 1. the loader iterator draws an int64 `_base_seed` (for worker seeding) from g;
        # 2. RandomSampler draws the epoch's order, torch.randperm(n, generator=g);
        # 3. RandomSampler then yields `torch.randperm(n, generator=g)[: num_samples % n]`,
        #    an empty tail that still advances g, when the epoch is read to the end.
        # tests/test_data.py checks this against DataLoader, so a torch change shows up there.
        torch.empty((), dtype=torch.int64).random_(generator=generator)
        order = torch.randperm(self._n, generator=generator)
        torch.randperm(self._n, generator=generator)
        return order

    def _slot_index(self, b: Any) -> int:
        b = operator.index(b)
        if not 0 <= b < len(self._generators):
            raise IndexError(f"slot {b} out of range for an array of {len(self._generators)} slots")
        return b


def gather(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows of `x` picked by `index` in one index op: `[n, ...]` with `[B, N]` gives `[B, N, ...]`.

    Slot b's batch is `x[index[b]]`; gathering all slots at once costs one kernel
    instead of B, and the result already has the array dimension first. A shared
    `[N]` index gives `[N, ...]`.
    """
    return x[index]


def _as_int(value: Any) -> int | None:
    """`value` as an int if it is an integer (numpy ints included, bools and floats not)."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _positive(value: Any, name: str) -> int:
    number = _as_int(value)
    if number is None or number < 1:
        raise HftaNasError(f"{name} must be a positive integer, got {value!r}")
    return number


def _seed(value: Any) -> int:
    seed = _as_int(value)
    # torch.Generator.manual_seed accepts exactly this range.
    if seed is None or not -(2**63) <= seed < 2**64:
        raise HftaNasError(f"data seed {value!r} is not an integer in [-2**63, 2**64); expected an int seed per slot")
    return seed
