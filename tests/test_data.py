"""Datasets (all sources, splits, clear errors) and per-slot data order against DataLoader."""

from __future__ import annotations

import random
import sys
import textwrap
import urllib.request

import mnist1d.data
import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from hfta_nas.data import DATASETS, Dataset, EpochOrder, _datasets, gather, load_dataset
from hfta_nas.errors import HftaNasError


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """Fail on any download, and run in an empty directory to catch files written to cwd
    (the MNIST-1D file cache goes to a folder of its own)."""

    def refuse(*args, **kwargs):
        raise AssertionError("the network must not be used")

    monkeypatch.setattr(mnist1d.data, "get_dataset", refuse)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    requests = pytest.importorskip("requests")
    monkeypatch.setattr(requests, "get", refuse)
    monkeypatch.setenv("HFTA_NAS_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    return tmp_path / "work"


def split_sizes(data: Dataset) -> tuple[int, int, int]:
    return len(data.y_train), len(data.y_val), len(data.y_test)


def all_rows(data: Dataset) -> np.ndarray:
    """Every sample of every split, flattened and sorted, to compare partitions."""
    x = torch.cat([data.x_train, data.x_val, data.x_test]).flatten(1).numpy()
    return x[np.lexsort(x.T[::-1])]


# -- built-in datasets ----------------------------------------------------------


def test_builtin_names():
    assert DATASETS == ("mnist1d", "digits", "diabetes")


def test_mnist1d_is_generated_offline_and_deterministic(offline, monkeypatch):
    monkeypatch.setenv("HFTA_NAS_CACHE_DIR", "off")
    python_state, numpy_state = random.getstate(), np.random.get_state()
    loads = []
    for _ in range(2):
        _datasets._generate_mnist1d.cache_clear()  # really generate twice, not just hit the cache
        loads.append(load_dataset("mnist1d", num_samples=500))
    first, second = loads
    assert first.input_shape == (1, 40) and first.num_classes == 10 and first.name == "mnist1d"
    assert split_sizes(first) == (360, 40, 100)  # package test part is 20%, val is 10% of the rest
    for key in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test"):
        assert torch.equal(getattr(first, key), getattr(second, key))
    assert list(offline.iterdir()) == []  # no pickle dropped into cwd
    # make_dataset reseeds the global generators; the loader must put them back.
    assert random.getstate() == python_state
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), numpy_state))


def test_mnist1d_file_cache_gives_the_generated_arrays_without_generating(offline, monkeypatch):
    cache = offline.parent / "cache"
    _datasets._generate_mnist1d.cache_clear()
    generated = load_dataset("mnist1d", num_samples=300)
    (cache_file,) = cache.iterdir()
    assert cache_file.name.startswith("mnist1d-") and cache_file.name.endswith("-n300.npz")

    def refuse(num_samples):
        raise AssertionError("generated again despite the cache")

    monkeypatch.setattr(_datasets, "_make_mnist1d", refuse)
    _datasets._generate_mnist1d.cache_clear()
    cached = load_dataset("mnist1d", num_samples=300)
    for key in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test"):
        assert torch.equal(getattr(generated, key), getattr(cached, key))
    assert list(offline.iterdir()) == []


def test_mnist1d_cache_file_that_is_damaged_or_unwritable_is_generated_again(offline, monkeypatch):
    cache = offline.parent / "cache"
    _datasets._generate_mnist1d.cache_clear()
    expected = load_dataset("mnist1d", num_samples=200)
    (cache_file,) = cache.iterdir()
    cache_file.write_bytes(cache_file.read_bytes()[:1000])  # a truncated file, as after a full disk
    _datasets._generate_mnist1d.cache_clear()
    assert torch.equal(load_dataset("mnist1d", num_samples=200).x_train, expected.x_train)
    assert np.load(cache_file)["x"].shape[0] == 160  # rewritten whole
    blocked = offline.parent / "not-a-dir"
    blocked.write_text("")  # the cache folder cannot be made: loading still works
    monkeypatch.setenv("HFTA_NAS_CACHE_DIR", str(blocked))
    _datasets._generate_mnist1d.cache_clear()
    assert torch.equal(load_dataset("mnist1d", num_samples=200).x_train, expected.x_train)


