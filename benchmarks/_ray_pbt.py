"""The `ray_pbt` method of benchmarks/pbt.py: population-based training by Ray Tune, as its docs run it.

- a local Ray started by the benchmark, as benchmarks/_ray_search.py starts it
  (`ray.init(num_cpus=C)`, no dashboard, no usage statistics), C = the cores this
  process may use by default (the cores hfta-nas's PBT has; a population larger
  than C trains C members at a time, as Ray schedules it); Ray's start-up
  (`ray.init` until its C prestarted workers are up) is measured apart
  (`startup_s`), and so is the part of `tuner.fit()` before the first member's
  first epoch began (`actor_startup_s`: the actors' imports, data and model);
- `PopulationBasedTraining` with the space's `pbt:` settings: perturbation every
  `interval` training iterations (one iteration = one epoch), the same quantile
  fraction. Ray's own explore multiplies every param by one shared pair of
  `perturbation_factors` and does not clip; the space gives each explored
  hyper-parameter its own factors and range (lr 0.8 / 1.25, weight decay 0.5 /
  2.0), so the explore step is PBT's `custom_explore_fn` (Ray's documented hook,
  with no `hyperparam_mutations`): hfta-nas's rule, `Explore.new_value` (with
  the resample probability draw afresh from [min, max], log-uniformly where
  log; else multiply by one of the factors and clip), from a generator seeded
  with the search seed. Asynchronous PBT (Ray's default), or synchronous
  (`synch=True`: every member reaches the interval before any exploits, as
  hfta-nas's rounds do; the `ray_pbt_sync` method). Ray also perturbs at
  the last epoch (hfta-nas does not): a member exploited there loads the
  donor's final checkpoint and trains no further (its last value stays its own);
- the initial population is the space's sampler's first P asks (seeded with
  the search seed, as the other methods' first P trials are), passed to Tune
  as one grid over the member number;
- each member is the plain PyTorch loop of benchmarks/stability.py (`plain_run`:
  same model, optimizer, data order and seeds `trial_seeds(seed, member)`),
  split into epochs so it can stop and resume: it reports the metric every
  epoch and, every `interval` epochs, a checkpoint (model, optimizer, the data
  order's generator and torch's RNG state; `torch.save` into a temporary
  folder, `ray.tune.Checkpoint.from_directory`, as Ray's PBT guide does). A
  member started with `ray.tune.get_checkpoint()` loads it, then sets the
  optimizer's hyper-parameters to its (new) config, as the guide does.

Checkpoint timing, measured inside the trainable and summed over all members:
`save_s` (torch.save into the temporary folder), `load_s` (get_checkpoint ->
as_directory -> torch.load -> load_state_dict), and `persist_s`: Ray copies a
reported checkpoint into the run's storage inside `tune.report`, which also
waits for the driver to ask for the next result; `persist_s` is each report
that carried a checkpoint minus that member's median report without one
(floored at 0). The last report of each run of the trainable (its end, or the
pause before an exploit) never returns and is not counted. The restarts
themselves (Ray stopping a member and starting it again in a reused actor) are
not inside the trainable; they are in the wall time only. `exploits` counts the
lines of Ray's own exploit log (`pbt_global.txt`), `restores` the runs of the
trainable that loaded a checkpoint and then trained: after an exploit, or its own
checkpoint after Ray paused it (asynchronous PBT pauses a member that reaches a
perturbation while another member is paused or pending, so that one can run).
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from benchmarks._anytime import best_so_far
from benchmarks._plain_parts import plain_metric
from benchmarks._ray_search import _import_ray, _threads, local_ray
from benchmarks.stability import _TORCH_OPTIMIZERS
from hfta_nas import Explore
from hfta_nas.data import load_dataset
from hfta_nas.models import resolve_model
from hfta_nas.runtime import DTYPES
from hfta_nas.search import trial_seeds
from hfta_nas.search_spaces import ResolvedConfig, SearchSpace, pbt_options

CHECKPOINT_FILE = "member.pt"
OPTIMIZER = "training.optimizer."  # explored names are this prefix + the optimizer's hyper-parameter
_DATASETS: dict[str, Any] = {}  # per Ray worker process: the data, built once (actors are reused)


# ------------------------------------------------------------ one member
def _optimizer_hparams(config: ResolvedConfig) -> dict[str, Any]:
    """The optimizer's keyword arguments as `plain_run` builds them (clipping is not an optimizer's)."""
    hparams = {k: v for k, v in config.hparams.items() if k not in ("clip_value", "clip_norm")}
    if "beta1" in hparams:
        hparams["betas"] = (hparams.pop("beta1"), hparams.pop("beta2"))
    return hparams


class Member:
    """`plain_run`'s loop for one seed, split into epochs so that it can be saved and resumed."""

    def __init__(self, config: ResolvedConfig, data: Any, seeds: dict[str, int], device: str, dtype: str) -> None:
        if config.schedule is not None and (config.schedule["kind"] != "cosine" or config.schedule.get("warmup_steps")):
            raise SystemExit("the plain loop reproduces cosine (or no) schedules without warm-up only")
        self.config, self.data, self.epoch = config, data, 0
        factory = resolve_model(
            config.model, config.model_config, input_shape=data.input_shape, num_classes=data.num_classes
        )
        torch.manual_seed(seeds["init"])
        self.model = factory().to(device=torch.device(device), dtype=DTYPES[dtype])
        self.optimizer = _TORCH_OPTIMIZERS[config.optimizer](self.model.parameters(), **_optimizer_hparams(config))
        self.order = torch.Generator().manual_seed(seeds["data"])
        self.loader = DataLoader(
            TensorDataset(data.x_train, data.y_train),
            batch_size=config.data["batch_size"],
            shuffle=True,
            generator=self.order,
        )
        torch.manual_seed(seeds["dropout"])

    def set_hparams(self, config: ResolvedConfig) -> None:
        """Take `config`'s optimizer hyper-parameters (after an exploit: the explored values)."""
        self.config = config
        for group in self.optimizer.param_groups:
            group.update(_optimizer_hparams(config))

    def _lr(self) -> float:
        """This epoch's learning rate: the base lr, or cosine's closed form (CosineAnnealingLR stepped per epoch)."""
        base, schedule = self.config.hparams["lr"], self.config.schedule
        if schedule is None:
            return base
        t = min(self.epoch, schedule["t_max"])
        return schedule["eta_min"] + (base - schedule["eta_min"]) * (1 + math.cos(math.pi * t / schedule["t_max"])) / 2

    def train_epoch(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self._lr()
        clip_value, clip_norm = self.config.hparams.get("clip_value"), self.config.hparams.get("clip_norm")
        self.model.train()
        for x, y in self.loader:
            self.optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(self.model(x), y).backward()
            if clip_value is not None:
                torch.nn.utils.clip_grad_value_(self.model.parameters(), clip_value)
            if clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip_norm)
            self.optimizer.step()
        self.epoch += 1

    def state(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "order": self.order.get_state(),
            "rng": torch.get_rng_state(),
        }

    def load(self, state: dict[str, Any]) -> None:
        self.epoch = state["epoch"]
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.order.set_state(state["order"])
        torch.set_rng_state(state["rng"])


