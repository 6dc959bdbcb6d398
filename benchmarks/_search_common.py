"""What every search method of benchmarks/search.py shares: the result record, the plain
objective, and the helpers the process-based methods start their workers with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import optuna
import torch
from optuna.trial import FrozenTrial

from benchmarks._plain_parts import plain_metric
from benchmarks.stability import plain_run
from hfta_nas.data import load_dataset
from hfta_nas.runtime import DTYPES
from hfta_nas.search import trial_seeds
from hfta_nas.search_spaces import SearchSpace

PROCESS_TIMEOUT_S = 1800.0


@dataclass
class SearchRun:
    """One method's search: its clock, and every trial as (seconds from the start to its end, state, value)."""

    seconds: float
    cpu_seconds: float  # this process's, or the worker processes' summed
    trials: list[FrozenTrial]
    start: datetime
    extra: dict[str, Any] = field(default_factory=dict)

    def finished(self) -> list[tuple[float, str, float | None]]:
        """(seconds after the start, state, value) per finished trial, in the order they finished."""
        rows = [
            ((t.datetime_complete - self.start).total_seconds(), t.state.name, t.values[0] if t.values else None)
            for t in self.trials
            if t.datetime_complete is not None
        ]
        return sorted(rows, key=lambda row: row[0])


def plain_objective(
    space: SearchSpace, device: str, dtype: str, datasets: dict[str, Any] | None = None
) -> Callable[[optuna.Trial], float]:
    """The objective plain Optuna users write for `space`: suggest, train, report every epoch.
    `datasets` caches the loaded data by its settings (pass one dict to share it)."""
    metric = space.study.metrics[0]
    torch_device, torch_dtype = torch.device(device), DTYPES[dtype]
    datasets = {} if datasets is None else datasets

    def objective(trial: optuna.Trial) -> float:
        config = space.resolve(space.suggest(trial))
        key = repr((config.dataset, sorted(config.dataset_kwargs().items())))
        if key not in datasets:
            datasets[key] = load_dataset(
                config.dataset, **config.dataset_kwargs(), device=torch_device, dtype=torch_dtype
            )
        data = datasets[key]
        last: list[float] = []

        def on_epoch(epoch: int, model: torch.nn.Module) -> dict[str, float]:
            value = plain_metric(model, data, metric, config.loss)
            last[:] = [value]
            trial.report(value, epoch)
            return {metric: value}

        def between_epochs() -> None:
            if trial.should_prune():
                raise optuna.TrialPruned()

        seeds = trial_seeds(space.seed, trial.number)
        plain_run(config, data, seeds, torch_device, torch_dtype, on_epoch=on_epoch, between_epochs=between_epochs)
        return last[0]  # NaN: Optuna fails the trial, as the search fails a non-finite metric

    return objective


def one_epoch(space: SearchSpace) -> SearchSpace:
    """`space` trained for one epoch: a warm-up's budget."""
    return space.model_copy(update={"training": space.training.model_copy(update={"epochs": 1})})


def barrier_wait(barrier: Any, children: list[Any]) -> None:
    """Wait with the workers; a worker that died before the barrier breaks it, which ends this wait."""
    try:
        barrier.wait(timeout=PROCESS_TIMEOUT_S)
    except Exception:  # BrokenBarrierError from a worker's abort, or the timeout
        for child in children:
            child.kill()
        raise RuntimeError("a worker process failed before the start (see its traceback above)") from None
