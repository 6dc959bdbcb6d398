"""The engine's equivalence suite on one device: arrays and envelopes against plain PyTorch on the
same device, float64 and float32, every optimizer and schedule.

The models, hyper-parameters, schedules and batches are the CPU tests' own (tests/test_optim.py,
test_trainer.py, test_envelope.py, test_pbt.py, test_checkpoint.py): built on the CPU from the
same seeds, then moved, so both sides start from identical tensors. On CUDA the array takes its
unfused update (`_update`, no host round trip) while torch.optim is compared in each of its
implementations (single-tensor, foreach, fused), the paths a CUDA user's plain model takes.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import tempfile
from pathlib import Path

import torch
from torch.nn import functional as F

import hfta_nas
from benchmarks._gpu_compare import TOLERANCE, Recorder, slots_difference, tensor_difference
from hfta_nas import ArrayTrainer, ModelArray
from hfta_nas.optim import LRSchedule
from tests import test_envelope, test_optim, test_pbt, test_trainer
from tests.conftest import synthetic_dataset

DTYPES = (torch.float64, torch.float32)
# torch.optim's implementations; fused exists for some optimizers only (and Adagrad's on the CPU only)
IMPLEMENTATIONS = {"single-tensor": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _on(batches, device):
    return [(x.to(device), y.to(device)) for x, y in batches]


def optimizers(rec: Recorder, device: torch.device, quick: bool) -> None:
    """tests/test_optim.py's CASES: every optimizer and its flags, 12 steps, per-slot values."""
    cases = test_optim.CASES[::5] if quick else test_optim.CASES
    for dtype in DTYPES:
        batches = _on(test_optim.batches(12, dtype), device)
        for index, (name, per_slot, shared) in enumerate(cases):
            array = ModelArray.from_factory(test_optim.make_model, seeds=test_optim.SEEDS, dtype=dtype, device=device)
            optimizer = getattr(hfta_nas.optim, name)(array, **per_slot, **shared)
            for x, y in batches:
                logits = array(x)
                optimizer.zero_grad()
                sum(F.cross_entropy(logits[b], y[b]) for b in range(len(array))).backward()
                optimizer.step()
            for implementation, flags in IMPLEMENTATIONS.items():
                label = f"{name}-{index} {dtype_name(dtype)} vs {implementation}"
                if not set(flags) <= set(inspect.signature(getattr(torch.optim, name)).parameters):
                    rec.skip("optimizers", label, f"torch.optim.{name} has no {implementation} implementation")
                    continue
                try:
                    models = [
                        _plain_optimizer_run(b, name, per_slot, shared, flags, batches, dtype, device) for b in range(3)
                    ]
                except (RuntimeError, ValueError) as refused:  # not on this device or dtype (Adagrad fused: CPU)
                    rec.skip("optimizers", label, str(refused)[:120])
                    continue
                rec.compare("optimizers", label, slots_difference(array, models), TOLERANCE[dtype])


def _plain_optimizer_run(slot, name, per_slot, shared, flags, batches, dtype, device):
    torch.manual_seed(test_optim.SEEDS[slot])
    model = test_optim.make_model().to(device=device, dtype=dtype)
    kwargs = {k: (v[slot] if not isinstance(v, tuple) else tuple(x[slot] for x in v)) for k, v in per_slot.items()}
    optimizer = getattr(torch.optim, name)(model.parameters(), **kwargs, **shared, **flags)
    for x, y in batches:
        optimizer.zero_grad()
        F.cross_entropy(model(x[slot]), y[slot]).backward()
        optimizer.step()
    return model


def _train_pair(models, batches, opt_name, device, dtype):
    """test_envelope's run_array / run_plain on `device`: the array of `models` and each model alone,
    every optimizer with test_trainer's per-slot values and schedules (all four kinds, warm-ups)."""
    models = [model.to(device=device, dtype=dtype) for model in models]
    batches = [
        (x.to(device=device, dtype=dtype if x.is_floating_point() else x.dtype), y.to(device)) for x, y in batches
    ]
    array = ModelArray([copy.deepcopy(model) for model in models], dtype=dtype, device=device)
    optimizer, schedule = test_envelope.array_optimizer(array, opt_name)
    test_envelope.run_array(array, optimizer, schedule, batches)
    hparams = test_envelope.per_slot(test_trainer.OPTIMIZERS[opt_name], len(models))
    plain = [
        test_envelope.run_plain(
            model, opt_name, {k: v[b] for k, v in hparams.items()}, b, test_envelope.slot_batches(batches, b)
        )
        for b, model in enumerate(models)
    ]
    return slots_difference(array, plain)


