"""One search space and budget run two ways: plain Optuna, one trial at a time, and `run_search`.

    python -m benchmarks.search                    # search_spaces/mnist1d_cnn.yaml, its own budget (16 trials x 5 epochs)
    python -m benchmarks.search --quick            # 4 trials, 2 epochs, 1000 samples: checks the script, not timings
    python -m benchmarks.search --n-trials 32 --device cuda --out search.json

Both sides get the same space, sampler (`space.make_sampler(seed=space.seed)`),
pruner, budget, per-trial seeds (`hfta_nas.search.trial_seeds`) and torch
thread count:

- plain: `optuna.create_study` (in memory) and `study.optimize`, one trial at
  a time; the objective is `space.suggest(trial)` -> `space.resolve(values)`,
  then the plain PyTorch loop of benchmarks/stability.py (`plain_run`: the
  model from `resolve_model`'s factory, torch.optim of the same name and
  hyper-parameters, a DataLoader shuffled by a generator seeded with the
  trial's data seed, the same epochs, batch size and cosine schedule),
  reporting the study's metric every epoch with `trial.report` / `should_prune`;
- search: `hfta_nas.search.run_search(space, storage=<journal file in a temp
  folder>)`, arrays of `array.size` trained together.

The search runs first, so first-use costs (kernels, caches) fall on it; the
datasets are loaded once before either is timed, and each side loads its own
copy inside its timing.

The two studies sample alike only until results come in (the search asks a
pool of trials before any is told, and fills arrays with the architecture
fixed), so their trials differ; quality is compared on the best value and the
mean / median final value over completed trials, printed beside the
wall-time ratio (plain / search: above 1 the search is faster). Because the
pruner acts differently on the two sides (the search's first array has no
completed trial to compare with), the trained trial-epochs differ too; the
wall time per trained epoch and the process CPU time (steadier than wall time
on a shared machine) are printed as well. Trials with the same number and
parameters on both sides (the first few) are the same run done two ways:
their per-epoch values are compared, a check of the plain loop.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import torch
from optuna.trial import TrialState
from torch.nn import functional as F

import hfta_nas
from hfta_nas._run import DTYPES
from hfta_nas.data import load_dataset
from hfta_nas.search import open_storage, trial_seeds
from search_spaces import SearchSpace, load_space, run_search
from benchmarks.stability import _accuracy, plain_run

DEFAULT_SPACE = Path(__file__).resolve().parents[1] / "search_spaces" / "mnist1d_cnn.yaml"
PLAIN_METRICS = ("val_acc", "val_loss", "test_acc", "test_loss")  # what the plain loop evaluates per epoch
QUICK = {"n_trials": 4, "epochs": 2, "num_samples": 1000}
STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")


# ---------------------------------------------------------------- the space
def quick_space(space: SearchSpace) -> SearchSpace:
    """The space with QUICK's epochs and data size (a cosine t_max set in the file is kept)."""
    epochs = min(space.training.epochs, QUICK["epochs"])
    num_samples = min(space.data.num_samples or QUICK["num_samples"], QUICK["num_samples"])
    return space.model_copy(update={"training": space.training.model_copy(update={"epochs": epochs}),
                                    "data": space.data.model_copy(update={"num_samples": num_samples})})


def check_space(space: SearchSpace) -> str:
    """The study's one metric, or SystemExit when the plain side cannot reproduce the space."""
    if len(space.study.metrics) != 1:
        raise SystemExit(f"{space.source}: the benchmark compares single-objective searches; this one has "
                         f"metrics {list(space.study.metrics)}")
    metric = space.study.metrics[0]
    if metric not in PLAIN_METRICS:
        raise SystemExit(f"{space.source}: the plain loop reports one of {', '.join(PLAIN_METRICS)} per epoch, "
                         f"not {metric!r}")
    return metric


# ---------------------------------------------------------------- plain side
def _metric(model: torch.nn.Module, data: Any, metric: str) -> float:
    split, kind = metric.split("_")
    x, y = getattr(data, f"x_{split}"), getattr(data, f"y_{split}")
    if kind == "acc":
        return _accuracy(model, x, y)
    with torch.no_grad():
        model.eval()
        return F.cross_entropy(model(x), y).item()