def test_mnist1d_default_size_and_split_seed(offline):
    data = load_dataset("mnist1d")
    assert split_sizes(data) == (3600, 400, 1000)
    assert data.x_train.dtype == torch.float32 and data.y_train.dtype == torch.int64
    assert set(data.y_train.tolist()) == set(range(10))
    other = load_dataset("mnist1d", split_seed=1)
    assert not torch.equal(data.y_train, other.y_train)
    assert torch.equal(data.x_test, other.x_test)  # the package's test set does not depend on split_seed
    assert np.array_equal(
        np.sort(torch.cat([data.y_train, data.y_val]).numpy()), np.sort(torch.cat([other.y_train, other.y_val]).numpy())
    )


def test_digits():
    data = load_dataset("digits", val_fraction=0.2, test_fraction=0.1)
    assert data.input_shape == (1, 8, 8) and data.num_classes == 10
    assert sum(split_sizes(data)) == 1797
    assert split_sizes(data) == (1797 - 359 - 180, 359, 180)
    x = torch.cat([data.x_train, data.x_val, data.x_test])
    assert x.min() == 0 and x.max() == 1


def test_dtype_device_and_to():
    data = load_dataset("digits", dtype=torch.float64)
    for x, y in ((data.x_train, data.y_train), (data.x_val, data.y_val), (data.x_test, data.y_test)):
        assert x.dtype == torch.float64 and y.dtype == torch.int64
        assert x.is_contiguous() and x.device.type == "cpu"
    moved = data.to(dtype=torch.float32)
    assert moved.x_test.dtype == torch.float32 and moved.y_test.dtype == torch.int64
    assert torch.allclose(moved.x_train.double(), data.x_train)
    with pytest.raises(HftaNasError, match="floating torch dtype"):
        data.to(dtype=torch.int32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_device():
    data = load_dataset("digits", device="cuda")
    assert data.x_train.is_cuda and data.y_val.is_cuda
    order = EpochOrder(len(data.y_train), 64, [0, 1], device="cuda")
    index = order.next_epoch()[0]
    assert index.is_cuda and gather(data.x_train, index).shape == (2, 64, 1, 8, 8)


# -- files and factories ----------------------------------------------------------


def test_npz_single_arrays_are_split_into_a_partition(tmp_path):
    x = np.arange(150, dtype=np.float64).reshape(50, 3)
    y = np.arange(50) % 4
    np.savez(tmp_path / "data.npz", X=x, y=y)
    data = load_dataset(str(tmp_path / "data.npz"), split_seed=3)
    assert split_sizes(data) == (40, 5, 5) and data.input_shape == (3,) and data.num_classes == 4
    assert np.array_equal(all_rows(data), x)
    # labels travel with their samples
    assert torch.equal(data.y_val, (data.x_val[:, 0] / 3).long() % 4)
    assert torch.equal(load_dataset(tmp_path / "data.npz", split_seed=3).x_val, data.x_val)


def test_npz_predefined_splits_are_kept(tmp_path):
    rng = np.random.default_rng(0)
    splits = {
        "x_train": rng.normal(size=(12, 2, 5)), "y_train": rng.integers(0, 3, 12),
        "x_val": rng.normal(size=(4, 2, 5)), "y_val": np.array([0, 1, 2, 5]),
        "x_test": rng.normal(size=(3, 2, 5)), "y_test": rng.integers(0, 3, 3),
    }  # fmt: skip
    np.savez(tmp_path / "splits.npz", **splits)
    data = load_dataset(str(tmp_path / "splits.npz"), val_fraction=0.5)  # fractions ignored
    assert split_sizes(data) == (12, 4, 3) and data.input_shape == (2, 5)
    assert data.num_classes == 6  # max label of any split + 1
    for key, value in splits.items():
        assert np.allclose(getattr(data, key).numpy(), value)


def test_csv(tmp_path):
    frame = pd.DataFrame({"a": np.arange(20.0), "target": np.arange(20) % 3, "b": np.arange(20) * 2})
    frame.to_csv(tmp_path / "table.csv", index=False)
    data = load_dataset(str(tmp_path / "table.csv"), val_fraction=0.25, test_fraction=0.0)
    assert split_sizes(data) == (15, 5, 0) and data.input_shape == (2,) and data.num_classes == 3
    assert torch.equal(data.x_train[:, 1], 2 * data.x_train[:, 0])  # column order kept, label removed
    assert torch.equal(data.y_train, data.x_train[:, 0].long() % 3)


def write_module(directory, name: str, body: str) -> None:
    (directory / f"{name}.py").write_text(textwrap.dedent(body))


def test_factory_returning_tensors(tmp_path, monkeypatch):
    write_module(
        tmp_path,
        "tensor_factory_mod",
        """
        import torch
        def make():
            return torch.arange(60.0).reshape(30, 2), torch.arange(30) % 2
    """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tensor_factory_mod", raising=False)
    data = load_dataset("tensor_factory_mod:make")
    assert split_sizes(data) == (24, 3, 3) and data.input_shape == (2,) and data.num_classes == 2
    assert data.name == "tensor_factory_mod:make"


def test_factory_returning_splits_from_current_directory(tmp_path, monkeypatch):
    write_module(
        tmp_path,
        "cwd_splits_mod",
        """
        import numpy as np
        def splits():
            x = np.ones((4, 3))
            y = np.array([0, 1, 1, 0])
            return {"x_train": x, "y_train": y, "x_val": x, "y_val": y, "x_test": x, "y_test": y}
    """,
    )
    monkeypatch.chdir(tmp_path)  # not on sys.path: found because it is in the current directory
    monkeypatch.delitem(sys.modules, "cwd_splits_mod", raising=False)
    path_before = list(sys.path)
    data = load_dataset("cwd_splits_mod:splits")
    assert split_sizes(data) == (4, 4, 4) and data.num_classes == 2
    assert sys.path == path_before


# -- clear errors --------------------------------------------------------------------


def write_npz(tmp_path, **arrays) -> str:
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    return str(path)


def test_unknown_source_lists_accepted_forms():
    with pytest.raises(
        HftaNasError, match=r"unknown data source 'mnist2d'.*mnist1d.*digits.*npz.*csv.*module:function"
    ):
        load_dataset("mnist2d")
    with pytest.raises(HftaNasError, match="Did you mean 'digits'"):
        load_dataset("digit")


def test_missing_file_is_named(tmp_path):
    with pytest.raises(HftaNasError, match=r"data file '.*nope\.npz' not found"):
        load_dataset(str(tmp_path / "nope.npz"))
    with pytest.raises(HftaNasError, match=r"nope\.csv' not found"):
        load_dataset(str(tmp_path / "nope.csv"))


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (
            pd.DataFrame({"a": [1.0, 2.0], "klass": [0, 1]}),
            r"no label column.*'label' or 'y' or 'target'.*\['a', 'klass'\]",
        ),
        (pd.DataFrame({"a": [1.0, 2.0], "y": [0, 1], "label": [0, 1]}), r"several label columns \['label', 'y'\]"),
        (pd.DataFrame({"a": ["red", "blue"], "label": [0, 1]}), r"feature column 'a' is not numeric"),
        (pd.DataFrame({"a": [1.0, None], "label": [0, 1]}), r"feature columns \['a'\] have missing values"),
        (pd.DataFrame({"a": [1.0, 2.0], "label": ["cat", "dog"]}), r"labels 'label' have dtype object.*LabelEncoder"),
        (pd.DataFrame({"a": [], "label": []}), r"has a header but no rows"),  # was an IndexError
        (  # was a 512 TB allocation: the classes are 0..the largest label
            pd.DataFrame({"a": [1.0, 2.0], "label": [0, 10**12]}),
            r"contain the value 1000000000000, so a model would need 1000000000001 outputs; at most 100000",
        ),
    ],
)
def test_bad_csv(tmp_path, frame, message):
    frame.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(HftaNasError, match=message):
        load_dataset(str(tmp_path / "bad.csv"))