def schedules(rec: Recorder, device: torch.device, quick: bool) -> None:
    """Models of equal shapes (test_trainer's conv + BatchNorm + LayerNorm net), every optimizer, with
    step, cosine, exponential and constant schedules and linear warm-ups, one per slot."""
    steps = test_envelope.EPOCHS * test_envelope.STEPS_PER_EPOCH
    for dtype in DTYPES:
        for opt_name in sorted(test_trainer.OPTIMIZERS)[: 2 if quick else None]:
            builders = [test_trainer.conv_bn_model] * len(test_trainer.INIT_SEEDS)
            models = test_envelope.build(builders)
            batches = test_envelope.make_batches(test_envelope.float_inputs, len(models), steps)
            difference = _train_pair(models, batches, opt_name, device, dtype)
            rec.compare("schedules", f"{opt_name} {dtype_name(dtype)}", difference, TOLERANCE[dtype])


# Attention with a key bias: its true gradient is exactly zero, and the adaptive optimizers turn its
# float noise into full-size steps (Adam 0.15 in float64 on the CPU), as tests/test_envelope.py says
# where it trains these with SGD and the bias-free transformer with Adam.
ATTENTION_KEY_BIAS = {"transformer", "wide_shallow_transformer"}


def envelopes(rec: Recorder, device: torch.device, quick: bool) -> None:
    """Models of different sizes padded into one envelope (test_envelope's WORKLOADS: widths, depths,
    kernels, BatchNorm, GRU, LSTM, transformers), against each model alone."""
    workloads = ("mlp", "cnn1d") if quick else sorted(test_envelope.WORKLOADS)
    steps = test_envelope.EPOCHS * test_envelope.STEPS_PER_EPOCH
    for dtype in DTYPES:
        # float64: every optimizer. float32: SGD, which passes rounding on as it is: Adam's update
        # (m / sqrt(v)) turns the rounding of a near-zero gradient into a step of full size (cnn1d:
        # 2e-4 on the CPU after 9 steps, SGD 3e-7), so it would measure Adam, not the envelope.
        names = sorted(test_trainer.OPTIMIZERS) if dtype == torch.float64 and not quick else ["SGD"]
        for workload in workloads:
            builders, make_x = test_envelope.WORKLOADS[workload]
            for opt_name in names if workload not in ATTENTION_KEY_BIAS else ["SGD"]:
                models = test_envelope.build(builders)
                batches = test_envelope.make_batches(make_x, len(models), steps)
                difference = _train_pair(models, batches, opt_name, device, dtype)
                rec.compare("envelopes", f"{workload} {opt_name} {dtype_name(dtype)}", difference, TOLERANCE[dtype])


def resident_data(rec: Recorder, device: torch.device, quick: bool) -> None:
    """ArrayTrainer with the data on the device (its batches, order and metrics there) against plain
    models fed by a shuffling DataLoader over the same device tensors (tests/test_trainer.py)."""
    for dtype in DTYPES[:1] if quick else DTYPES:
        data = synthetic_dataset(dtype=dtype).to(device=device)
        rec.condition(
            "resident data",
            f"dataset on {device.type} {dtype_name(dtype)}",
            data.x_train.device.type == device.type,
            f"x_train on {data.x_train.device}",
        )
        array = ModelArray.from_factory(
            test_trainer.conv_bn_model, seeds=test_trainer.INIT_SEEDS, dtype=dtype, device=device
        )
        optimizer = hfta_nas.optim.Adam(array, **test_trainer.OPTIMIZERS["Adam"])
        schedule = LRSchedule(optimizer, **test_trainer.SCHEDULE)
        trainer = ArrayTrainer(
            array, optimizer, data, batch_size=test_trainer.BATCH, data_seeds=test_trainer.DATA_SEEDS, schedule=schedule
        )
        results = trainer.fit(test_trainer.EPOCHS)
        plain = [_plain_loader_run(slot, data, dtype, device) for slot in range(len(test_trainer.INIT_SEEDS))]
        rec.compare(
            "resident data",
            f"ArrayTrainer Adam+schedules {dtype_name(dtype)}",
            slots_difference(array, plain),
            TOLERANCE[dtype],
        )
        rec.condition(
            "resident data",
            f"every slot completed {dtype_name(dtype)}",
            all(r.status == "completed" for r in results.values()),
            str({k: r.status for k, r in results.items()}),
        )


