"""Each lowering of the fused layers, forced on the CPU, trains every slot exactly as its model
alone: convolutions and BatchNorm as one call per slot ("loop") or one call over the array
("grouped": a grouped convolution, vmap's batch norm over B*C channels, what a GPU runs)."""

import copy

import pytest
import torch

from hfta_nas import HftaNasError, ModelArray
from hfta_nas.layers._slot_ops import batch_norm_per_slot, conv_per_slot
from tests.test_trainer import OPTIMIZERS, assert_equivalent, train_array, train_plain


@pytest.mark.parametrize("mode", ["loop", "grouped", "auto"])
def test_every_lowering_trains_each_slot_as_alone(tiny_data, monkeypatch, mode):
    monkeypatch.setenv("HFTA_NAS_LOWERING", mode)
    arr, _ = train_array(tiny_data, "Adam", OPTIMIZERS["Adam"], torch.float64)
    refs = [train_plain(b, tiny_data, "Adam", OPTIMIZERS["Adam"], torch.float64) for b in range(4)]
    assert_equivalent(arr, refs, 1e-10)  # parameters and BatchNorm running statistics


def test_the_policy_by_device_and_the_forced_modes(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv("HFTA_NAS_LOWERING", raising=False)
    assert conv_per_slot(cpu, 10**7) and not conv_per_slot(cpu, 10**3)  # measured on this CPU (see _slot_ops)
    assert not conv_per_slot(cuda, 10**9) and not batch_norm_per_slot(cuda)  # a GPU: one launch per layer
    assert batch_norm_per_slot(cpu)
    monkeypatch.setenv("HFTA_NAS_LOWERING", "grouped")
    assert not conv_per_slot(cpu, 10**9) and not batch_norm_per_slot(cpu)
    monkeypatch.setenv("HFTA_NAS_LOWERING", "loop")
    assert conv_per_slot(cuda, 1) and batch_norm_per_slot(cuda)
    monkeypatch.setenv("HFTA_NAS_LOWERING", "fast")
    with pytest.raises(HftaNasError, match="HFTA_NAS_LOWERING must be one of auto, loop, grouped"):
        ModelArray([torch.nn.Conv1d(1, 2, 3) for _ in range(2)])(torch.zeros(2, 4, 1, 8))


def test_a_lowering_changed_between_calls_runs_each_call_as_alone(monkeypatch):
    """A shape that ran without vmap under one lowering and needs vmap under the next (a benchmark
    forcing each in turn, in one process) ran into the saved state of its first call, which was never
    saved: an AttributeError. Each call now matches the plain models, BatchNorm statistics included."""
    torch.manual_seed(0)
    plain = [torch.nn.Sequential(torch.nn.BatchNorm1d(2), torch.nn.Conv1d(2, 3, 3)).double() for _ in range(2)]
    arr = ModelArray([copy.deepcopy(model) for model in plain])
    for mode in ("loop", "grouped", "loop"):
        monkeypatch.setenv("HFTA_NAS_LOWERING", mode)
        x = torch.randn(2, 4, 2, 8, dtype=torch.float64)
        out = arr(x)
        for b, model in enumerate(plain):
            torch.testing.assert_close(out[b], model(x[b]), rtol=0, atol=1e-12)
            torch.testing.assert_close(arr.slot_state_dict(b)["0.running_mean"], model[0].running_mean)
