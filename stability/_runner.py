"""`run_stability`: train each configuration across its seeds, in arrays, and
collect the raw result (`StabilityResult`) the statistics and report read.

All seeds of one configuration have the same shapes, so they train as one
array (slot b: init seed, data-order seed and dropout seed of plan b); only
`array_size` (or an out-of-memory split) cuts them into several arrays.
Seeds already stored for this configuration (an earlier, maybe killed, run
of the same command) are reused instead of retrained.
"""

from __future__ import annotations

import hashlib
import platform
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
import scipy
import torch

import hfta_nas
from hfta_nas.data import Dataset, load_dataset
from hfta_nas.errors import HftaNasError
from hfta_nas.models import resolve_model
from hfta_nas.optim import OPTIMIZERS
from hfta_nas.runtime import DTYPES, remove_checkpoint, remove_empty_folders, train_in_halves
from hfta_nas.runtime import checked_device as _checked_device
from hfta_nas.search import checkpoint_folder
from hfta_nas.search_spaces import ResolvedConfig

from ._configs import LabelledConfig
from ._design import SeedPlan, parse_decompose, plan
from ._result import DEFAULT_VARY, SOURCES, StabilityResult
from ._store import SeedOutcome, SeedStore, frames, study_name_for

Event = Callable[[str, dict[str, Any]], None]


def run_stability(
    configs: Sequence[LabelledConfig],
    *,
    n_seeds: int = 32,
    vary: Sequence[str] = DEFAULT_VARY,
    decompose: bool | str | None = None,
    base_seed: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
    array_size: int | None = None,
    storage: Any = None,
    storage_location: str = "",
    bootstrap_seed: int = 0,
    on_event: Event | None = None,
) -> tuple[StabilityResult, dict[str, SeedStore]]:
    """Train every configuration across `n_seeds` seeds; returns the result and each config's store.

    `on_event(kind, info)` hears the progress: "config" (seeds to train, reused), "started" (an array
    begins: its build, checks and first epoch are ahead), "epoch", "continued"
    (an array restored from an interrupted run's checkpoint: info["epoch"] is the epoch it restored),
    "split" (out of memory: trained in halves), "array" (one array done) and "seeds" (that array's seeds:
    info["seeds"] lists each one's label, study, config, slot and SeedOutcome)."""
    if not configs:
        raise HftaNasError("no configuration to run.")
    if array_size is not None and array_size < 1:
        raise HftaNasError(f"--array-size must be a positive integer, got {array_size}.")
    if dtype not in DTYPES:
        raise HftaNasError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}.")
    device_type = _checked_device(device).type
    on_event = on_event or (lambda kind, info: None)
    decompose = parse_decompose(decompose)
    plans = plan(n_seeds, vary=vary, decompose=decompose, base_seed=base_seed)
    started = time.perf_counter()
    datasets: dict[str, Dataset] = {}
    outcomes: dict[str, list[SeedOutcome]] = {}
    stores: dict[str, SeedStore] = {}
    arrays: list[dict[str, Any]] = []
    for group in fusable_groups(configs, lambda config: _dataset(config, datasets, device, dtype)):
        data = _dataset(group[0].config, datasets, device, dtype)
        todo: list[tuple[LabelledConfig, int]] = []  # (configuration, plan index): the slots to train
        for item in group:
            store = None
            if storage is not None:
                store = SeedStore(
                    storage, study_name_for(item.label, item.config, dtype), config=item.config, device=device_type
                )
                stores[item.label] = store
            done = store.finished() if store is not None else {}
            outcomes[item.label] = [store.lookup(p, done) if store else None for p in plans]
            missing = [i for i, outcome in enumerate(outcomes[item.label]) if outcome is None]
            todo += [(item, i) for i in missing]
            on_event(
                "config",
                {
                    "label": item.label,
                    "todo": len(missing),
                    "reused": len(plans) - len(missing),
                    "study": store.name if store else None,
                },
            )
        first = stores.get(group[0].label)
        folder = checkpoint_folder(storage_location, first.name) if first is not None else None
        size = array_size or max(len(todo), 1)
        for start in range(0, len(todo), size):
            whole = todo[start : start + size]
            for chunk, (trained, info) in _train_fitting(whole, plans, data, device, dtype, on_event, folder):
                label = ", ".join(dict.fromkeys(item.label for item, _ in chunk))
                arrays.append({"config": label, **info})
                on_event("array", {"label": label, **info})
                on_event("seeds", {"array": len(arrays), "seeds": _seed_rows(chunk, trained, stores)})
                for item in group:
                    mine = [(i, o) for (owner, i), o in zip(chunk, trained) if owner is item]
                    if mine and item.label in stores:
                        stores[item.label].add(
                            [o for _, o in mine], array=len(arrays), hfta_nas_version=hfta_nas.__version__
                        )
                    for i, outcome in mine:
                        outcomes[item.label][i] = outcome
                if folder is not None:  # stored: a kill from here on loses nothing
                    remove_checkpoint(folder / _array_key([(it.config, plans[i]) for it, i in chunk], device, dtype))
            if folder is not None:  # the whole array's, when it ran out of memory mid-run and trained in halves
                remove_checkpoint(folder / _array_key([(it.config, plans[i]) for it, i in whole], device, dtype))
        remove_empty_folders(folder)
    metadata = protocol(
        configs,
        plans,
        n_seeds=n_seeds,
        vary=vary,
        decompose=decompose,
        base_seed=base_seed,
        device=device,
        dtype=dtype,
        bootstrap_seed=bootstrap_seed,
        arrays=arrays,
        n_test=_n_test(datasets),
        seconds=time.perf_counter() - started,
        studies={label: s.name for label, s in stores.items()},
        storage=storage_location,
    )
    metadata["reused_seeds"] = sum(o.reused for group in outcomes.values() for o in group)
    result = StabilityResult(*frames(outcomes), metadata)
    for store in stores.values():
        store.set_metadata(metadata)
    return result, stores


