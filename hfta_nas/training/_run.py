"""`hfta_nas.train`: one call from names and numbers to a trained array.

It is the Python twin of `hfta-nas train`: resolve the dataset and the model,
build the array from per-slot init seeds, the optimizer and schedule from
per-slot hyper-parameters, and let ArrayTrainer run. Everything else
(search, stability) builds on the same pieces.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hfta_nas.array._model_array import ModelArray, _build_seeded
from hfta_nas.data import Augmentation, Dataset, load_dataset, pooled, slot_splits
from hfta_nas.errors import HftaNasError
from hfta_nas.models import resolve_model
from hfta_nas.optim import OPTIMIZERS, LRSchedule
from hfta_nas.training._allocator import keep_freed_memory_unless_disabled
from hfta_nas.training._checkpoint import Checkpointer
from hfta_nas.training._checkpoint import enabled as checkpoints_enabled
from hfta_nas.training._hparam_replay import checked_replay
from hfta_nas.training._objectives import Objective, as_objective
from hfta_nas.training._oom import check_budget
from hfta_nas.training._slot_values import prepare
from hfta_nas.training._trainer import ArrayTrainer, EarlyStopping, EpochReport, SlotResult, TrainingSettings

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class TrainRun:
    """What `train` returns: the trained array, per-slot results and the setup."""

    array: ModelArray
    results: dict[Any, SlotResult]
    dataset: Dataset
    factory: Callable[[], nn.Module]
    seeds: dict[str, list[int]]  # per source: init, data, dropout
    seconds: float
    samples_per_second: float
    resumed_epoch: int = 0  # the epoch a checkpoint restored (0: trained from the start)
    slot_factories: list[Callable[[], nn.Module]] | None = None  # per slot, when architectures differ

    def model(self, slot: int) -> nn.Module:
        """Slot `slot` as a plain nn.Module."""
        factory = self.slot_factories[slot] if self.slot_factories else self.factory
        module = factory().to(device=self.array.device, dtype=self.array.dtype)
        return self.array.to_module(slot, module)


def train(
    model: str | Callable[..., nn.Module] = "cnn1d",
    *,
    model_config: Mapping[str, Any] | None = None,
    slot_model_configs: Sequence[Mapping[str, Any]] | None = None,
    dataset: str | Dataset = "mnist1d",
    seeds: Sequence[int] = tuple(range(8)),
    data_seeds: Sequence[int] | None = None,
    dropout_seeds: Sequence[int] | None = None,
    split_seeds: Sequence[int | None] | None = None,
    shared_order: bool = False,
    optimizer: str = "adam",
    hparams: Mapping[str, Any] | None = None,
    schedule: Mapping[str, Any] | None = None,
    epochs: int = 5,
    batch_size: int = 100,
    device: str = "cpu",
    dtype: str | torch.dtype = "float32",
    on_epoch: Callable[[EpochReport, ArrayTrainer], Any] | None = None,
    memory_budget: int | None = None,
    checkpoint: str | Path | None = None,
    remove_checkpoint: bool = True,
    accumulate: int = 1,
    early_stopping: EarlyStopping | None = None,
    loss: Objective | str | Callable[..., torch.Tensor] | None = None,
    augmentation: Augmentation | None = None,
    precision: str = "float32",
    hparam_schedule: Mapping[str, Sequence[float]] | Sequence[Mapping[str, Sequence[float]] | None] | None = None,
) -> TrainRun:
    """Train one array: slot b is `model` built after `torch.manual_seed(seeds[b])`.

    `slot_model_configs`: one model config per slot instead of `model_config`:
    slots of different sizes (widths, kernels, depths) train padded into one
    envelope (FusionError when they cannot).

    `hparams` values (lr, weight_decay, ..., and every optimizer's clip_norm and
    clip_value: per-slot gradient clipping) and `schedule` values are a float
    for all slots or one per slot; `accumulate`: micro-batches per optimizer
    step; `early_stopping`: an EarlyStopping each slot follows on its own;
    `loss`: an Objective, a loss name (cross_entropy, mse, mae, huber) or a
    function (default cross-entropy); a regression loss loads a dataset given by
    name as regression targets; `augmentation`: each slot's training batches
    augmented on the device from its data seed; `precision`: float32, bf16 or fp16
    (autocast; fp16 with per-slot loss scaling); `schedule` holds `kind` plus LRSchedule's
    arguments; `hparam_schedule`: per-slot hyper-parameter name -> one value per epoch (one
    mapping for every slot, or one or None per slot), set before each epoch (lr: the base lr an
    LR schedule scales), e.g. a population-based training member's `pbt_schedule`. Data order
    and dropout seeds default to the init seeds; pass them separately to vary one source of
    randomness at a time. `split_seeds` (one per slot; None keeps the data's split)
    re-draws each slot's train / validation partition of the data's train and validation
    samples. On CPU, an array whose estimated memory exceeds `memory_budget` bytes (default:
    $HFTA_NAS_MEMORY_BUDGET, else no limit) raises ArrayOutOfMemory before
    anything is allocated (see hfta_nas.training._oom.train_in_halves for the split).
    `checkpoint`: a file the array is saved to at every epoch's end; a call with
    the same arguments and file continues from it, bit-identically (a file saved
    with other arguments is ignored), and the file is removed at the end unless
    `remove_checkpoint` is False (a caller that first stores the results removes
    it then). $HFTA_NAS_CHECKPOINT=off: nothing is written.
    """
    seeds = list(seeds)
    if not isinstance(epochs, int) or epochs < 0:
        raise HftaNasError(f"epochs must be a non-negative integer, got {epochs!r}.")
    if not seeds:
        raise HftaNasError("train needs at least one seed (one per slot).")
    if optimizer not in OPTIMIZERS:
        raise HftaNasError(f"unknown optimizer '{optimizer}'; expected one of {sorted(OPTIMIZERS)}.")
    torch_dtype = DTYPES.get(dtype) if isinstance(dtype, str) else dtype
    if torch_dtype not in DTYPES.values():
        raise HftaNasError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}.")
    device = _checked_device(device)
    objective = as_objective(loss)
    data = (
        dataset
        if isinstance(dataset, Dataset)
        else load_dataset(dataset, device=device, dtype=torch_dtype, task=objective.kind)
    )
    if data.task != objective.kind:
        raise HftaNasError(
            f"the data holds {data.task} targets but the loss is a {objective.kind} loss "
            f"({objective.loss if isinstance(objective.loss, str) else 'a function'})."
        )
    data = data.to(device=device, dtype=torch_dtype)
    _warn_batch_beyond_data(batch_size, len(data.y_train))
    factory = resolve_model(model, model_config, input_shape=data.input_shape, num_classes=data.num_classes)
    slot_factories = None
    if slot_model_configs is not None:
        if len(slot_model_configs) != len(seeds):
            raise HftaNasError(f"slot_model_configs has {len(slot_model_configs)} entries for {len(seeds)} seeds.")
        slot_factories = [
            resolve_model(model, c, input_shape=data.input_shape, num_classes=data.num_classes)
            for c in slot_model_configs
        ]
    data_seeds = list(data_seeds) if data_seeds is not None else seeds
    dropout_seeds = list(dropout_seeds) if dropout_seeds is not None else seeds
    splits = None
    if split_seeds is not None:
        split_seeds = list(split_seeds)
        if len(split_seeds) != len(seeds) or shared_order:
            raise HftaNasError(
                f"split_seeds needs one entry per slot ({len(seeds)}, got {len(split_seeds)}) "
                "and per-slot data orders (not shared_order)."
            )
        splits, data = slot_splits(data, split_seeds), pooled(data)

    for one in slot_factories or [factory]:  # each architecture as if it filled every slot: the envelope's bound
        check_budget(
            one,
            data.input_shape,
            batch_size=batch_size,
            slots=len(seeds),
            dtype=torch_dtype,
            optimizer=optimizer,
            device=device,
            budget=memory_budget,
        )
    schedule = _checked_schedule(schedule) if schedule else None
    replay = checked_replay(hparam_schedule, len(seeds), OPTIMIZERS[optimizer], epochs)

    def make_trainer() -> ArrayTrainer:
        if slot_factories is None:
            array = ModelArray.from_factory(
                factory, seeds, dropout_seeds=dropout_seeds, device=device, dtype=torch_dtype
            )
        else:
            with torch.random.fork_rng(devices=[]):  # as from_factory: the caller's global RNG is left as it was
                models = [_build_seeded(f, seed) for f, seed in zip(slot_factories, seeds)]
            array = ModelArray(models, dropout_seeds=dropout_seeds, device=device, dtype=torch_dtype)
        opt = OPTIMIZERS[optimizer](array, **dict(hparams or {}))
        trainer = ArrayTrainer(
            array,
            opt,
            data,
            schedule=LRSchedule(opt, **schedule) if schedule else None,
            data_seeds=None if shared_order else data_seeds,
            shared_order_seed=data_seeds[0] if shared_order else None,
            splits=splits,
            **TrainingSettings(
                batch_size, accumulate, early_stopping, objective, augmentation, precision
            ).trainer_kwargs(),
        )
        if replay is not None:  # per-slot dropout rates exist before a checkpoint is put back
            prepare(trainer, replay.names)
        return trainer

    fingerprint = repr(
        (
            getattr(model, "__module__", ""),
            getattr(model, "__qualname__", model),
            model_config,
            slot_model_configs,
            getattr(data, "name", None),
            tuple(data.x_train.shape),
            seeds,
            data_seeds,
            dropout_seeds,
            split_seeds,
            shared_order,
            optimizer,
            hparams,
            schedule,
            epochs,
            batch_size,
            device.type,
            str(torch_dtype),
            accumulate,
            early_stopping,
            objective.describe(),
            augmentation,
            precision,
            # only when given: a checkpoint saved before schedules existed still resumes
            *([hparam_schedule] if replay is not None else []),
        )
    )
    saver = (
        Checkpointer(Path(checkpoint), extra={"fingerprint": fingerprint})
        if checkpoint is not None and checkpoints_enabled()
        else None
    )
    trainer = saver.resume(make_trainer) if saver is not None else make_trainer()
    resumed_epoch, epochs_before = trainer.epoch, sum(r.epochs for r in trainer.results.values())
    started = time.perf_counter()
    if replay is not None:  # the next epoch's values (a restored trainer holds them already: set again, unchanged)
        replay.apply(trainer)
        on_epoch = _then(on_epoch, replay.apply)
    results = trainer.fit(epochs, on_epoch=on_epoch, checkpoint=saver)
    seconds = time.perf_counter() - started
    if saver is not None and remove_checkpoint:
        saver.finish()
    per_epoch = splits.train.shape[1] if splits is not None else len(data.y_train)  # a slot's own train rows
    samples = (sum(r.epochs for r in results.values()) - epochs_before) * per_epoch
    return TrainRun(
        trainer.array,
        results,
        data,
        factory,
        {"init": seeds, "data": data_seeds, "dropout": dropout_seeds},
        seconds,
        samples / seconds if seconds > 0 else 0.0,
        resumed_epoch,
        slot_factories,
    )


def _then(
    on_epoch: Callable[[EpochReport, ArrayTrainer], Any] | None, apply: Callable[[ArrayTrainer], None]
) -> Callable[[EpochReport, ArrayTrainer], None]:
    """The caller's `on_epoch`, then `apply(trainer)`: the scheduled values of the coming epoch are set
    after the caller saw this epoch's and before the checkpoint is saved."""

    def both(report: EpochReport, trainer: ArrayTrainer) -> None:
        if on_epoch is not None:
            on_epoch(report, trainer)
        apply(trainer)

    return both


def _checked_schedule(schedule: Mapping[str, Any]) -> dict[str, Any]:
    """`schedule` as LRSchedule's keyword arguments; an unknown key is a user error, not a TypeError."""
    allowed = [name for name in inspect.signature(LRSchedule.__init__).parameters if name not in ("self", "optimizer")]
    unknown = [str(key) for key in schedule if key not in allowed]
    if unknown:
        close = difflib.get_close_matches(unknown[0], allowed, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise HftaNasError(f"unknown schedule argument '{unknown[0]}'{hint}; expected one of {', '.join(allowed)}.")
    return dict(schedule)


def _checked_out_dir(path: str | os.PathLike[str], option: str) -> Path:
    """`path` as a folder that can be created and written, checked before any work starts.

    A folder below a regular file, or in a read-only place, would otherwise fail
    only when the first result is written, after training.
    """
    if not str(path).strip():  # Path('') is '.': the results would land in whatever folder this runs in
        raise HftaNasError(f"{option} is empty; give a folder, or leave the option out for its default.")
    if "\x00" in str(path):  # no file system takes it; Python's file calls raise ValueError
        raise HftaNasError(f"{option} {str(path)!r} holds a NUL character; expected a folder path.")
    folder = Path(path).expanduser()
    long = next((part for part in folder.parts if len(os.fsencode(part)) > 255), None)
    if long is not None:
        raise HftaNasError(
            f"{option} '{folder}': the name '{long[:40]}...' is {len(os.fsencode(long))} bytes long; "
            "expected at most 255 bytes per folder name."
        )
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise HftaNasError(
            f"{option} '{folder}': cannot create a folder there, '{existing}' is a file; "
            "expected a folder path (existing or not)."
        )
    if existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK):
        raise HftaNasError(f"{option} '{folder}': '{existing}' is not writable; expected a folder you can write to.")
    try:  # access() says yes to root everywhere; /proc and read-only mounts refuse only when tried
        os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".hfta-nas-check-"))
    except OSError as error:
        raise HftaNasError(
            f"{option} '{folder}': cannot create a folder in '{existing}' ({error.strerror or error}); "
            "expected a folder you can write to."
        ) from None
    return folder