def _plain_loader_run(slot, data, dtype, device):
    torch.manual_seed(test_trainer.INIT_SEEDS[slot])
    model = test_trainer.conv_bn_model().to(device=device, dtype=dtype)
    optimizer = torch.optim.Adam(model.parameters(), **{k: v[slot] for k, v in test_trainer.OPTIMIZERS["Adam"].items()})
    schedule = test_trainer.torch_schedule(optimizer, slot)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(data.x_train, data.y_train),
        batch_size=test_trainer.BATCH,
        shuffle=True,
        generator=torch.Generator().manual_seed(test_trainer.DATA_SEEDS[slot]),
    )
    for _ in range(test_trainer.EPOCHS):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        schedule.step()
    return model


def copy_slot(rec: Recorder, device: torch.device, quick: bool) -> None:
    """PBT's exploit on the device: a slot copied at epoch 2 (weights, Adam state, cosine position,
    dropout counters, data order) trains on exactly as its source (tests/test_pbt.py)."""
    data = synthetic_dataset().to(device=device)
    array = ModelArray.from_factory(
        test_pbt.mlp_with_dropout, seeds=test_pbt.INIT_SEEDS, dtype=torch.float64, device=device
    )
    optimizer = hfta_nas.optim.Adam(array, lr=[1e-2, 3e-3, 2e-2], weight_decay=[0.0, 1e-3, 1e-2])
    schedule = LRSchedule(optimizer, "cosine", t_max=6)
    trainer = ArrayTrainer(
        array, optimizer, data, batch_size=test_pbt.BATCH, data_seeds=test_pbt.DATA_SEEDS, schedule=schedule
    )
    test_pbt.train_epochs(trainer, 5, at_epoch=2, action=lambda t: t.copy_slot(1, 0))
    target, source = array.slot_state_dict(0), array.slot_state_dict(1)
    difference = max(tensor_difference(target[key], source[key]) for key in source)
    rec.compare("copy_slot", "copied slot equals its source after 3 epochs (float64)", difference, 1e-12)
    losses = [trainer.results[slot].history[-1]["val_loss"] for slot in (0, 1)]
    rec.compare("copy_slot", "copied slot's last val_loss", abs(losses[0] - losses[1]) / abs(losses[1]), 1e-10)


class _Killed(Exception):
    pass


def checkpoint_resume(rec: Recorder, device: torch.device, quick: bool) -> None:
    """hfta_nas.train killed after epoch 1 and run again continues from its checkpoint to the
    uninterrupted run's results (tests/test_checkpoint.py, with dropout and BatchNorm)."""
    from tests.test_checkpoint import model

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "train.pt"
        common = dict(
            model=lambda: model(4, 0),
            dataset=synthetic_dataset(),
            seeds=[1, 2],
            epochs=3,
            batch_size=16,
            dtype="float64",
            device=str(device),
            hparams={"lr": 1e-2},
        )

        def killed_after_epoch_1(report, trainer):
            if report.epoch == 2:  # epoch 1's checkpoint is written, epoch 2's not yet
                raise _Killed

        with contextlib.suppress(_Killed):
            hfta_nas.train(checkpoint=path, on_epoch=killed_after_epoch_1, **common)
        resumed = hfta_nas.train(checkpoint=path, **common)
        reference = hfta_nas.train(checkpoint=None, **common)
    rec.condition(
        "checkpoint", "resumed from epoch 1", resumed.resumed_epoch == 1, f"resumed_epoch={resumed.resumed_epoch}"
    )
    difference = max(
        abs(got[key] - want[key]) / max(abs(want[key]), 1e-300)
        for a, b in zip(resumed.results.values(), reference.results.values())
        for got, want in zip(a.history, b.history)
        for key in want
        if isinstance(want[key], float)
    )
    rec.compare("checkpoint", "resumed run's every epoch metric vs uninterrupted (float64)", difference, 1e-10)
    weights = max(tensor_difference(resumed.array.flat, reference.array.flat), 0.0)
    rec.compare("checkpoint", "resumed run's weights vs uninterrupted (float64)", weights, 1e-10)
