"""Sources read batch by batch: a folder of `.npy` files and a map-style dataset.

`load_dataset` gives a folder with `x.npy` and `y.npy` (or the six split files
`x_train.npy`, `y_train.npy`, ...) or a `module:function` that returns a
`torch.utils.data.Dataset` of `(x, y)` items (or a dict of `train`, `val`,
`test` datasets) to `streamed_parts`: the features become `Rows` read on demand
(`hfta_nas.data._streams`), so they need not fit in memory; labels of `.npy`
folders are loaded whole (they are small) and checked like any labels.
Splits are cut off a permutation drawn from `split_seed`, as for arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hfta_nas.data._streams import ArrayRows, Rows, is_map_dataset, map_rows
from hfta_nas.errors import HftaNasError

_PAIR = ("x", "y")
_SPLITS = ("train", "val", "test")


@dataclass
class StreamedSource:
    """A source read batch by batch: a map dataset (or a dict of three), or a folder's arrays."""

    payload: Any
    where: str


def npy_folder(folder: Path, where: str) -> StreamedSource:
    """The `.npy` arrays of `folder`, the features memory-mapped (nothing read yet)."""
    names = [f"{part}_{split}" for split in _SPLITS for part in _PAIR]
    if all((folder / f"{name}.npy").is_file() for name in names):
        keys = names
    elif all((folder / f"{name}.npy").is_file() for name in _PAIR):
        keys = list(_PAIR)
    else:
        found = sorted(p.name for p in folder.glob("*.npy")) or "no .npy files"
        raise HftaNasError(
            f"{where} has {found}; expected x.npy and y.npy, or the six files {', '.join(n + '.npy' for n in names)}"
        )
    arrays = {}
    for key in keys:
        try:  # the features stay on disk; labels are small and read whole
            arrays[key] = np.load(
                folder / f"{key}.npy", mmap_mode="r" if key.startswith("x") else None, allow_pickle=False
            )
        except Exception as error:  # noqa: BLE001 - a damaged or pickled file
            raise HftaNasError(f"{where}: {key}.npy could not be read ({type(error).__name__}: {error})") from error
    return StreamedSource(arrays, where)


def streamed_parts(
    source: StreamedSource,
    *,
    val_fraction: float,
    test_fraction: float,
    split_seed: int,
    device: torch.device,
    dtype: torch.dtype,
    task: str,
    check_labels: Callable[[Any, str, str], np.ndarray],
    permuted_parts: Callable[..., list[np.ndarray]],
) -> tuple[dict[str, Any], int]:
    """(the six x_* / y_* parts, Rows or label tensors, and num_classes) of `source`."""
    label_dtype = torch.int64 if task == "classification" else dtype
    fractions = {"val_fraction": val_fraction, "test_fraction": test_fraction}
    payload, where = source.payload, source.where
    parts: dict[str, Any] = {}
    if isinstance(payload, dict) and not any(is_map_dataset(v) for v in payload.values()):  # a .npy folder
        if "x" in payload:
            positions = dict(zip(_SPLITS, permuted_parts(len(payload["x"]), fractions, split_seed)))
            pairs = {split: (payload["x"], payload["y"], positions[split]) for split in _SPLITS}
        else:
            pairs = {split: (payload[f"x_{split}"], payload[f"y_{split}"], None) for split in _SPLITS}
        for split, (x, y, rows) in pairs.items():
            if x.ndim < 2 or x.dtype.kind not in "biuf":
                raise HftaNasError(
                    f"{where}: x_{split} has shape {x.shape} and dtype {x.dtype}; expected numbers, "
                    "[num_samples, *sample_shape]"
                )
            labels = check_labels(y if rows is None else y[rows], where, f"y_{split}")
            if len(labels) != (len(x) if rows is None else len(rows)):
                raise HftaNasError(f"{where}: x and y of {split} have different sample counts")
            parts[f"x_{split}"] = ArrayRows(x, rows, device, dtype)
            parts[f"y_{split}"] = torch.as_tensor(labels, dtype=label_dtype, device=device)
    else:  # map-style datasets
        datasets = payload if isinstance(payload, dict) else None
        for index, split in enumerate(_SPLITS):
            dataset = datasets[split] if datasets else payload
            rows = np.arange(len(dataset)) if datasets else permuted_parts(len(payload), fractions, split_seed)[index]
            if len(rows) == 0:
                parts[f"x_{split}"], parts[f"y_{split}"] = _empty(parts.get("x_train"), device, dtype, label_dtype)
                continue
            parts[f"x_{split}"], parts[f"y_{split}"] = map_rows(dataset, rows, device, dtype, label_dtype, where)
    return parts, _num_classes(parts, task, payload)


def _empty(like: Rows | None, device: torch.device, dtype: torch.dtype, label_dtype: torch.dtype) -> tuple[Any, Any]:
    shape = like.sample_shape if like is not None else ()
    return torch.zeros(0, *shape, device=device, dtype=dtype), torch.zeros(0, device=device, dtype=label_dtype)


def _num_classes(parts: dict[str, Any], task: str, payload: Any) -> int:
    """Outputs a model needs: targets per sample, or classes: a dataset's `num_classes` or `classes`
    when it has them, else the largest label + 1 (reading every label of a map dataset once)."""
    y_train = parts["y_train"]
    if task == "regression":
        shape = y_train.sample_shape if isinstance(y_train, Rows) else tuple(y_train.shape[1:])
        return int(np.prod(shape)) if shape else 1
    dataset = payload.get("train") if isinstance(payload, dict) else payload
    for attribute in ("num_classes", "classes"):
        value = getattr(dataset, attribute, None)
        if value is not None:
            return int(value) if attribute == "num_classes" else len(value)
    largest = 0
    for split in _SPLITS:
        y = parts[f"y_{split}"]
        if len(y):
            values = y if isinstance(y, torch.Tensor) else y[torch.arange(len(y))]
            largest = max(largest, int(values.max()))
    return largest + 1
