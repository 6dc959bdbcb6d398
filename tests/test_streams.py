"""Data read batch by batch: a folder of memory-mapped .npy arrays and a map-style torch Dataset
(from 'module:function'), each giving the batches a DataLoader would and training exactly as the
same data held in memory; models with dict inputs from such a dataset."""

import sys

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hfta_nas
from hfta_nas import HftaNasError
from hfta_nas.data import EpochOrder, load_dataset

SEEDS = [0, 1, 2]


@pytest.fixture
def arrays():
    rng = np.random.default_rng(0)
    return rng.normal(size=(90, 1, 12)), rng.integers(0, 3, 90)


@pytest.fixture
def module(tmp_path, monkeypatch, arrays):
    """A user module with a map-style dataset that counts its reads."""
    x, y = arrays
    np.savez(tmp_path / "arrays.npz", x=x, y=y)
    (tmp_path / "my_data.py").write_text(
        "import numpy as np, torch\n"
        "class Items(torch.utils.data.Dataset):\n"
        "    reads = 0\n"
        "    def __init__(self, dict_inputs=False):\n"
        "        a = np.load(__file__.replace('my_data.py', 'arrays.npz'))\n"
        "        self.x, self.y, self.dict_inputs = a['x'], a['y'], dict_inputs\n"
        "    def __len__(self):\n"
        "        return len(self.y)\n"
        "    def __getitem__(self, i):\n"
        "        Items.reads += 1\n"
        "        x = torch.as_tensor(self.x[i])\n"
        "        return ({'signal': x, 'scale': x.abs().mean(-1)} if self.dict_inputs else x), int(self.y[i])\n"
        "def items():\n"
        "    return Items()\n"
        "def dict_items():\n"
        "    return Items(dict_inputs=True)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield sys.modules.get("my_data")
    sys.modules.pop("my_data", None)


def test_a_map_dataset_gives_the_batches_of_a_dataloader(module):
    data = load_dataset("my_data:items", val_fraction=0.0, test_fraction=0.0, dtype=torch.float64)
    every = torch.arange(len(data.y_train))
    # the same samples held in memory, in the dataset's order, read by DataLoaders of the slots' seeds
    memory = TensorDataset(data.x_train[every], data.y_train[every])
    generators = [torch.Generator().manual_seed(seed) for seed in SEEDS]
    order = EpochOrder(len(data.y_train), 16, SEEDS)
    for _ in range(2):  # two epochs: each slot's generator goes on, as a DataLoader's does
        loaders = [list(DataLoader(memory, batch_size=16, shuffle=True, generator=g)) for g in generators]
        for step, index in enumerate(order.next_epoch()):
            x, y = data.x_train[index], data.y_train[index]
            for slot in range(len(SEEDS)):
                torch.testing.assert_close(x[slot], loaders[slot][step][0], rtol=0, atol=0)
                assert torch.equal(y[slot], loaders[slot][step][1])


@pytest.mark.parametrize("shared", [False, True])
def test_streamed_sources_train_exactly_as_the_data_in_memory(module, arrays, tmp_path, shared):
    x, y = arrays
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y)
    runs = {}
    for name, source in (("memory", str(tmp_path / "arrays.npz")), ("npy", str(folder)), ("dataset", "my_data:items")):
        data = load_dataset(source, dtype=torch.float64)
        runs[name] = hfta_nas.train(
            "cnn1d",
            model_config={"channels": [4]},
            dataset=data,
            seeds=SEEDS,
            epochs=2,
            batch_size=16,
            dtype="float64",
            shared_order=shared,
        )
    for name in ("npy", "dataset"):
        assert [r.history for r in runs[name].results.values()] == [r.history for r in runs["memory"].results.values()]
        for slot in range(len(SEEDS)):
            for key, value in runs["memory"].array.slot_state_dict(slot).items():
                torch.testing.assert_close(runs[name].array.slot_state_dict(slot)[key], value, rtol=0, atol=0)


def test_a_shared_order_reads_each_sample_once_per_epoch(module):
    data = load_dataset("my_data:items", val_fraction=0.0, test_fraction=0.0, dtype=torch.float64)
    items = sys.modules["my_data"].Items
    before = items.reads
    hfta_nas.train(
        "cnn1d",
        model_config={"channels": [4]},
        dataset=data,
        seeds=SEEDS,
        epochs=1,
        batch_size=16,
        dtype="float64",
        shared_order=True,
    )
    assert items.reads - before == 90  # x and y of a batch read together, once for all slots
    before = items.reads
    hfta_nas.train(
        "cnn1d", model_config={"channels": [4]}, dataset=data, seeds=SEEDS, epochs=1, batch_size=16, dtype="float64"
    )
    assert items.reads - before == 90 * len(SEEDS)  # one order per slot: each slot's samples


class DictModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv1d(1, 4, 3, padding=1), nn.Linear(4 * 12 + 1, 3)

    def forward(self, batch):
        h = self.conv(batch["signal"]).flatten(1)
        return self.head(torch.cat([h, batch["scale"]], dim=1))


def test_a_dataset_of_dict_inputs_trains_a_model_that_takes_them(module):
    data = load_dataset("my_data:dict_items", dtype=torch.float64)
    run = hfta_nas.train(DictModel, dataset=data, seeds=SEEDS, epochs=2, batch_size=16, dtype="float64")
    assert all(r.status == "completed" and np.isfinite(r.final["val_loss"]) for r in run.results.values())
    torch.manual_seed(SEEDS[1])  # slot 1 equals its model trained alone on the same batches
    alone = DictModel().double()
    opt = torch.optim.Adam(alone.parameters(), lr=1e-3)
    order = EpochOrder(len(data.y_train), 16, [SEEDS[1]])
    for _ in range(2):
        for index in order.next_epoch():
            batch, labels = data.x_train[index[0]], data.y_train[index[0]]
            opt.zero_grad()
            nn.functional.cross_entropy(alone(batch), labels).backward()
            opt.step()
    for key, value in alone.state_dict().items():
        torch.testing.assert_close(run.array.slot_state_dict(1)[key], value, rtol=1e-10, atol=1e-12)


def test_bad_streamed_sources_are_clear_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(HftaNasError, match="expected x.npy and y.npy"):
        load_dataset(str(tmp_path / "empty"))
    folder = tmp_path / "bad"
    folder.mkdir()
    np.save(folder / "x.npy", np.zeros((10, 3)))
    np.save(folder / "y.npy", np.full(10, 0.5))
    with pytest.raises(HftaNasError, match="non-integer values"):
        load_dataset(str(folder))


def test_per_slot_splits_of_streamed_data_are_refused_in_one_line(module):
    data = load_dataset("my_data:items", dtype=torch.float64)
    with pytest.raises(HftaNasError, match=r"--vary split\) need the data held in memory"):
        hfta_nas.train("cnn1d", dataset=data, seeds=[0, 1], split_seeds=[1, 2], epochs=1, dtype="float64")