def test_factory_errors(tmp_path, monkeypatch):
    with pytest.raises(HftaNasError, match=r"could not import module 'no_such_module_xyz'.*No module named"):
        load_dataset("no_such_module_xyz:make")
    write_module(
        tmp_path,
        "factory_errors_mod",
        """
        VALUE = 3
        def broken():
            raise RuntimeError("disk on fire")
        def wrong():
            return 42
    """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "factory_errors_mod", raising=False)
    with pytest.raises(HftaNasError, match=r"module 'factory_errors_mod' .* has no function 'missing'"):
        load_dataset("factory_errors_mod:missing")
    with pytest.raises(HftaNasError, match=r"no function 'VALUE' \(the attribute is not callable\)"):
        load_dataset("factory_errors_mod:VALUE")
    with pytest.raises(HftaNasError, match=r"factory_errors_mod.broken\(\) raised RuntimeError: disk on fire"):
        load_dataset("factory_errors_mod:broken")
    with pytest.raises(HftaNasError, match=r"is a int; expected a tuple \(x, y\)"):
        load_dataset("factory_errors_mod:wrong")


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x": np.ones((3, 2)), "y": np.array([0, -1, 1])}, r"labels 'y' contain the negative value -1"),
        ({"x": np.ones((3, 2)), "y": np.array([0.0, 0.5, 1.0])}, r"non-integer values such as \[0.5\]"),
        ({"x": np.ones((3, 2)), "y": np.array([0, 1])}, r"'x' has 3 samples but 'y' has 2 labels"),
        ({"x": np.ones((0, 2)), "y": np.zeros(0, int)}, r"'x' is empty"),
        ({"x": np.array([[0.0], [np.nan], [1.0]]), "y": np.zeros(3, int)}, r"NaN or infinite values .*index 1"),
        ({"x": np.ones(3), "y": np.zeros(3, int)}, r"'x' has shape \(3,\); expected \[num_samples, \*sample_shape\]"),
        ({"x": np.ones((3, 2)), "y": np.zeros((3, 1), int)}, r"labels 'y' have shape \(3, 1\)"),
        ({"features": np.ones((3, 2)), "y": np.zeros(3, int)}, r"has arrays \['features', 'y'\]; expected 'x'"),
        ({"x_train": np.ones((3, 2)), "y_train": np.zeros(3, int)}, r"lacks \['x_val', 'y_val', 'x_test', 'y_test'\]"),
    ],
)
def test_bad_arrays(tmp_path, arrays, message):
    path = write_npz(tmp_path, **arrays)
    with pytest.raises(HftaNasError, match=message) as error:
        load_dataset(path)
    assert "bad.npz" in str(error.value)  # every message says which file


