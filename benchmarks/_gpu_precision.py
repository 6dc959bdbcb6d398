"""Mixed precision and per-slot randomness on one device, against plain PyTorch on that device.

- fp16: SlotGradScaler against torch.amp.GradScaler on each model alone, both under float16
  autocast with a first scale high enough that the first steps overflow and are skipped (the slots
  skip on their own); and tests/test_mixed_precision.py's forced skips of a first step, exact in
  float64, for every optimizer;
- bf16: autocast reaches the fused layers, outputs equal each model's to bf16 rounding;
- dropout: a slot draws the masks it draws alone whatever array it is packed into
  (tests/test_dropout_per_slot.py's envelopes), and the same masks on this device as on the CPU.
"""

from __future__ import annotations

import copy

import torch
from torch.nn import functional as F

import hfta_nas
from benchmarks._gpu_compare import Recorder, slots_difference, state_difference, tensor_difference
from hfta_nas import ModelArray
from hfta_nas.optim import SlotGradScaler
from tests import test_dropout_per_slot as dropout_tests
from tests import test_mixed_precision as precision_tests
from tests import test_trainer

# float16 autocast: products rounded to 11 bits, summed in another order in the fused kernels
FP16_TOLERANCE, BF16_TOLERANCE = 2e-2, 2e-2
FP16_STEPS, FP16_INIT_SCALE = 16, 2.0**24  # scaled gradients past float16's 65504: the first steps skip


def _conv_batches(device, steps, slots):
    generator = torch.Generator().manual_seed(0)
    return [
        (
            torch.randn(slots, 16, 2, 12, generator=generator).to(device),
            torch.randint(0, 3, (slots, 16), generator=generator).to(device),
        )
        for _ in range(steps)
    ]


def fp16_scaler(rec: Recorder, device: torch.device, quick: bool) -> None:
    """float16 autocast, SGD with momentum, per-slot loss scales from 2^24 halved down to what fits.

    Whether a scaled gradient overflows is decided by float16 rounding where it lies within rounding
    of 65504, and the fused kernels round in another order than the model alone: such a borderline
    slot may skip one step more or less than alone and then trains on another path. Weights are
    compared over the slots whose every skip decision equals alone's, (the others are counted)."""
    seeds, lrs = test_trainer.INIT_SEEDS, [0.1, 0.05, 0.2, 0.02]
    batches = _conv_batches(device, FP16_STEPS, len(seeds))
    array = ModelArray.from_factory(test_trainer.conv_bn_model, seeds=seeds, device=device)
    optimizer = hfta_nas.optim.SGD(array, lr=lrs, momentum=0.9)
    scaler = SlotGradScaler(optimizer, init_scale=FP16_INIT_SCALE)
    decisions = []  # per step, which slots skipped
    for x, y in batches:
        with torch.autocast(device.type, dtype=torch.float16):
            logits = array(x)
            losses = torch.stack([F.cross_entropy(logits[b].float(), y[b]) for b in range(len(seeds))])
        optimizer.zero_grad()
        scaler.scale(losses).sum().backward()
        scaler.step()
        decisions.append(scaler.found_inf.tolist())
        scaler.update()
    alone = [_fp16_alone(slot, lrs[slot], batches, device) for slot in range(len(seeds))]
    skips = [[step[slot] for step in decisions] for slot in range(len(seeds))]
    same = [slot for slot in range(len(seeds)) if skips[slot] == alone[slot][1]]
    detail = (
        f"steps skipped per slot {[sum(s) for s in skips]} (alone {[sum(a[1]) for a in alone]}); "
        f"slots deciding as alone {same}"
    )
    rec.condition("fp16", "first steps skipped, per slot", all(s[0] for s in skips), detail)
    rec.condition("fp16", "skip decisions equal alone's in one slot or more", bool(same), detail)
    # Not a pass/fail: on the CPU (torch 2.13) slot 1's gradient stays finite at scale 2^18 in the
    # array where alone it overflows, so two of four slots skip one step fewer than alone.
    rec.note(
        "fp16", "slots whose skip decisions differ from alone's", f"{len(seeds) - len(same)} of {len(seeds)}; {detail}"
    )
    rec.condition(
        "fp16",
        "those slots' scales equal GradScaler's",
        all(scaler.scales[slot].item() == alone[slot][2] for slot in same),
        f"{scaler.scales.tolist()} vs {[a[2] for a in alone]}",
    )
    difference = max(
        (state_difference(array.slot_state_dict(slot), alone[slot][0].state_dict()) for slot in same), default=0.0
    )
    rec.compare("fp16", f"weights after {FP16_STEPS} autocast steps vs GradScaler alone", difference, FP16_TOLERANCE)


def _fp16_alone(slot, lr, batches, device):
    """One model alone under float16 autocast with torch's GradScaler: the model, its per-step skip
    decisions and its final scale."""
    torch.manual_seed(test_trainer.INIT_SEEDS[slot])
    model = test_trainer.conv_bn_model().to(device)
    plain = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    reference = torch.amp.GradScaler(device.type, init_scale=FP16_INIT_SCALE)
    skipped = []
    for x, y in batches:
        with torch.autocast(device.type, dtype=torch.float16):
            loss = F.cross_entropy(model(x[slot]).float(), y[slot])
        plain.zero_grad()
        reference.scale(loss).backward()
        before = reference.get_scale()
        reference.step(plain)
        reference.update()
        skipped.append(reference.get_scale() < before)
    return model, skipped, reference.get_scale()