def _checked_device(device: str) -> torch.device:
    try:
        result = torch.device(device)
    except RuntimeError as error:
        raise HftaNasError(f"unknown device '{device}': {error}") from error
    if result.type == "cuda" and not torch.cuda.is_available():
        raise HftaNasError(f"device '{device}' was asked for but torch sees no CUDA GPU here; use --device cpu.")
    if result.type not in ("cpu", "cuda"):  # mps, meta, xpu, ...: arrays are built and tested on CPU and CUDA only
        raise HftaNasError(f"device '{device}' is not supported: arrays train on 'cpu' or 'cuda' devices.")
    return result


def _warn_batch_beyond_data(batch_size: Any, samples: int) -> None:
    """A warning (the `hfta_nas` logger) for a batch larger than the training split: legal (every
    epoch is one step over all samples), but rarely meant (a typo, or a batch size for other data)."""
    if isinstance(batch_size, int) and not isinstance(batch_size, bool) and batch_size > samples > 0:
        logging.getLogger("hfta_nas").warning(
            f"warning: batch size {batch_size} is larger than the {samples} training samples: every epoch is "
            f"one step over all of them"
        )


def set_up_command_process(threads: int | None) -> None:
    """What every training command does to its own process first: the torch thread count
    (when given) and a CPU allocator that keeps freed memory (`hfta_nas.training._allocator`)."""
    if threads is not None:
        cores = os.cpu_count() or 1
        if threads > cores:  # beyond the cores only slows torch down, and far beyond it cannot start its threads
            raise HftaNasError(f"--threads {threads}: this machine has {cores} CPU core(s); give at most {cores}.")
        torch.set_num_threads(threads)
    keep_freed_memory_unless_disabled()
