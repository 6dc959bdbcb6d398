"""A 32-seed study as one array against 32 separate plain PyTorch runs.

    python -m benchmarks.stability                 # the shipped default config, 32 seeds (a few minutes on 2 cores)
    python -m benchmarks.stability --quick         # 4 seeds, 1 epoch, 600 samples: checks the script, not timings
    python -m benchmarks.stability --device cuda --seeds 64

Both sides train the same configuration with the same per-source seeds:
- array: `hfta-nas stability`'s runner (one ModelArray, evaluation every epoch);
- plain: for each seed, `torch.manual_seed(init)` then the model, a DataLoader
  shuffled by a generator seeded with the data seed, `torch.manual_seed(dropout)`
  before training, torch.optim with the same hyper-parameters and the same
  per-epoch schedule, validation every epoch and test at the end: the loop a
  researcher writes for one seed, run 32 times.

Plain PyTorch draws dropout masks from the global RNG and the array from its
per-slot streams, so individual seeds differ where dropout is on; the claim
checked is equal *distributions* of the final test accuracy: means, standard
deviations, a Mann-Whitney U test and a Kolmogorov-Smirnov test are printed
beside the wall-time ratio. The torch thread count is fixed and printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats
from torch.utils.data import DataLoader, TensorDataset

from benchmarks._plain_parts import PlainEarlyStopping, plain_loss, plain_metric, plain_schedule, refuse_unlike
from hfta_nas.data import load_dataset
from hfta_nas.models import resolve_model
from hfta_nas.runtime import DTYPES
from hfta_nas.search_spaces import ResolvedConfig
from hfta_nas.stability import DEFAULT_CONFIG, LabelledConfig, load_config, plan, run_stability

_TORCH_OPTIMIZERS = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "rmsprop": torch.optim.RMSprop,
    "adagrad": torch.optim.Adagrad,
}


def plain_run(
    config: ResolvedConfig,
    data: Any,
    seeds: dict[str, int],
    device: torch.device,
    dtype: torch.dtype,
    on_epoch: Callable[[int, torch.nn.Module], dict[str, float] | None] | None = None,
    between_epochs: Callable[[], None] | None = None,
) -> float:
    """One seed the usual way; returns the final test accuracy (a regression's test RMSE).

    `on_epoch(epoch, model)` (epochs from 1), when given, replaces the per-epoch
    validation pass: the caller evaluates what it watches (benchmarks/search.py
    reports it to an Optuna trial) and returns those values by name. The config's early
    stopping then ends the loop as the engine's does, reading the value on_epoch returned
    where it has it. `between_epochs()` runs only when another epoch follows, and may end
    the run by raising (optuna.TrialPruned): the engine asks the pruner there too, never
    at a trial's last epoch or at the epoch it stops early, which complete the trial.
    """
    factory = resolve_model(
        config.model, config.model_config, input_shape=data.input_shape, num_classes=data.num_classes
    )
    refuse_unlike(config)
    watched = "rmse" if config.kind == "regression" else "acc"
    torch.manual_seed(seeds["init"])
    model = factory().to(device=device, dtype=dtype)
    hparams = dict(config.hparams)
    clip_value, clip_norm = hparams.pop("clip_value", None), hparams.pop("clip_norm", None)
    if "beta1" in hparams:
        hparams["betas"] = (hparams.pop("beta1"), hparams.pop("beta2"))
    optimizer = _TORCH_OPTIMIZERS[config.optimizer](model.parameters(), **hparams)
    schedule = plain_schedule(optimizer, config.schedule)
    loss = plain_loss(config.loss)
    loader = DataLoader(
        TensorDataset(data.x_train, data.y_train),
        batch_size=config.data["batch_size"],
        shuffle=True,
        generator=torch.Generator().manual_seed(seeds["data"]),
    )
    stopper = PlainEarlyStopping(**config.early_stopping) if config.early_stopping else None
    torch.manual_seed(seeds["dropout"])
    for epoch in range(1, config.epochs + 1):
        model.train()
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            loss(model(x), y).backward()
            if clip_value is not None:
                torch.nn.utils.clip_grad_value_(model.parameters(), clip_value)
            if clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            optimizer.step()
        if schedule is not None:
            schedule.step()
        seen = on_epoch(epoch, model) if on_epoch is not None else None
        if seen is None:  # a real loop watches validation every epoch
            seen = {f"val_{watched}": plain_metric(model, data, f"val_{watched}", config.loss)}
        if stopper is not None and stopper.stalled(seen, model, data, config.loss):
            break
        if between_epochs is not None and epoch < config.epochs:
            between_epochs()
    return plain_metric(model, data, f"test_{watched}", config.loss)


def run(config: ResolvedConfig, n_seeds: int, device: str, dtype: str) -> dict[str, Any]:
    if config.kind != "classification":
        raise SystemExit("benchmarks.stability compares test accuracies: give a classification config")
    torch_device, torch_dtype = torch.device(device), DTYPES[dtype]
    data = load_dataset(config.dataset, **config.dataset_kwargs(), device=torch_device, dtype=torch_dtype)
    plans = plan(n_seeds)

    started = time.perf_counter()
    result, _ = run_stability([LabelledConfig("array", config)], n_seeds=n_seeds, device=device, dtype=dtype)
    array_seconds = time.perf_counter() - started
    array_acc = result.seeds["test_acc"].to_numpy()

    started = time.perf_counter()
    plain_acc = np.array([plain_run(config, data, p.seeds, torch_device, torch_dtype) for p in plans])
    plain_seconds = time.perf_counter() - started

    return {
        "seeds": n_seeds,
        "epochs": config.epochs,
        "device": device,
        "dtype": dtype,
        "threads": torch.get_num_threads(),
        "array_seconds": array_seconds,
        "plain_seconds": plain_seconds,
        "speedup": plain_seconds / array_seconds,
        "array_acc": array_acc.tolist(),
        "plain_acc": plain_acc.tolist(),
        "array_mean": float(np.nanmean(array_acc)),
        "plain_mean": float(plain_acc.mean()),
        "array_std": float(np.nanstd(array_acc, ddof=1)),
        "plain_std": float(plain_acc.std(ddof=1)),
        "mannwhitney_p": float(stats.mannwhitneyu(array_acc, plain_acc).pvalue),
        "ks_p": float(stats.ks_2samp(array_acc, plain_acc).pvalue),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "config", nargs="?", default=str(DEFAULT_CONFIG), help="config file [default: the shipped mnist1d_cnn]"
    )
    parser.add_argument("--seeds", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (fixed for a fair comparison)")
    parser.add_argument("--quick", action="store_true", help="4 seeds, 1 epoch, 600 samples: checks the script")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = load_config(args.config)
    seeds = args.seeds
    if args.quick:
        seeds = min(seeds, 4)
        config = dataclasses.replace(
            config,
            epochs=1,
            data={**config.data, "num_samples": 600},
            schedule=config.schedule and {**config.schedule, "t_max": 1},
        )
    figures = run(config, seeds, args.device, args.dtype)
    print(
        f"{seeds} seeds x {figures['epochs']} epochs of {Path(args.config).name} on {args.device} "
        f"({figures['threads']} torch threads, {args.dtype})"
    )
    print(f"{'':>8} {'wall s':>8} {'mean acc':>9} {'std':>7}")
    for side in ("array", "plain"):
        print(
            f"{side:>8} {figures[side + '_seconds']:8.1f} "
            f"{100 * figures[side + '_mean']:8.2f}% {100 * figures[side + '_std']:6.2f}%"
        )
    print(
        f"plain / array wall time: {figures['speedup']:.2f}x; same distribution? "
        f"Mann-Whitney p={figures['mannwhitney_p']:.2f}, KS p={figures['ks_p']:.2f}"
    )
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if all(math.isfinite(v) for v in (figures["array_seconds"], figures["plain_seconds"])) else 1


if __name__ == "__main__":
    raise SystemExit(main())