def test_float_labels_that_are_whole_numbers_are_accepted(tmp_path):
    data = load_dataset(write_npz(tmp_path, x=np.ones((10, 2)), y=np.arange(10.0) % 2))
    assert data.y_train.dtype == torch.int64 and data.num_classes == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"val_fraction": -0.1}, r"val_fraction must be a number in \[0, 1\), got -0.1"),
        ({"test_fraction": 1.0}, r"test_fraction must be a number in \[0, 1\)"),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, r"val_fraction \+ test_fraction must be below 1"),
        ({"val_fraction": "0.1"}, r"val_fraction must be a number"),
        ({"split_seed": -1}, r"split_seed must be a non-negative integer"),
        ({"split_seed": 1.5}, r"split_seed must be an integer"),
        ({"num_samples": 100}, r"num_samples=100 only applies to the generated 'mnist1d'"),
        ({"dtype": torch.int64}, r"dtype must be a floating torch dtype"),
        ({"device": "gpu"}, r"device 'gpu' cannot be used"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(HftaNasError, match=message):
        load_dataset("digits", **kwargs)


def test_too_few_samples_for_the_fractions(tmp_path):
    # a positive fraction holds out at least one sample, so 2 samples leave none to train on
    with pytest.raises(HftaNasError, match="2 samples are too few"):
        load_dataset(write_npz(tmp_path, x=np.ones((2, 2)), y=np.zeros(2, int)))
    with pytest.raises(HftaNasError, match="8 samples are too few for val_fraction=0.95"):
        load_dataset("mnist1d", num_samples=10, val_fraction=0.95)
    with pytest.raises(HftaNasError, match="num_samples must be at least 10"):
        load_dataset("mnist1d", num_samples=5)


# -- per-slot data order ---------------------------------------------------------


def loader_epochs(x, y, seed, batch_size, drop_last, epochs) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """The batches plain PyTorch yields, epoch after epoch, for one seed."""
    loader = DataLoader(
        TensorDataset(x, y),
        batch_size=batch_size,
        shuffle=True,
        drop_last=drop_last,
        generator=torch.Generator().manual_seed(seed),
    )
    return [list(loader) for _ in range(epochs)]


def loader_orders(n, seed, batch_size=4, drop_last=False, epochs=3) -> list[torch.Tensor]:
    """DataLoader's sample order per epoch (the indices it visits, concatenated)."""
    index = torch.arange(n)
    return [
        torch.cat([b for b, _ in epoch]) for epoch in loader_epochs(index, index, seed, batch_size, drop_last, epochs)
    ]


def flat(steps: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(steps, dim=-1)


@pytest.mark.parametrize("drop_last", [False, True])
def test_per_slot_batches_equal_dataloader(drop_last):
    n, batch_size, seeds, epochs = 23, 5, [0, 7, 123], 4  # 23 % 5 != 0: a ragged last batch
    x, y = torch.randn(n, 2, 3), torch.randint(0, 10, (n,))
    reference = [loader_epochs(x, y, seed, batch_size, drop_last, epochs) for seed in seeds]
    order = EpochOrder(n, batch_size, seeds, drop_last=drop_last)
    assert order.num_slots == 3 and order.steps_per_epoch == (4 if drop_last else 5)
    for epoch in range(epochs):
        steps = order.next_epoch()
        assert len(steps) == len(reference[0][epoch]) == order.steps_per_epoch
        for step, index in enumerate(steps):
            assert index.dtype == torch.int64 and index.shape == (3, len(reference[0][epoch][step][1]))
            xb, yb = gather(x, index), gather(y, index)
            assert xb.shape == (3, index.shape[1], 2, 3)
            for b in range(3):
                assert torch.equal(xb[b], reference[b][epoch][step][0])
                assert torch.equal(yb[b], reference[b][epoch][step][1])
    assert order.epochs == (epochs,) * 3


@pytest.mark.parametrize("drop_last", [False, True])
def test_shared_order_equals_dataloader(drop_last):
    n, batch_size = 17, 4
    x, y = torch.randn(n, 3), torch.arange(n)
    reference = loader_epochs(x, y, 5, batch_size, drop_last, 3)
    order = EpochOrder(n, batch_size, None, shared_seed=5, drop_last=drop_last)
    assert order.shared and order.num_slots is None
    for epoch in range(3):
        steps = order.next_epoch()
        assert [index.shape for index in steps] == [yb.shape for _, yb in reference[epoch]]
        for index, (xb, yb) in zip(steps, reference[epoch]):
            assert torch.equal(gather(x, index), xb) and torch.equal(gather(y, index), yb)


def test_slot_order_does_not_depend_on_array_size():
    alone = EpochOrder(30, 8, [42])
    in_array = EpochOrder(30, 8, [1, 2, 42, 3])
    for _ in range(3):
        assert torch.equal(flat(alone.next_epoch())[0], flat(in_array.next_epoch())[2])


def test_drop_and_replace_slots_keep_other_orders():
    n = 13
    seeds = [1, 2, 3, 4]
    expected = {seed: loader_orders(n, seed) for seed in [*seeds, 99]}
    order = EpochOrder(n, 4, seeds)
    first = flat(order.next_epoch())
    for b, seed in enumerate(seeds):
        assert torch.equal(first[b], expected[seed][0])

    order.drop_slots([3, 0, 2])  # slot 1 goes, the rest are reordered
    assert order.data_seeds == (4, 1, 3) and order.num_slots == 3
    second = flat(order.next_epoch())
    for b, seed in enumerate(order.data_seeds):
        assert torch.equal(second[b], expected[seed][1])

    order.replace_slot(1, 99)  # a fresh trial in slot 1 starts its own epoch 0
    assert order.epochs == (2, 0, 2)
    third = flat(order.next_epoch())
    assert torch.equal(third[0], expected[4][2])
    assert torch.equal(third[1], expected[99][0])
    assert torch.equal(third[2], expected[3][2])


def test_gather_is_per_slot_indexing():
    x = torch.randn(10, 2, 3)
    index = torch.tensor([[0, 9, 3], [5, 5, 1]])
    out = gather(x, index)
    assert out.shape == (2, 3, 2, 3)
    for b in range(2):
        assert torch.equal(out[b], x[index[b]])


def test_epoch_order_errors():
    with pytest.raises(HftaNasError, match="exactly one of data_seeds"):
        EpochOrder(10, 2, [1], shared_seed=3)
    with pytest.raises(HftaNasError, match="exactly one of data_seeds"):
        EpochOrder(10, 2, None)
    with pytest.raises(HftaNasError, match="data_seeds is empty"):
        EpochOrder(10, 2, [])
    with pytest.raises(HftaNasError, match="data seed 1.5 is not an integer"):
        EpochOrder(10, 2, [1, 1.5])
    with pytest.raises(HftaNasError, match="batch_size must be a positive integer, got 0"):
        EpochOrder(10, 0, [1])
    with pytest.raises(HftaNasError, match="drop_last=True leaves no batch"):
        EpochOrder(3, 4, [1], drop_last=True)
    with pytest.raises(HftaNasError, match="shared data order cannot restart"):
        EpochOrder(10, 2, None, shared_seed=1).replace_slot(0, 5)
    order = EpochOrder(10, 2, [1, 2])
    with pytest.raises(IndexError):
        order.replace_slot(2, 5)
    with pytest.raises(ValueError, match="repeated"):
        order.drop_slots([0, 0])


def test_batch_larger_than_data_gives_one_short_step():
    steps = EpochOrder(3, 8, [0, 1]).next_epoch()
    assert len(steps) == 1 and steps[0].shape == (2, 3)
    assert torch.equal(steps[0].sort(dim=1).values, torch.arange(3).expand(2, 3))
