"""Data that is not held whole on the device: memory-mapped `.npy` arrays and map-style datasets.

A `Rows` object stands where a Dataset holds a tensor: `rows[index]` with an
index tensor ([B, N] per-slot orders, [N] a shared one) or a slice returns the
samples as a tensor on the device, read from disk (`ArrayRows` over a
memory-mapped array) or from a `torch.utils.data.Dataset` (`MapRows`: each
sample read once per batch, as a DataLoader reads it, and collated by stacking).
Only the batches of a step are on the device at a time, so the data can be
larger than device memory. With one order shared by all slots a batch is read
once for all; with per-slot orders each slot's samples are read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from hfta_nas.errors import HftaNasError


class Rows:
    """The samples of one split, read on demand (see the module docstring)."""

    def __init__(self, count: int, sample_shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> None:
        self.count, self.sample_shape, self.device, self.dtype = count, tuple(sample_shape), torch.device(device), dtype

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.count, *self.sample_shape))

    def __len__(self) -> int:
        return self.count

    def dim(self) -> int:
        return 1 + len(self.sample_shape)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            key = torch.arange(self.count)[key]
        if not isinstance(key, torch.Tensor):
            raise HftaNasError(f"streamed rows are read by an index tensor or a slice, got {type(key).__name__}.")
        flat = key.reshape(-1).cpu()
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.count):
            raise IndexError(f"row index out of range 0..{self.count - 1}")
        samples = self.read(flat.numpy())
        return pytree.tree_map(lambda t: t.reshape(*key.shape, *t.shape[1:]), samples)

    def read(self, positions: np.ndarray) -> Any:
        raise NotImplementedError

    def to(self, device: Any = None, dtype: torch.dtype | None = None, **_: Any) -> Rows:
        raise NotImplementedError

    def contiguous(self) -> Rows:
        return self

    def _move(self, values: np.ndarray | torch.Tensor) -> torch.Tensor:
        tensor = torch.as_tensor(np.ascontiguousarray(values)) if isinstance(values, np.ndarray) else values
        floating = tensor.is_floating_point() or self.dtype.is_floating_point
        return tensor.to(device=self.device, dtype=self.dtype if floating else tensor.dtype)


class ArrayRows(Rows):
    """Rows of a numpy array (a memory map reads only the rows asked for) at `positions` of it."""

    def __init__(
        self, array: np.ndarray, positions: np.ndarray | None, device: torch.device, dtype: torch.dtype
    ) -> None:
        self.array = array
        self.positions = np.arange(len(array)) if positions is None else np.asarray(positions)
        super().__init__(len(self.positions), array.shape[1:], device, dtype)

    def read(self, positions: np.ndarray) -> torch.Tensor:
        wanted = self.positions[positions]
        order = np.argsort(wanted, kind="stable")  # a memory map reads sorted rows in one sweep
        values = np.empty((len(wanted), *self.array.shape[1:]), dtype=self.array.dtype)
        values[order] = self.array[wanted[order]]
        return self._move(values)

    def to(self, device: Any = None, dtype: torch.dtype | None = None, **_: Any) -> ArrayRows:
        return ArrayRows(
            self.array, self.positions, torch.device(device) if device is not None else self.device, dtype or self.dtype
        )


class _Reader:
    """Reads samples of a map-style dataset; x and y of one index tensor are read once (the
    trainer asks for x, then y, of the same batch)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self._last: tuple[bytes, Any, Any] | None = None

    def read(self, positions: np.ndarray) -> tuple[Any, Any]:
        key = positions.tobytes()
        if self._last is None or self._last[0] != key:
            samples = [self.dataset[int(i)] for i in positions]
            if not samples:
                raise HftaNasError("an empty batch was asked of a streamed dataset.")
            if not all(isinstance(s, (tuple, list)) and len(s) == 2 for s in samples[:1]):
                raise HftaNasError(f"a streamed dataset's items must be (x, y) pairs, got {type(samples[0]).__name__}.")
            xs = _stack([s[0] for s in samples])
            ys = _stack([s[1] for s in samples])
            self._last = (key, xs, ys)
        return self._last[1], self._last[2]


def _stack(items: Sequence[Any]) -> Any:
    """torch's default collation, for tensors, numbers, numpy arrays, and tuples / dicts of them."""
    first = items[0]
    if isinstance(first, dict):
        return {k: _stack([item[k] for item in items]) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(_stack([item[i] for item in items]) for i in range(len(first)))
    return torch.stack(
        [torch.as_tensor(np.asarray(item) if not isinstance(item, torch.Tensor) else item) for item in items]
    )


class MapRows(Rows):
    """x (`part` 0) or y (`part` 1) of a map-style dataset's samples at `positions` of it."""

    def __init__(
        self,
        reader: _Reader,
        part: int,
        positions: np.ndarray,
        sample_shape: tuple[int, ...],
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.reader, self.part, self.positions = reader, part, np.asarray(positions)
        super().__init__(len(self.positions), sample_shape, device, dtype)

    def read(self, positions: np.ndarray) -> Any:
        values = self.reader.read(self.positions[positions])[self.part]
        return pytree.tree_map(self._move, values)

    def to(self, device: Any = None, dtype: torch.dtype | None = None, **_: Any) -> MapRows:
        return MapRows(
            self.reader,
            self.part,
            self.positions,
            self.sample_shape,
            torch.device(device) if device is not None else self.device,
            dtype or self.dtype,
        )


def is_map_dataset(value: Any) -> bool:
    """A torch-style map dataset (indexable, sized), not arrays or tensors."""
    return (
        hasattr(value, "__getitem__")
        and hasattr(value, "__len__")
        and not isinstance(value, (np.ndarray, torch.Tensor, dict, tuple, list, str))
    )


def map_rows(
    dataset: Any, positions: np.ndarray, device: torch.device, dtype: torch.dtype, label_dtype: torch.dtype, where: str
) -> tuple[MapRows, MapRows]:
    """(x rows, y rows) of `dataset` at `positions`; its first item fixes the sample shape."""
    reader = _Reader(dataset)
    try:
        x0, y0 = reader.read(np.asarray(positions[:1]))
    except HftaNasError:
        raise
    except Exception as error:  # noqa: BLE001 - the user's dataset
        raise HftaNasError(
            f"{where}: reading item {int(positions[0])} raised {type(error).__name__}: {error}"
        ) from error
    first_leaf = pytree.tree_leaves(x0)[0]
    shape = tuple(first_leaf.shape[1:])
    return (
        MapRows(reader, 0, positions, shape, device, dtype),
        MapRows(reader, 1, positions, tuple(y0.shape[1:]), device, label_dtype),
    )
