"""The benchmark workloads: a model family, its config and a dataset; and the data order.

Every method of one (workload, B) cell trains the same models on the same
batches: slot b is built right after `torch.manual_seed(b)` (what
`ModelArray.from_factory(factory, seeds=range(B))` does) and walks the training
set in the order `EpochOrder(data_seeds=range(B), drop_last=True)` gives it.
The index table is made once, before any timing, and cycled; the timed loops
only gather rows from the device-resident training tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

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
    )
}


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
        return build_model(
            self.workload.family, self.workload.config, input_shape=self.input_shape, num_classes=self.num_classes
        ).to(device)

    def factory(self):
        """Zero-argument factory for `ModelArray.from_factory`."""
        workload, shape, classes = self.workload, self.input_shape, self.num_classes
        return lambda: build_model(workload.family, workload.config, input_shape=shape, num_classes=classes)

    def index_table(self, slots: int, device: torch.device | str) -> torch.Tensor:
        """[slots, T, BATCH_SIZE] int64: slot b's sample indices for step t (one epoch, cycled)."""
        order = EpochOrder(len(self.y_train), BATCH_SIZE, list(range(slots)), drop_last=True, device=device)
        return torch.stack(order.next_epoch(), dim=1)


_DATA_CACHE: dict[tuple[str, str], Any] = {}


def prepare(workload: Workload, device: torch.device | str) -> Prepared:
    """Load (once per process) the workload's dataset onto `device`, float32."""
    key = (workload.dataset, str(device))
    if key not in _DATA_CACHE:
        _DATA_CACHE[key] = load_dataset(workload.dataset, device=device, dtype=torch.float32)
    data = _DATA_CACHE[key]
    shape = tuple(data.input_shape)
    model = build_model(workload.family, workload.config, input_shape=shape, num_classes=data.num_classes)
    return Prepared(workload, data.x_train, data.y_train, shape, data.num_classes, count_parameters(model))
