"""Datasets as tensors resident on the device, split into train / val / test.

An array trains B models on the same data, so the whole dataset is loaded once,
moved to the device once, and every step gathers the B batches from it with a
single index op (see `_batches.py`) instead of running B data loaders.

Sources: the built-in names in `DATASETS`, a `.npz` or `.csv` file, or a
`module:function` factory. Every source ends up as numpy arrays that go through
the same validation, so a bad label reads the same whatever it came from.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import importlib.metadata
import io
import os
import random
import re
import sys
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hfta_nas._files import atomic_write_bytes, cache_dir
from hfta_nas.data._streamed import StreamedSource, npy_folder, streamed_parts
from hfta_nas.data._streams import is_map_dataset
from hfta_nas.errors import HftaNasError

DATASETS: tuple[str, ...] = ("mnist1d", "digits", "diabetes")
MAX_CLASSES = 100_000  # an output layer of more classes is a labelling mistake here (a label of 10**12 asked 512 TB)
REGRESSION_DATASETS: tuple[str, ...] = ("diabetes",)
"""Names of the built-in datasets; both are made offline, without the network."""

_SPLIT_KEYS = ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")
_LABEL_COLUMNS = ("label", "y", "target")
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_MNIST1D_SAMPLES = 5000
_ACCEPTED_FORMS = (
    f"one of the built-in datasets {DATASETS}, a path to a '.npz' or '.csv' file, a folder of .npy files "
    "(x.npy and y.npy, memory-mapped), or 'module:function' naming a function that returns (x, y), a dict of "
    "arrays, or a map-style torch Dataset of (x, y) items (streamed)"
)


@dataclass(frozen=True, eq=False, repr=False)
class Dataset:
    """Train / val / test tensors on one device: x floating point, y int64 class indices.

    Every x tensor is shaped `[num_samples, *input_shape]`, every y tensor
    `[num_samples]` with values in `[0, num_classes)`. A regression dataset
    (`task="regression"`) has floating targets `[num_samples]` or
    `[num_samples, num_targets]` (NaN: missing, for masked losses), and
    `num_classes` is the number of outputs a model needs.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    task: str = "classification"

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample, e.g. `(1, 40)` for mnist1d or `(1, 8, 8)` for digits."""
        return tuple(self.x_train.shape[1:])

    def to(self, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> Dataset:
        """A copy on `device` with x cast to the floating `dtype`; y stays int64 (regression targets: `dtype`)."""
        device = self.x_train.device if device is None else _resolve_device(device)
        dtype = self.x_train.dtype if dtype is None else _check_dtype(dtype)

        def move_x(x: torch.Tensor) -> torch.Tensor:
            return x.to(device=device, dtype=dtype).contiguous()

        def move_y(y: torch.Tensor) -> torch.Tensor:
            return y.to(device=device, dtype=torch.int64 if self.task == "classification" else dtype).contiguous()

        return replace(
            self,
            x_train=move_x(self.x_train),
            y_train=move_y(self.y_train),
            x_val=move_x(self.x_val),
            y_val=move_y(self.y_val),
            x_test=move_x(self.x_test),
            y_test=move_y(self.y_test),
        )

    def __repr__(self) -> str:
        # The generated repr would print every tensor; a summary is what one wants to see.
        return (
            f"Dataset(name={self.name!r}, train={len(self.y_train)}, val={len(self.y_val)}, "
            f"test={len(self.y_test)}, input_shape={self.input_shape}, "
            f"num_classes={self.num_classes}, dtype={self.x_train.dtype}, "
            f"device={self.x_train.device})"
        )


def load_dataset(
    source: str | os.PathLike[str],
    *,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    split_seed: int = 0,
    num_samples: int | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    task: str = "classification",
) -> Dataset:
    """Load a dataset, split it and put it on `device`.

    Args:
        source: `"mnist1d"` (generated offline, samples `(1, 40)`), `"diabetes"` (sklearn's
            regression data, 10 features, standardised target; task="regression"), `"digits"`
            (sklearn's 8x8 digits scaled to [0, 1], samples `(1, 8, 8)`), a `.npz`
            file with arrays `x` and `y` (or `X`) or with the six predefined splits
            `x_train, y_train, x_val, y_val, x_test, y_test`, a `.csv` file with a
            label column `label`, `y` or `target` and numeric feature columns, or
            `"module:function"`: a function (importable from `sys.path` or the current
            directory) called without arguments that returns `(x, y)` or a dict like
            the `.npz` case, with numpy arrays or torch tensors.
        val_fraction: share of the samples held out for validation. For mnist1d it
            is a share of the package's training part (its test part is the test set).
        test_fraction: share of the samples held out for testing; unused by mnist1d,
            which has its own test set.
        split_seed: seed of the permutation that makes the splits, so that a split
            can be reproduced. Sources with predefined splits are not re-split and
            ignore both fractions and this seed.
        num_samples: size of the generated mnist1d dataset (default 5000, rounded
            down to a multiple of its 10 classes); only valid for mnist1d.
        device: where the tensors live for the whole run.
        dtype: floating dtype of x; y is int64 (regression targets: this dtype).
        task: "classification" (integer labels) or "regression" (numeric targets, one
            or several per sample; NaN marks a missing target for masked losses).

    Raises:
        HftaNasError: the source, a file's content, the labels or an argument is bad.
    """
    _check_fractions(val_fraction, test_fraction)
    if _check_int(split_seed, "split_seed") < 0:
        raise HftaNasError(f"split_seed must be a non-negative integer, got {split_seed!r}")
    resolved_device = _resolve_device(device)
    dtype = _check_dtype(dtype)
    if task not in ("classification", "regression"):
        raise HftaNasError(f"task must be 'classification' or 'regression', got {task!r}")
    name, splits = _read_source(source, val_fraction, test_fraction, split_seed, num_samples, task)
    if isinstance(splits, StreamedSource):  # read batch by batch (hfta_nas.data._streamed)
        parts, num_classes = streamed_parts(
            splits,
            val_fraction=val_fraction,
            test_fraction=test_fraction,
            split_seed=split_seed,
            device=resolved_device,
            dtype=dtype,
            task=task,
            check_labels=_labels if task == "classification" else _targets,
            permuted_parts=_permuted_parts,
        )
        return Dataset(name=name, num_classes=num_classes, task=task, **parts)
    if task == "regression":
        num_classes = 1 if splits["y_train"].ndim == 1 else int(splits["y_train"].shape[1])
    else:
        num_classes = 1 + max(int(splits[key].max()) for key in _SPLIT_KEYS[1::2] if splits[key].size)
        _check_two_classes(name, splits)

    def tensor(key: str) -> torch.Tensor:
        # torch.tensor copies, so the dataset never aliases the caller's (or the cache's) arrays.
        key_dtype = dtype if key.startswith("x") or task == "regression" else torch.int64
        return torch.tensor(splits[key], dtype=key_dtype, device=resolved_device)

    return Dataset(name=name, num_classes=num_classes, task=task, **{key: tensor(key) for key in _SPLIT_KEYS})


def _check_two_classes(name: str, splits: dict[str, np.ndarray]) -> None:
    """HftaNasError for labels of one class: every model reaches accuracy 1 at once (a file cut wrongly)."""
    classes = np.unique(np.concatenate([splits[key].ravel() for key in _SPLIT_KEYS[1::2]]))
    if len(classes) < 2:
        raise HftaNasError(
            f"{name}: every label is {int(classes[0]) if len(classes) else 'absent'}, one class only; expected "
            "labels of at least two classes (for a numeric target, the regression task)"
        )


# -- sources ------------------------------------------------------------------


def _read_source(
    source: str | os.PathLike[str],
    val_fraction: float,
    test_fraction: float,
    split_seed: int,
    num_samples: int | None,
    task: str = "classification",
) -> tuple[str, dict[str, np.ndarray]]:
    """The dataset's name and its six validated, split numpy arrays."""
    if not isinstance(source, (str, os.PathLike)):
        raise HftaNasError(f"data source must be a string, got {type(source).__name__}; expected {_ACCEPTED_FORMS}")
    text = os.fspath(source)
    builtin = text.strip().lower()
    if num_samples is not None and builtin != "mnist1d":
        raise HftaNasError(
            f"num_samples={num_samples!r} only applies to the generated 'mnist1d' dataset, "
            f"not to data source {text!r}; leave num_samples unset"
        )

    if builtin in DATASETS and (builtin in REGRESSION_DATASETS) != (task == "regression"):
        kind = "regression" if builtin in REGRESSION_DATASETS else "classification"
        raise HftaNasError(
            f"the built-in dataset {builtin!r} is a {kind} dataset, not one for {task}: "
            + (
                "use a regression loss (mse, mae, huber)"
                if kind == "regression"
                else "a regression loss needs a .npz/.csv file or 'module:function' with numeric targets, "
                "or the built-in 'diabetes'"
            )
        )
    if builtin == "diabetes":
        x, y = _diabetes()
        arrays = _validated({"x": x, "y": y}, "the diabetes dataset", "regression")
        return "diabetes", _split(arrays, val_fraction, test_fraction, split_seed)
    if builtin == "mnist1d":
        return "mnist1d", _mnist1d_splits(num_samples, val_fraction, split_seed)
    if builtin == "digits":
        x, y = _digits()
        arrays = _validated({"x": x, "y": y}, "the digits dataset")
        return "digits", _split(arrays, val_fraction, test_fraction, split_seed)

    suffix = text.lower().rsplit(".", 1)[-1] if "." in text else ""
    if Path(text).expanduser().is_dir():
        return text, npy_folder(Path(text).expanduser(), f"data folder {text!r}")
    if suffix in ("npz", "csv"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise HftaNasError(
                f"data file {text!r} not found (looked for {path.resolve()}); "
                f"expected an existing .{suffix} file, relative paths are resolved from the current directory"
            )
        where = f"data file {text!r}"
        arrays = _read_npz(path, where) if suffix == "npz" else _read_csv(path, where, task)
    elif _FACTORY.match(text):
        arrays, where = _call_factory(text)
        if isinstance(arrays, StreamedSource):
            return text, arrays
    else:
        close = difflib.get_close_matches(builtin, DATASETS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise HftaNasError(f"unknown data source {text!r}; expected {_ACCEPTED_FORMS}.{hint}")

    arrays = _validated(arrays, where, task)
    if "x" in arrays:
        arrays = _split(arrays, val_fraction, test_fraction, split_seed)
    return text, arrays


@functools.lru_cache(maxsize=4)
def _generate_mnist1d(num_samples: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """mnist1d's train and test arrays, generated offline.

    Generating 5000 samples takes 2-4 s and importing the package 1.5 s, so
    the arrays are kept in this process (lru_cache) and in a file cache
    (`_mnist1d_cache_file`) for the next command. `mnist1d.data.get_dataset`
    is never used: it downloads from the network and writes a pickle into the
    current directory.
    """
    cache_file = _mnist1d_cache_file(num_samples)
    arrays = _read_mnist1d_cache(cache_file, num_samples) if cache_file is not None else None
    if arrays is None:
        arrays = _make_mnist1d(num_samples)
        if cache_file is not None:
            buffer = io.BytesIO()
            np.savez(buffer, x=arrays[0], y=arrays[1], x_test=arrays[2], y_test=arrays[3])
            with contextlib.suppress(OSError):  # a read-only home only costs the next run the generation
                atomic_write_bytes(cache_file, buffer.getvalue())
    for array in arrays:
        array.flags.writeable = False  # cached: nobody may change it for the next caller
    return arrays


def _make_mnist1d(num_samples: int) -> tuple[np.ndarray, ...]:
    import mnist1d.data  # lazy: only this source needs the package (and the requests it imports)

    args = mnist1d.data.get_dataset_args()
    args.num_samples = num_samples  # args.seed keeps the package default, so the data match canonical mnist1d
    # make_dataset reseeds the global `random` and `np.random` generators; restore them so
    # that loading data never changes the caller's random streams.
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        data = mnist1d.data.make_dataset(args)
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
    return data["x"][:, None, :], data["y"], data["x_test"][:, None, :], data["y_test"]


def _mnist1d_cache_file(num_samples: int) -> Path | None:
    """Where generated MNIST-1D arrays are kept between runs, or None when the cache is off.

    `HFTA_NAS_CACHE_DIR` (empty or "off": no file cache), else
    `$XDG_CACHE_HOME/hfta-nas`, else `~/.cache/hfta-nas`. The name carries the
    mnist1d version and the sample count: with the package's default seed
    they determine the data.
    """
    base = cache_dir()
    if base is None:
        return None
    try:
        version = importlib.metadata.version("mnist1d")
    except importlib.metadata.PackageNotFoundError:  # no package metadata
        return None
    return base / f"mnist1d-{version}-n{num_samples}.npz"


def _read_mnist1d_cache(path: Path, num_samples: int) -> tuple[np.ndarray, ...] | None:
    """The cached arrays, or None when the file is missing or not a whole, matching cache."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = tuple(archive[key] for key in ("x", "y", "x_test", "y_test"))
    except Exception:  # missing, truncated or foreign: generate again
        return None
    x, y, x_test, y_test = arrays
    whole = (
        len(x) == len(y)
        and len(x_test) == len(y_test)
        and len(y) + len(y_test) == num_samples
        and x.ndim == x_test.ndim == 3
    )
    return arrays if whole else None


def _mnist1d_splits(num_samples: int | None, val_fraction: float, split_seed: int) -> dict[str, np.ndarray]:
    if num_samples is None:
        num_samples = _MNIST1D_SAMPLES
    num_samples = _check_int(num_samples, "num_samples")
    if num_samples < 10:
        raise HftaNasError(f"num_samples must be at least 10 (one sample per mnist1d class), got {num_samples}")
    x, y, x_test, y_test = _generate_mnist1d(num_samples)
    train, val = _permuted_parts(len(y), {"val_fraction": val_fraction}, split_seed)
    return {
        "x_train": x[train], "y_train": y[train],
        "x_val": x[val], "y_val": y[val],
        "x_test": x_test, "y_test": y_test,
    }  # fmt: skip


def _diabetes() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_diabetes  # ships with sklearn: nothing is downloaded

    x, y = load_diabetes(return_X_y=True)
    # Features come mean-centred and scaled; the target (disease progression, 25..346) is
    # standardised too, so that losses and learning rates are on the usual scale.
    return x, (y - y.mean()) / y.std()


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits  # lazy: importing sklearn takes a while

    digits = load_digits()
    # Pixels are counts 0..16; one channel first, like an image batch [N, C, H, W].
    return digits.images[:, None, :, :] / 16.0, digits.target


def _read_npz(path: Path, where: str) -> dict[str, Any]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except Exception as exc:  # zip, pickle and format errors all mean "not a usable .npz"
        raise HftaNasError(
            f"{where} could not be read as a numpy .npz archive ({type(exc).__name__}: {exc}); "
            "expected a file written by numpy.savez with numeric arrays"
        ) from exc
    return _pick_arrays(arrays, where)


def _read_csv(path: Path, where: str, task: str = "classification") -> dict[str, Any]:
    import pandas as pd  # lazy: only this source needs pandas

    try:
        frame = pd.read_csv(path)
    except Exception as exc:  # empty file, bad quoting, encoding...
        raise HftaNasError(f"{where} could not be read as CSV ({type(exc).__name__}: {exc})") from exc
    columns = [str(column) for column in frame.columns]
    labels = [column for column in _LABEL_COLUMNS if column in frame.columns]
    if len(labels) != 1:
        problem = "has no label column" if not labels else f"has several label columns {labels}"
        raise HftaNasError(
            f"{where} {problem}; expected exactly one column named "
            f"{' or '.join(repr(c) for c in _LABEL_COLUMNS)}, found columns {columns}"
        )
    if frame.empty:
        raise HftaNasError(f"{where} has a header but no rows; expected one sample per row")
    features = frame.drop(columns=labels[0])
    if features.shape[1] == 0:
        raise HftaNasError(f"{where} has only the label column {labels[0]!r}; expected feature columns besides it")
    for column in features.columns:
        if not pd.api.types.is_numeric_dtype(features[column]):
            raise HftaNasError(
                f"{where}: feature column {column!r} is not numeric (dtype {features[column].dtype}, "
                f"e.g. {features[column].iloc[0]!r}); expected numbers in every column except {labels[0]!r}"
            )
    missing = [str(column) for column in features.columns if features[column].isna().any()]
    if missing:
        raise HftaNasError(f"{where}: feature columns {missing} have missing values; expected a number in every cell")
    # Checked here so that a bad label is reported under its column's name.
    y = frame[labels[0]].to_numpy()
    y = _labels(y, where, labels[0]) if task == "classification" else _targets(y, where, labels[0])
    return {"x": features.to_numpy(dtype=np.float64), "y": y}


@contextlib.contextmanager
def _current_directory_importable() -> Iterator[None]:
    """Let `import` find modules in the current directory, as `python -m` would, for this block only."""
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.append(cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _import_function(source: str) -> Any:
    """The function a 'module:function' data source names (imported, not called)."""
    module_name, function_name = source.split(":")
    where = f"data source {source!r}"
    importlib.invalidate_caches()  # a module written since the last import (e.g. in a notebook) is found
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise HftaNasError(
            f"{where}: could not import module {module_name!r} ({type(exc).__name__}: {exc}); "
            f"expected a module on sys.path or in the current directory {os.getcwd()} "
            f"that defines {function_name}()"
        ) from exc
    function = getattr(module, function_name, None)
    if not callable(function):
        found = "is not callable" if function is not None else "does not exist"
        raise HftaNasError(
            f"{where}: module {module_name!r} ({getattr(module, '__file__', '?')}) has no function "
            f"{function_name!r} (the attribute {found}); expected a function taking no arguments"
        )
    return function


def check_source(source: str | os.PathLike[str]) -> None:
    """Refuse, without reading any data, a source `load_dataset` would refuse by its name:
    an unknown name, a missing .npz/.csv file, a module or function that cannot be imported.

    For checks before work starts (a search checks its space's dataset before it asks any trial).
    """
    if not isinstance(source, (str, os.PathLike)):
        raise HftaNasError(f"data source must be a string, got {type(source).__name__}; expected {_ACCEPTED_FORMS}")
    text = os.fspath(source)
    if text.strip().lower() in DATASETS or Path(text).expanduser().is_dir():
        return
    suffix = text.lower().rsplit(".", 1)[-1] if "." in text else ""
    if suffix in ("npz", "csv"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise HftaNasError(
                f"data file {text!r} not found (looked for {path.resolve()}); "
                f"expected an existing .{suffix} file, relative paths are resolved from the current directory"
            )
        if suffix == "npz" and not zipfile.is_zipfile(path):  # its central directory only, no data read
            raise HftaNasError(
                f"data file {text!r} could not be read as a numpy .npz archive (it is not a zip archive); "
                "expected a file written by numpy.savez with numeric arrays"
            )
    elif _FACTORY.match(text):
        with _current_directory_importable():
            _import_function(text)
    else:
        close = difflib.get_close_matches(text.strip().lower(), DATASETS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise HftaNasError(f"unknown data source {text!r}; expected {_ACCEPTED_FORMS}.{hint}")


def _call_factory(source: str) -> tuple[dict[str, Any], str]:
    module_name, function_name = source.split(":")
    where = f"data source {source!r}"
    with _current_directory_importable():
        function = _import_function(source)
        try:
            result = function()
        except Exception as exc:
            raise HftaNasError(f"{where}: {module_name}.{function_name}() raised {type(exc).__name__}: {exc}") from exc
    where = f"{where} ({module_name}.{function_name}() result)"
    if is_map_dataset(result) or (
        isinstance(result, Mapping)
        and set(result) == {"train", "val", "test"}
        and all(is_map_dataset(v) for v in result.values())
    ):
        return StreamedSource(result, where), where  # type: ignore[return-value]
    if isinstance(result, (tuple, list)) and len(result) == 2:
        return {"x": result[0], "y": result[1]}, where
    if isinstance(result, Mapping):
        return _pick_arrays(result, where), where
    raise HftaNasError(
        f"{where} is a {type(result).__name__}; expected a tuple (x, y) or a dict with keys "
        f"'x' and 'y' or {', '.join(_SPLIT_KEYS)}"
    )


def _pick_arrays(arrays: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The six predefined splits, or else the single pair `x`, `y`, found in `arrays`."""
    keys = [str(key) for key in arrays]
    present = [key for key in _SPLIT_KEYS if key in arrays]
    if present:
        missing = [key for key in _SPLIT_KEYS if key not in arrays]
        if missing:
            raise HftaNasError(
                f"{where} has predefined splits {present} but lacks {missing}; "
                f"expected all of {list(_SPLIT_KEYS)} (or just 'x' and 'y' to split automatically)"
            )
        return {key: arrays[key] for key in _SPLIT_KEYS}
    x_key = next((key for key in ("x", "X") if key in arrays), None)
    y_key = next((key for key in ("y", "Y") if key in arrays), None)
    if x_key is None or y_key is None:
        raise HftaNasError(
            f"{where} has arrays {keys}; expected 'x' (or 'X') and 'y', or the predefined splits {list(_SPLIT_KEYS)}"
        )
    return {"x": arrays[x_key], "y": arrays[y_key]}


# -- validation and splitting --------------------------------------------------


def _validated(arrays: dict[str, Any], where: str, task: str = "classification") -> dict[str, np.ndarray]:
    """Check every (x, y) pair in `arrays`; return numpy features and int64 labels."""
    pairs = [("x", "y")] if "x" in arrays else list(zip(_SPLIT_KEYS[0::2], _SPLIT_KEYS[1::2]))
    out: dict[str, np.ndarray] = {}
    for x_key, y_key in pairs:
        x = _features(arrays[x_key], where, x_key)
        y = _labels(arrays[y_key], where, y_key) if task == "classification" else _targets(arrays[y_key], where, y_key)
        if len(x) != len(y):
            raise HftaNasError(
                f"{where}: {x_key!r} has {len(x)} samples but {y_key!r} has {len(y)} labels; "
                "expected one label per sample"
            )
        out[x_key], out[y_key] = x, y
    if len(out[pairs[0][1]]) == 0:
        raise HftaNasError(f"{where}: {pairs[0][0]!r} is empty; expected at least one training sample")
    shapes = {key: out[key].shape[1:] for key, _ in pairs}
    if len(set(shapes.values())) > 1:
        raise HftaNasError(f"{where}: the splits have different sample shapes {shapes}; expected the same shape in all")
    return out


def _as_numpy(value: Any, where: str, key: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except ValueError as exc:  # ragged nested lists
        raise HftaNasError(f"{where}: {key!r} is not a rectangular array ({exc})") from exc


def _features(value: Any, where: str, key: str) -> np.ndarray:
    x = _as_numpy(value, where, key)
    if x.dtype.kind not in "biuf":
        raise HftaNasError(f"{where}: {key!r} has dtype {x.dtype}; expected numbers (int or float)")
    if x.ndim < 2:
        raise HftaNasError(
            f"{where}: {key!r} has shape {x.shape}; expected [num_samples, *sample_shape] "
            "with at least one feature dimension (reshape a flat vector to [num_samples, 1])"
        )
    bad = ~np.isfinite(x).all(axis=tuple(range(1, x.ndim)))
    if bad.any():
        raise HftaNasError(
            f"{where}: {key!r} holds NaN or infinite values in {int(bad.sum())} samples "
            f"(first at index {int(np.argmax(bad))}); expected finite numbers"
        )
    return x


def _targets(value: Any, where: str, key: str) -> np.ndarray:
    """Regression targets: numbers, one or several per sample; NaN marks a missing target."""
    y = _as_numpy(value, where, key)
    if y.ndim not in (1, 2) or y.dtype.kind not in "biuf":
        raise HftaNasError(
            f"{where}: targets {key!r} have shape {y.shape} and dtype {y.dtype}; expected numbers, "
            "shape [num_samples] or [num_samples, num_targets] (NaN for a missing target)"
        )
    y = y.astype(np.float64)
    if np.isinf(y).any():
        raise HftaNasError(f"{where}: targets {key!r} hold infinite values; expected finite numbers or NaN (missing)")
    return y


def _labels(value: Any, where: str, key: str) -> np.ndarray:
    y = _as_numpy(value, where, key)
    expected = "expected integer class indices 0..num_classes-1"
    if y.ndim != 1:
        raise HftaNasError(
            f"{where}: labels {key!r} have shape {y.shape}; expected one label per sample, shape [num_samples]"
        )
    if y.dtype.kind not in "biuf":
        raise HftaNasError(
            f"{where}: labels {key!r} have dtype {y.dtype} (e.g. {y[:3].tolist()}); {expected} "
            "(map class names to indices first, e.g. with sklearn.preprocessing.LabelEncoder)"
        )
    if y.dtype.kind == "f":
        bad = ~np.isfinite(y) | (y != np.round(y))
        if bad.any():
            raise HftaNasError(
                f"{where}: labels {key!r} contain non-integer values such as {y[bad][:3].tolist()} "
                f"(first at index {int(np.argmax(bad))}); {expected}"
            )
    if y.size and y.min() < 0:
        raise HftaNasError(f"{where}: labels {key!r} contain the negative value {y.min()}; {expected}")
    if y.size and y.max() >= MAX_CLASSES:  # the classes are 0..max: a model would need max + 1 outputs
        raise HftaNasError(
            f"{where}: labels {key!r} contain the value {int(y.max())}, so a model would need {int(y.max()) + 1} "
            f"outputs; at most {MAX_CLASSES} classes are supported ({expected})"
        )
    return y.astype(np.int64)


def _permuted_parts(n: int, fractions: dict[str, float], split_seed: int) -> list[np.ndarray]:
    """Indices of the training part and of one held-out part per fraction, cut off a permutation."""
    if sum(fractions.values()) >= 1:
        raise HftaNasError(
            f"{' + '.join(fractions)} must be below 1 so that training samples remain, "
            f"got {' + '.join(str(f) for f in fractions.values())}"
        )
    # A positive fraction keeps at least one sample, so evaluation never averages over nothing.
    held_out = [max(1, round(f * n)) if f > 0 else 0 for f in fractions.values()]
    n_train = n - sum(held_out)
    if n_train < 1:
        given = ", ".join(f"{name}={value}" for name, value in fractions.items())
        raise HftaNasError(
            f"{n} samples are too few for {given}: no training sample would be left; "
            "expected more samples or smaller fractions"
        )
    order = np.random.default_rng(split_seed).permutation(n)
    return np.split(order, np.cumsum([n_train, *held_out])[:-1])


def _split(
    arrays: dict[str, np.ndarray], val_fraction: float, test_fraction: float, split_seed: int
) -> dict[str, np.ndarray]:
    """Cut val and test off a permutation of the samples drawn from `split_seed`."""
    x, y = arrays["x"], arrays["y"]
    fractions = {"val_fraction": val_fraction, "test_fraction": test_fraction}
    train, val, test = _permuted_parts(len(y), fractions, split_seed)
    return {
        "x_train": x[train], "y_train": y[train],
        "x_val": x[val], "y_val": y[val],
        "x_test": x[test], "y_test": y[test],
    }  # fmt: skip


# -- argument checks -----------------------------------------------------------


def _check_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise HftaNasError(f"{name} must be an integer, got {value!r}")
    return int(value)


def _check_fractions(val_fraction: Any, test_fraction: Any) -> None:
    for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not 0 <= value < 1:
            raise HftaNasError(f"{name} must be a number in [0, 1), got {value!r}")


def _check_dtype(dtype: Any) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise HftaNasError(
            f"dtype must be a floating torch dtype such as torch.float32 or torch.float64, got {dtype!r}"
        )
    return dtype


def _resolve_device(device: str | torch.device) -> torch.device:
    try:
        resolved = torch.device(device)
        torch.empty(0, device=resolved)  # fails early, and clearly, when the backend is absent
    except (RuntimeError, TypeError, AssertionError) as exc:
        raise HftaNasError(
            f"device {device!r} cannot be used ({exc}); expected 'cpu' or an available accelerator such as 'cuda:0'"
        ) from exc
    return resolved