def member_config(space: SearchSpace, config: dict[str, Any], explored: list[str]) -> ResolvedConfig:
    """The candidate of a Ray config (Optuna-encoded searched params, explored hyper-parameters by path),
    resolved as the plain objective resolves it. `resolve` refuses a value off its param's range, which
    an explore range may leave: it gets the value clipped, the optimizer the explored one."""
    values = {}
    for path, param in space.searched.items():
        clip = path in explored and hasattr(param, "min")
        values[path] = min(max(config[path], param.min), param.max) if clip else config[path]
    with warnings.catch_warnings():  # FixedTrial warns about values off a step grid
        warnings.simplefilter("ignore")
        resolved = space.resolve(space.suggest(optuna.trial.FixedTrial(values, config["member"])))
    hparams = {**resolved.hparams, **{path.removeprefix(OPTIMIZER): config[path] for path in explored}}
    return dataclasses.replace(resolved, hparams=hparams)


def _data(config: ResolvedConfig, device: str, dtype: str) -> Any:
    key = repr((config.dataset, sorted(config.dataset_kwargs().items()), device, dtype))
    if key not in _DATASETS:
        _DATASETS[key] = load_dataset(
            config.dataset, **config.dataset_kwargs(), device=torch.device(device), dtype=DTYPES[dtype]
        )
    return _DATASETS[key]