def forced_first_step_skips(rec: Recorder, device: torch.device, quick: bool) -> None:
    """tests/test_mixed_precision.py: an overflowing first step (some slots, all slots) leaves every
    optimizer's state as torch's skipped step does; float64, exact to rounding."""
    names = ["adam", "sgd"] if quick else sorted(precision_tests.SKIP_OPTIMIZERS)
    seeds = precision_tests.SKIP_SEEDS
    batches = [(x.to(device), y.to(device)) for x, y in precision_tests.skip_batches()]
    for name in names:
        for skipping in ({0, 2}, {0, 1, 2}):
            torch_class, kwargs = precision_tests.SKIP_OPTIMIZERS[name]
            kwargs = {**kwargs, "weight_decay": 0.1}
            array = ModelArray.from_factory(precision_tests.skip_model, seeds=seeds, dtype=torch.float64, device=device)
            optimizer = hfta_nas.optim.OPTIMIZERS[name](array, **kwargs)
            scaler = SlotGradScaler(optimizer, init_scale=4.0)
            for step, (x, y) in enumerate(batches):
                logits = array(x)
                losses = torch.stack([F.cross_entropy(logits[b], y[b]) for b in range(len(seeds))])
                multipliers = torch.tensor(precision_tests.overflow(skipping, step), dtype=losses.dtype, device=device)
                optimizer.zero_grad()
                (scaler.scale(losses) * multipliers).sum().backward()
                scaler.step()
                scaler.update()
            models = [
                _skipped_alone(slot, torch_class, kwargs, skipping, batches, device) for slot in range(len(seeds))
            ]
            label = f"{name} skipping slots {sorted(skipping)} (float64)"
            rec.compare("fp16 first-step skips", label, slots_difference(array, models), 1e-10)


def _skipped_alone(slot, torch_class, kwargs, skipping, batches, device):
    torch.manual_seed(precision_tests.SKIP_SEEDS[slot])
    model = precision_tests.skip_model().double().to(device)
    plain = torch_class(model.parameters(), **kwargs)
    reference = torch.amp.GradScaler(device.type, init_scale=4.0)
    for step, (x, y) in enumerate(batches):
        plain.zero_grad()
        reference.scale(
            F.cross_entropy(model(x[slot]), y[slot]) * precision_tests.overflow(skipping, step)[slot]
        ).backward()
        reference.step(plain)
        reference.update()
    return model


def bf16(rec: Recorder, device: torch.device, quick: bool) -> None:
    """tests/test_mixed_precision.py's bf16 forward: the array's output in bfloat16, each slot equal to
    its model's to bf16 rounding, float32 master gradients finite."""
    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        models.append(
            torch.nn.Sequential(
                torch.nn.Conv1d(1, 64, 3, padding=1),
                torch.nn.BatchNorm1d(64),
                torch.nn.ReLU(),
                torch.nn.Flatten(),
                torch.nn.Linear(64 * 64, 5),
            ).to(device)
        )
    array = ModelArray([copy.deepcopy(model) for model in models], device=device)
    x = torch.randn(3, 20, 1, 64, generator=torch.Generator().manual_seed(0)).to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        out = array(x)
        alone = [model(x[b]) for b, model in enumerate(models)]
    rec.condition("bf16", "output dtype bfloat16", out.dtype == torch.bfloat16, str(out.dtype))
    difference = max(tensor_difference(out[b].float(), alone[b].float()) for b in range(3))
    rec.compare("bf16", "autocast outputs vs each model alone", difference, BF16_TOLERANCE)
    out.float().sum().backward()
    gradient = array.flat.grad
    rec.condition(
        "bf16",
        "float32 master gradients, finite",
        gradient.dtype == torch.float32 and bool(torch.isfinite(gradient).all()),
        str(gradient.dtype),
    )


def dropout(rec: Recorder, device: torch.device, quick: bool) -> None:
    """A slot's dropout masks (train-mode outputs over 3 steps, float64) padded among neighbours equal
    its masks alone, at the array's first and last position; and alone on this device equal alone on
    the CPU (the masks are a function of the slot's seed, not of the device's generator)."""
    cases = ["mlp-width", "conv-channels-dropout1d"] if quick else sorted(dropout_tests.ENVELOPES)
    for case in cases:
        own, others, inputs = dropout_tests.ENVELOPES[case]
        x = inputs(torch.Generator().manual_seed(3))
        model = dropout_tests.seeded(own, 1)
        alone_cpu = dropout_tests.train_mode_outputs(
            ModelArray([copy.deepcopy(model)], dropout_seeds=[7], dtype=torch.float64), x
        )
        alone = dropout_tests.train_mode_outputs(
            ModelArray([copy.deepcopy(model)], dropout_seeds=[7], dtype=torch.float64, device=device), x.to(device)
        )
        rec.compare(
            "dropout",
            f"{case}: alone on {device.type} vs alone on cpu",
            max(tensor_difference(a[0], b[0]) for a, b in zip(alone, alone_cpu)),
            1e-10,
        )
        for position in (0, -1):
            neighbours = [dropout_tests.seeded(f, 2 + i) for i, f in enumerate(others)]
            models = [copy.deepcopy(model), *neighbours] if position == 0 else [*neighbours, copy.deepcopy(model)]
            seeds = [7 if m is models[position] else 100 + i for i, m in enumerate(models)]
            together = ModelArray(models, dropout_seeds=seeds, dtype=torch.float64, device=device)
            packed = dropout_tests.train_mode_outputs(together, x.to(device))
            difference = max(tensor_difference(p[position], a[0]) for p, a in zip(packed, alone))
            rec.compare("dropout", f"{case}: packed at {position} vs alone", difference, 1e-10)