Slot = tuple[LabelledConfig, int]  # a configuration and the index of its seed plan


def _seed_rows(chunk: list[Slot], trained: list[SeedOutcome], stores: dict[str, SeedStore]) -> list[dict[str, Any]]:
    """What the "seeds" event tells of one array's seeds (a tracker's runs, `stability.StabilityTracking`)."""
    return [
        {
            "label": item.label,
            "study": stores[item.label].name if item.label in stores else item.label,
            "config": item.config,
            "slot": slot,
            "outcome": outcome,
        }
        for slot, ((item, _), outcome) in enumerate(zip(chunk, trained))
    ]


def fusable_groups(
    configs: Sequence[LabelledConfig], data_of: Callable[[ResolvedConfig], Dataset]
) -> list[list[LabelledConfig]]:
    """The configurations that can train in one array, in order: the same data, optimizer and its
    flags, schedule, epochs, batch size and model family (or factory); per-slot hyper-parameters
    (lr, weight decay, momentum, betas, ...) may differ, and model configs the engine can pad into
    one envelope (`hfta_nas.check_fusable` of their models on the meta device). Each joins the
    first group it fuses with, as in a search's packing."""
    by_settings: dict[str, list[list[LabelledConfig]]] = {}
    for item in configs:
        config = item.config
        groups = by_settings.setdefault(repr((config.shared_key(), config.model, config.schedule)), [])
        joined = next((g for g in groups if _fuses([*g, item], data_of(config))), None)
        if joined is not None:
            joined.append(item)
        else:
            groups.append([item])
    return [group for groups in by_settings.values() for group in groups]


def _fuses(items: list[LabelledConfig], data: Dataset) -> bool:
    """Equal model configs always fuse; different ones when their meta-device models pad into one envelope."""
    if all(item.config.model_config == items[0].config.model_config for item in items):
        return True
    try:
        with torch.device("meta"):
            shells = [
                resolve_model(
                    item.config.model,
                    item.config.model_config,
                    input_shape=data.input_shape,
                    num_classes=data.num_classes,
                )()
                for item in items
            ]
        hfta_nas.check_fusable(shells)
    except Exception:  # noqa: BLE001 - FusionError, or a model that cannot be built on the meta device
        return False
    return True


def _train_fitting(
    chunk: list[Slot],
    plans: Sequence[SeedPlan],
    data: Dataset,
    device: str,
    dtype: str,
    on_event: Event,
    checkpoints: Path | None = None,
) -> list[tuple[list[Slot], tuple[list[SeedOutcome], dict[str, Any]]]]:
    """Train `chunk` (each configuration with its plans' seeds) as one array, split in halves while it
    runs out of memory; a seed that does not fit even alone is a failed seed with the reason (counted,
    not lost). With a `checkpoints` folder each array saves itself every epoch and a re-run continues it."""
    label = ", ".join(dict.fromkeys(item.label for item, _ in chunk))
    epochs = chunk[0][0].config.epochs

    def train(part: list[Slot]) -> tuple[list[SeedOutcome], dict[str, Any]]:
        slots = [(item.config, plans[i]) for item, i in part]
        started = []
        on_event("started", {"label": label, "epochs": epochs, "size": len(part)})  # elapsed counts from here

        def on_epoch(epoch: int, size: int) -> None:
            info = {"label": label, "epoch": epoch, "epochs": epochs, "size": size}
            if not started and epoch > 1:  # training starts at epoch 1 unless a checkpoint restored it
                on_event("continued", {**info, "epoch": epoch - 1})
            started.append(epoch)
            on_event("epoch", info)

        return train_slots(
            slots,
            data,
            device=device,
            dtype=dtype,
            on_epoch=on_epoch,
            checkpoint=checkpoints / _array_key(slots, device, dtype) if checkpoints else None,
            remove_checkpoint=False,
        )

    def on_split(size: int, half: int, reason: str) -> None:
        on_event("split", {"label": label, "size": size, "half": half, "reason": reason})

    done = []
    for part, trained in train_in_halves(chunk, train, on_split):
        if isinstance(trained, str):  # out of memory with one seed
            failed = [
                SeedOutcome(plans[i], "failed", trained, 0, [], device=torch.device(device).type) for _, i in part
            ]
            trained = (failed, {"size": len(part), "seconds": 0.0, "samples_per_s": 0.0, "error": trained})
        done.append((part, trained))
    return done


