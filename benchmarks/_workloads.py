"""The benchmark workloads: a model family, its config and a dataset; and the data order.

Every method of one (workload, B) cell trains the same models on the same
batches: slot b is built right after `torch.manual_seed(b)` (what
`ModelArray.from_factory(factory, seeds=range(B))` does) and walks the training
set in the order `EpochOrder(data_seeds=range(B), drop_last=True)` gives it.
The index table is made once, before any timing, and cycled; the timed loops
only gather rows from the device-resident training tensors.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from benchmarks._paper_models import BUILDERS
from hfta_nas.data import EpochOrder, load_dataset
from hfta_nas.models import build_model, count_parameters

BATCH_SIZE = 100


@dataclass(frozen=True)
class Workload:
    """One row group of the table: which model family trains on which dataset."""

    name: str
    family: str
    dataset: str
    config: dict[str, Any] = field(default_factory=dict)
    note: str = ""


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("mlp", "mlp", "mnist1d", note="Flatten -> 2 x Linear(128) + ReLU -> Linear"),
        Workload("cnn1d", "cnn1d", "mnist1d", note="3 x Conv1d(32, k=5, same) + ReLU -> Linear"),
        Workload("cnn2d", "cnn2d", "digits", note="Conv2d(16, k=3) + Conv2d(32, k=3), ReLU -> Linear"),
        Workload("bn_cnn", "bn_cnn", "digits", note="2 x [Conv2d(32, k=3) -> BatchNorm2d -> ReLU] -> Linear"),
        Workload("gru", "gru", "mnist1d", note="GRU(hidden 64) over 40 steps of 1 feature -> Linear"),
        # the HFTA paper's families at small input size (benchmarks/_paper_models.py), on synthetic data
        Workload("resnet18", "paper:resnet18", "synthetic:images32", note="ResNet-18 (CIFAR variant) on 3x32x32"),
        Workload("pointnet", "paper:pointnet", "synthetic:points", note="PointNet classifier on 256 points"),
        Workload("dcgan", "paper:dcgan", "synthetic:images32", note="DCGAN discriminator on 3x32x32, 10 classes"),
        Workload(
            "transformer",
            "paper:transformer",
            "synthetic:tokens",
            note="Embedding + 2 TransformerEncoderLayers (128 wide, 4 heads) on 64 tokens",
        ),
    )
}
CPU_WORKLOADS = ("mlp", "cnn1d", "cnn2d", "bn_cnn", "gru")  # the default table (the paper's are GPU-sized)
PAPER_WORKLOADS = ("resnet18", "pointnet", "dcgan", "transformer")
SYNTHETIC_SAMPLES = 2000


@dataclass
class Prepared:
    """A workload's data on the device, ready for every method."""

    workload: Workload
    x_train: torch.Tensor
    y_train: torch.Tensor
    input_shape: tuple[int, ...]
    num_classes: int
    parameters_per_model: int

    def build(self, seed: int, device: torch.device | str) -> nn.Module:
        """Slot `seed`'s model, initialised as `ModelArray.from_factory` would."""
        torch.manual_seed(seed)
        return self.factory()().to(device)

    def factory(self):
        """Zero-argument factory for `ModelArray.from_factory`."""
        return functools.partial(_build, self.workload, self.input_shape, self.num_classes)

    def index_table(self, slots: int, device: torch.device | str) -> torch.Tensor:
        """[slots, T, BATCH_SIZE] int64: slot b's sample indices for step t (one epoch, cycled)."""
        order = EpochOrder(len(self.y_train), BATCH_SIZE, list(range(slots)), drop_last=True, device=device)
        return torch.stack(order.next_epoch(), dim=1)


_DATA_CACHE: dict[tuple[str, str], Any] = {}


def _build(workload: Workload, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if workload.family.startswith("paper:"):
        return BUILDERS[workload.family.removeprefix("paper:")](
            input_shape=input_shape, num_classes=num_classes, **workload.config
        )
    return build_model(workload.family, workload.config, input_shape=input_shape, num_classes=num_classes)


def _synthetic(name: str, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs of a paper workload's shape and 10 random classes (throughput does not need
    learnable data): images [N, 3, 32, 32], point clouds [N, 3, 256], token ids [N, 64]."""
    g = torch.Generator().manual_seed(0)
    n = SYNTHETIC_SAMPLES
    if name == "synthetic:tokens":
        x = torch.randint(0, 1000, (n, 64), generator=g)
    else:
        x = torch.randn(n, *((3, 32, 32) if name == "synthetic:images32" else (3, 256)), generator=g)
    return x.to(device), torch.randint(0, 10, (n,), generator=g).to(device)


def prepare(workload: Workload, device: torch.device | str) -> Prepared:
    """Load (once per process) the workload's dataset onto `device`, float32."""
    key = (workload.dataset, str(device))
    if key not in _DATA_CACHE:
        if workload.dataset.startswith("synthetic:"):
            _DATA_CACHE[key] = _synthetic(workload.dataset, device)
        else:
            data = load_dataset(workload.dataset, device=device, dtype=torch.float32)
            _DATA_CACHE[key] = (data.x_train, data.y_train)
    x_train, y_train = _DATA_CACHE[key]
    shape, classes = tuple(x_train.shape[1:]), int(y_train.max()) + 1
    model = _build(workload, shape, classes)
    return Prepared(workload, x_train, y_train, shape, classes, count_parameters(model))