# ------------------------------------------------------------ the trainable
def _restore(member: Member) -> float:
    """Load Ray's checkpoint into `member`, if Ray gave one; the seconds it took (0.0: none)."""
    from ray import tune

    started = time.perf_counter()
    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return 0.0
    with checkpoint.as_directory() as folder:
        member.load(torch.load(Path(folder) / CHECKPOINT_FILE))
    return time.perf_counter() - started


def _trainable(
    config: dict[str, Any],
    space: SearchSpace,
    explored: list[str],
    metric: str,
    interval: int,
    device: str,
    dtype: str,
    threads: int,
) -> None:
    from ray import tune

    _threads(threads)
    number = config["member"]
    resolved = member_config(space, config, explored)
    member = Member(resolved, _data(resolved, device, dtype), trial_seeds(space.seed, number), device, dtype)
    load_s = _restore(member)
    restored = load_s > 0.0
    member.set_hparams(resolved)  # after a restore: this config's (explored) values, not the donor's
    last_report = {"seconds": 0.0, "checkpoint": False}
    while member.epoch < resolved.epochs:
        started = time.perf_counter()
        member.train_epoch()
        value = plain_metric(member.model, member.data, metric, member.config.loss)
        metrics = {
            metric: value,
            "epoch": member.epoch,
            "member": number,
            "train_s": time.perf_counter() - started,  # training and evaluation
            "restored": restored,
            "load_s": load_s,
            "last_report_s": last_report["seconds"],
            "last_report_checkpoint": last_report["checkpoint"],
        }
        restored, load_s = False, 0.0
        reported = time.perf_counter()
        if member.epoch % interval == 0:
            with tempfile.TemporaryDirectory() as folder:
                torch.save(member.state(), Path(folder) / CHECKPOINT_FILE)
                metrics["save_s"] = time.perf_counter() - reported
                reported = time.perf_counter()
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
        else:
            tune.report({**metrics, "save_s": 0.0})
        last_report = {"seconds": time.perf_counter() - reported, "checkpoint": member.epoch % interval == 0}


# ------------------------------------------------------------ the driver
def initial_population(space: SearchSpace, population: int, explored: list[str]) -> list[dict[str, Any]]:
    """The first `population` asks of the space's sampler (seeded with the space's seed), as Optuna encodes
    them, plus any explored hyper-parameter the space does not search, at its fixed value."""
    study = optuna.create_study(directions=space.directions, sampler=space.make_sampler(seed=space.seed))
    members = []
    for number in range(population):
        trial = study.ask()
        hparams = space.resolve(space.suggest(trial)).hparams
        fixed = {path: hparams[path.removeprefix(OPTIMIZER)] for path in explored if path not in trial.params}
        members.append({"member": number, **trial.params, **fixed})
    return members


class _Initial:
    """`tune.sample_from`: member k's initial value of one param (a class: Tune pickles it)."""

    def __init__(self, population: list[dict[str, Any]], name: str) -> None:
        self.population, self.name = population, name

    def __call__(self, spec: Any) -> Any:
        return self.population[spec.config["member"]][self.name]


class _Explore:
    """PBT's custom_explore_fn: hfta-nas's explore rule (`Explore.new_value`) on each explored path."""

    def __init__(self, explore: dict[str, Explore], resample_probability: float, seed: int) -> None:
        self.explore, self.resample_probability = explore, resample_probability
        self.rng = np.random.default_rng(seed)

    def __call__(self, config: dict[str, Any]) -> dict[str, Any]:
        for path, how in self.explore.items():
            config[path] = how.new_value(config[path], self.rng, self.resample_probability)
        return config


def _scheduler(options: dict[str, Any], explore: dict[str, Explore], synch: bool) -> Any:
    from ray.tune.schedulers import PopulationBasedTraining

    return PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=options["interval"],
        quantile_fraction=options["quantile"],
        custom_explore_fn=_Explore(explore, options["resample_probability"], options["seed"]),
        synch=synch,
    )