def train_seeds(
    config: ResolvedConfig,
    plans: Sequence[SeedPlan],
    data: Dataset,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    on_epoch: Callable[[int, int], None] | None = None,
    checkpoint: Path | None = None,
) -> tuple[list[SeedOutcome], dict[str, Any]]:
    """One array: slot b trains `config` with the seeds of `plans[b]` (continuing from
    `checkpoint` when an earlier run of the same array left one)."""
    return train_slots(
        [(config, p) for p in plans], data, device=device, dtype=dtype, on_epoch=on_epoch, checkpoint=checkpoint
    )


def train_slots(
    slots: Sequence[tuple[ResolvedConfig, SeedPlan]],
    data: Dataset,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    on_epoch: Callable[[int, int], None] | None = None,
    checkpoint: Path | None = None,
    remove_checkpoint: bool = True,
) -> tuple[list[SeedOutcome], dict[str, Any]]:
    """One array: slot b trains configuration `slots[b][0]` (its own per-slot hyper-parameters and
    per-epoch hyper-parameter schedule; everything else as `fusable_groups` requires, shared) with
    the seeds of plan `slots[b][1]`."""
    plans = [p for _, p in slots]
    kwargs = slots[0][0].train_kwargs()
    configs = [config for config, _ in slots]
    kwargs["hparams"] = OPTIMIZERS[configs[0].optimizer].slot_arguments(
        [c.slot_hparams() for c in configs], configs[0].optimizer_flags()
    )
    if any(config.model_config != kwargs["model_config"] for config, _ in slots):  # sizes differ: an envelope
        kwargs["slot_model_configs"] = [config.model_config for config, _ in slots]
    # each slot its own per-epoch schedule (a PBT member's, replayed), or none
    schedules = [config.hparam_schedule for config in configs]
    kwargs["hparam_schedule"] = schedules if any(schedules) else None
    run = hfta_nas.train(
        dataset=data,
        device=device,
        dtype=dtype,
        seeds=[p.seeds["init"] for p in plans],
        data_seeds=[p.seeds["data"] for p in plans],
        dropout_seeds=[p.seeds["dropout"] for p in plans],
        split_seeds=[p.seeds.get("split") for p in plans] if any("split" in p.seeds for p in plans) else None,
        on_epoch=(lambda report, trainer: on_epoch(report.epoch, len(plans))) if on_epoch else None,
        checkpoint=checkpoint,
        remove_checkpoint=remove_checkpoint,
        **kwargs,
    )
    outcomes = []
    for p, result in zip(plans, run.results.values()):
        status = "completed" if result.status == "completed" else "failed"
        outcomes.append(
            SeedOutcome(p, status, result.reason, result.epochs, list(result.history), device=torch.device(device).type)
        )
    info = {
        "size": len(plans),
        "seconds": run.seconds,
        "samples_per_s": run.samples_per_second,
        "resumed_epoch": run.resumed_epoch,
    }
    return outcomes, info


def _array_key(slots: Sequence[tuple[ResolvedConfig, SeedPlan]], device: str, dtype: str) -> str:
    """The checkpoint file of one array: the same configurations, seeds, device and dtype, the same file."""
    identity = repr(([(config.to_dict(), sorted(p.seeds.items())) for config, p in slots], device, dtype))
    return hashlib.sha256(identity.encode()).hexdigest()[:24] + ".pt"


def protocol(configs: Sequence[LabelledConfig], plans: Sequence[SeedPlan], **settings: Any) -> dict[str, Any]:
    """Everything needed to reproduce and judge the study, for the report's JSON."""
    device = torch.device(settings["device"])
    return {
        "command": shlex.join(["hfta-nas", *sys.argv[1:]])
        if sys.argv and "hfta-nas" in sys.argv[0]
        else shlex.join(sys.argv),
        **settings,
        "vary": list(settings["vary"]),
        "configs": {item.label: item.config.to_dict() for item in configs},
        "seeds_per_source": {s: sorted({p.seeds[s] for p in plans if s in p.seeds}) for s in SOURCES},
        "versions": {
            "hfta_nas": hfta_nas.__version__,
            "torch": torch.__version__,
            "optuna": optuna.__version__,
            "numpy": np.__version__,
            "scipy": scipy.__version__,
            "pandas": pd.__version__,
            "python": platform.python_version(),
        },
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "determinism": {
            "torch_threads": torch.get_num_threads(),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "note": "CPU runs with the same seeds, thread count and versions are bit-identical",
        },
    }


def _dataset(config: ResolvedConfig, cache: dict[str, Dataset], device: str, dtype: str) -> Dataset:
    key = repr((config.dataset, sorted(config.dataset_kwargs().items())))
    if key not in cache:
        cache[key] = load_dataset(config.dataset, **config.dataset_kwargs(), device=device, dtype=DTYPES[dtype])
    return cache[key]


def _n_test(datasets: dict[str, Dataset]) -> int | None:
    sizes = {len(d.y_test) for d in datasets.values()}
    return sizes.pop() if len(sizes) == 1 else None