def run_plain(space: SearchSpace, n_trials: int, device: str, dtype: str) -> tuple[optuna.Study, dict[str, float]]:
    """Plain Optuna, one trial at a time; (the study, its `_Clock` times)."""
    metric = check_space(space)
    torch_device, torch_dtype = torch.device(device), DTYPES[dtype]
    datasets: dict[str, Any] = {}

    def objective(trial: optuna.Trial) -> float:
        config = space.resolve(space.suggest(trial))
        key = repr((config.dataset, sorted(config.dataset_kwargs().items())))
        if key not in datasets:
            datasets[key] = load_dataset(config.dataset, **config.dataset_kwargs(), device=torch_device, dtype=torch_dtype)
        data = datasets[key]
        last: list[float] = []

        def on_epoch(epoch: int, model: torch.nn.Module) -> None:
            value = _metric(model, data, metric)
            last[:] = [value]
            trial.report(value, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()

        plain_run(config, data, trial_seeds(space.seed, trial.number), torch_device, torch_dtype, on_epoch=on_epoch)
        return last[0]  # NaN: Optuna fails the trial, as the search fails a non-finite metric

    clock = _Clock()
    study = optuna.create_study(directions=space.directions, sampler=space.make_sampler(seed=space.seed),
                                pruner=space.make_pruner())
    study.optimize(objective, n_trials=n_trials, timeout=space.budget.timeout)
    return study, clock.read()


# ---------------------------------------------------------------- search side
def run_hfta(space: SearchSpace, n_trials: int, device: str, dtype: str, folder: Path) -> tuple[optuna.Study, dict[str, float], Any]:
    """`run_search` with a journal file in `folder`; (the study, its `_Clock` times, its summary)."""
    storage = str(folder / "search.journal")
    clock = _Clock()
    summary = run_search(space, storage=storage, study_name="bench-search", n_trials=n_trials, device=device,
                         dtype=dtype, out_dir=folder / "out")
    times = clock.read()
    return optuna.load_study(study_name=summary.study_name, storage=open_storage(storage)[0]), times, summary


# ----------------------------------------------------------------- figures
class _Clock:
    """Wall time, and this process's CPU time (user + system, all its threads): with
    one torch thread on a shared machine the CPU time is the steadier figure."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> dict[str, float]:
        return {"seconds": time.perf_counter() - self.wall, "cpu_seconds": time.process_time() - self.cpu}


def study_figures(study: optuna.Study, times: dict[str, float], direction: str) -> dict[str, Any]:
    trials = study.get_trials(deepcopy=False)
    states = {state: sum(1 for t in trials if t.state.name == state) for state in STATES}
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.values and math.isfinite(t.values[0])]
    values = [t.values[0] for t in done]
    epochs = sum(len(t.intermediate_values) for t in trials)  # trial-epochs trained (pruned trials stop early)
    best = (max if direction == "maximize" else min)(done, key=lambda t: t.values[0]) if done else None
    return {
        **times,
        "trials": states,
        "epochs_trained": epochs,
        "seconds_per_epoch": times["seconds"] / epochs if epochs else None,
        "best_value": best.values[0] if best else None,
        "best_trial": best.number if best else None,
        "best_params": dict(best.params) if best else None,
        "mean_final": statistics.fmean(values) if values else None,
        "median_final": statistics.median(values) if values else None,
        "final_values": values,
    }


def same_trials(plain: optuna.Study, search: optuna.Study) -> list[dict[str, Any]]:
    """Trials of equal number and parameters on both sides (so equal seeds too): the same
    training run done two ways, a check of the plain loop. Usually the first few."""
    by_number = {t.number: t for t in search.get_trials(deepcopy=False)}
    pairs = []
    for trial in plain.get_trials(deepcopy=False):
        other = by_number.get(trial.number)
        if other is not None and other.params == trial.params:
            pairs.append({"number": trial.number, "plain": trial.state.name, "search": other.state.name,
                          "plain_values": dict(trial.intermediate_values), "search_values": dict(other.intermediate_values)})
    return pairs


def run(space: SearchSpace, n_trials: int, device: str, dtype: str) -> dict[str, Any]:
    metric = check_space(space)
    direction = space.directions[0]
    # Load (or build and cache) every dataset once before timing, so neither side pays a first download.
    split = space.data.model_dump(exclude={"dataset", "batch_size"})
    load_dataset(space.data.dataset, **split, device=torch.device(device), dtype=DTYPES[dtype])
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-search-") as folder:
        search_study, search_times, summary = run_hfta(space, n_trials, device, dtype, Path(folder))
        search = study_figures(search_study, search_times, direction)  # read while its journal exists
        plain_study, plain_times = run_plain(space, n_trials, device, dtype)
        same = same_trials(plain_study, search_study)
    search.update(arrays=len(summary.arrays), mean_occupancy=summary.mean_occupancy,
                  architectures_trained=summary.architectures_trained,
                  architectures_proposed=summary.architectures_proposed)
    plain = study_figures(plain_study, plain_times, direction)
    return {
        "space": str(space.source), "metric": metric, "direction": direction, "n_trials": n_trials,
        "epochs": space.training.epochs, "array_size": space.array.size, "sampler": space.sampler.name,
        "pruner": space.pruner.name, "seed": space.seed, "device": device, "dtype": dtype,
        "threads": torch.get_num_threads(),
        "methods": {"plain": plain, "search": search},
        "ratio": plain["seconds"] / search["seconds"],
        "ratio_cpu": plain["cpu_seconds"] / search["cpu_seconds"],
        "ratio_per_epoch": (plain["seconds_per_epoch"] / search["seconds_per_epoch"]
                            if plain["seconds_per_epoch"] and search["seconds_per_epoch"] else None),
        "same_trials": same,
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "optuna": optuna.__version__,
                     "numpy": np.__version__, "hfta_nas": hfta_nas.__version__},
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                    "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor(),
                    "load_average_before": list(load_before), "load_average_after": list(os.getloadavg())},
    }


def _number(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.2f}%" if metric.endswith("_acc") else f"{value:.4f}"


def print_table(figures: dict[str, Any], quick: bool) -> None:
    metric = figures["metric"]
    print(f"{Path(figures['space']).name}: {figures['n_trials']} trials x {figures['epochs']} epochs, "
          f"{figures['sampler']} + {figures['pruner']} pruner, seed {figures['seed']}, arrays of "
          f"{figures['array_size']}, on {figures['device']} ({figures['threads']} torch threads, {figures['dtype']})"
          + (" [quick: checks the script, not timings]" if quick else ""))
    print(f"{'':>7} {'wall s':>8} {'cpu s':>7} {'complete':>8} {'pruned':>6} {'failed':>6} {'epochs':>6} {'s/epoch':>7} "
          f"{'best ' + metric:>14} {'mean final':>10} {'median final':>12}")
    for side in ("plain", "search"):
        f = figures["methods"][side]
        per_epoch = f"{f['seconds_per_epoch']:7.3f}" if f["seconds_per_epoch"] else f"{'-':>7}"
        print(f"{side:>7} {f['seconds']:8.1f} {f['cpu_seconds']:7.1f} {f['trials']['COMPLETE']:8d} {f['trials']['PRUNED']:6d} "
              f"{f['trials']['FAIL']:6d} {f['epochs_trained']:6d} {per_epoch} {_number(f['best_value'], metric):>14} "
              f"{_number(f['mean_final'], metric):>10} {_number(f['median_final'], metric):>12}")
    search = figures["methods"]["search"]
    per_epoch = f"{figures['ratio_per_epoch']:.2f}x" if figures["ratio_per_epoch"] else "-"
    print(f"plain / search wall time: {figures['ratio']:.2f}x; CPU time: {figures['ratio_cpu']:.2f}x; "
          f"wall time per trained epoch: {per_epoch} "
          f"({search['arrays']} arrays, mean occupancy {search['mean_occupancy']:.2f})")
    same = figures["same_trials"]
    if same:
        gaps = [abs(pair["plain_values"][step] - pair["search_values"][step]) for pair in same
                for step in pair["plain_values"] if step in pair["search_values"]]
        print(f"same number and parameters on both sides (same seeds): trials {[p['number'] for p in same]}; "
              f"their per-epoch {metric} differ by at most {_number(max(gaps, default=0.0), metric)}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--space", type=Path, default=DEFAULT_SPACE, help="search space file")
    parser.add_argument("--n-trials", type=int, default=None, help="trials per side; None: the space's budget")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (fixed for a fair comparison)")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK['n_trials']} trials, {QUICK['epochs']} epochs, {QUICK['num_samples']} samples: checks the script")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads < 1 or (args.n_trials is not None and args.n_trials < 1):
        print("error: --threads and --n-trials must be positive", file=sys.stderr)
        return 2
    if not (args.device == "cpu" or args.device.startswith("cuda")):
        print(f"error: --device must be cpu or cuda, got {args.device!r}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(args.space)
    if space.seed is None:  # both sides need the same sampler seed and per-trial seeds
        space = space.with_overrides(seed=0)
    n_trials = args.n_trials or space.budget.n_trials
    if args.quick:
        space, n_trials = quick_space(space), min(n_trials or QUICK["n_trials"], QUICK["n_trials"])
    if n_trials is None:
        print(f"error: {args.space} has no n_trials budget; give --n-trials", file=sys.stderr)
        return 2
    figures = run(space, n_trials, args.device, args.dtype)
    figures["quick"] = args.quick
    print_table(figures, args.quick)
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if all(math.isfinite(f["seconds"]) for f in figures["methods"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