def run_ray_pbt(
    space: SearchSpace, device: str, dtype: str, folder: Path, cpus: int | None = None, synch: bool = False
) -> dict[str, Any]:
    """Ray Tune's PBT of the plain loop with the settings of `space`'s pbt block (asynchronous, Ray's
    default, or `synch`), on `cpus` CPUs (None: the cores available); the run's figures."""
    ray = _import_ray()
    from ray import tune

    options = pbt_options(space)
    explore = {OPTIMIZER + name: how for name, how in options["explore"].items()}
    metric, direction, population = space.study.metrics[0], space.directions[0], options["population"]
    cpus = cpus or len(os.sched_getaffinity(0))
    with local_ray(cpus) as cluster:
        members = initial_population(space, population, list(explore))
        param_space = {"member": tune.grid_search(list(range(population)))}
        param_space.update({name: tune.sample_from(_Initial(members, name)) for name in members[0] if name != "member"})
        trainable = tune.with_resources(
            tune.with_parameters(
                _trainable,
                space=space,
                explored=list(explore),
                metric=metric,
                interval=options["interval"],
                device=device,
                dtype=dtype,
                threads=torch.get_num_threads(),
            ),
            {"cpu": 1},
        )
        tuner = tune.Tuner(
            trainable,
            param_space=param_space,
            tune_config=tune.TuneConfig(
                metric=metric,
                mode="max" if direction == "maximize" else "min",
                scheduler=_scheduler(options, explore, synch),
                num_samples=1,
                reuse_actors=True,
            ),
            run_config=cluster.run_config("bench-ray-pbt", folder / "ray-pbt"),
        )
        wall = time.perf_counter()
        grid = tuner.fit()
        seconds = time.perf_counter() - wall
    if grid.errors:
        raise RuntimeError(f"a Ray trial failed: {grid.errors[0]}")
    figures = _figures(cluster.trials, wall, metric, direction, space.training.epochs, options["interval"])
    log = folder / "ray-pbt" / "bench-ray-pbt" / "pbt_global.txt"  # Ray's PBT writes a line per exploit
    exploits = len(log.read_text().splitlines()) if log.exists() else 0
    return {
        "seconds": seconds,
        "startup_s": cluster.startup_s,
        "cpus": cpus,
        "synch": synch,
        "exploits": exploits,
        "ray_version": ray.__version__,
        **figures,
    }


def _figures(
    records: dict[str, Any], wall: float, metric: str, direction: str, epochs: int, interval: int
) -> dict[str, Any]:
    """Curve, final best, epochs trained and checkpoint seconds from what the Tune callback recorded."""
    results = sorted((r for record in records.values() for r in record["results"]), key=lambda r: r["seen"])
    # any member's value at any epoch end: a transient peak, neither kept nor exported (no statistic uses it)
    peak = best_so_far([(r["seen"] - wall, "COMPLETE", r[metric]) for r in results], direction)
    lasts = [record["results"][-1] for record in records.values() if record["results"]]
    finals = [last[metric] for last in lasts if last["epoch"] >= epochs]  # members that trained to the end
    pick = max if direction == "maximize" else min
    best = pick(finals) if finals else None
    ended = max((r["seen"] - wall for r in results), default=0.0)
    start: dict[int, dict[int, float]] = {}
    for r in results:
        if r["epoch"] <= interval:
            start.setdefault(r["member"], {})[r["epoch"]] = r[metric]
    return {
        "best_value": best,
        "start_values": start,
        # what a user keeps: the best member's final value, when the last member ended
        "curve": [[ended, best]] if best is not None else [],
        "peak_curve": [list(point) for point in peak],
        "first_result_s": results[0]["seen"] - wall if results else None,  # the actors' start, imports, data, 1 epoch
        # the actors' start before the first epoch began (imports, data, model): Ray's start-up inside fit()
        "actor_startup_s": results[0]["seen"] - wall - results[0]["train_s"] if results else None,
        "epochs_trained": len(results),
        "members": len(records),
        "restores": sum(bool(r["restored"]) for r in results),
        "train_s": sum(r["train_s"] for r in results),
        "checkpoint": _checkpoint_seconds(results),
    }


def _checkpoint_seconds(results: list[dict[str, Any]]) -> dict[str, float]:
    """Summed over members: saves, loads, and the reports that carried a checkpoint beyond a plain report."""
    persist = 0.0
    for member in {r["member"] for r in results}:
        reports = [r for r in results if r["member"] == member and r["epoch"] > 1 and not r["restored"]]
        plain = [r["last_report_s"] for r in reports if not r["last_report_checkpoint"]]
        baseline = statistics.median(plain) if plain else 0.0
        persist += sum(max(0.0, r["last_report_s"] - baseline) for r in reports if r["last_report_checkpoint"])
    save, load = sum(r["save_s"] for r in results), sum(r["load_s"] for r in results)
    return {"save_s": save, "load_s": load, "persist_s": persist, "total_s": save + load + persist}
