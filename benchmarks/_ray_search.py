"""The `ray` method of benchmarks/search.py: the same search run by Ray Tune, as a Ray user runs it.

- a local Ray started by the benchmark (`ray.init(num_cpus=P)`, no dashboard, no
  usage statistics, nothing beyond this machine), P = `--processes` (default:
  the cores available);
- `OptunaSearch` with the space's own sampler seeded with the search seed (TPE
  for the shipped spaces, with the space's settings) over the space's params,
  define-by-run through `space.suggest`, as `plain` asks them;
- `ASHAScheduler`: grace period 1 epoch, `max_t` = the space's epochs,
  reduction factor 2. The spaces' median pruner stops a trial below the median
  of the trials at the same epoch, i.e. keeps the better half at each step;
  ASHA with reduction factor 2 keeps the better half at each rung (epochs 1, 2,
  4, ...): the same "top half goes on" budget, checked at fewer epochs;
- P concurrent trials, `resources_per_trial={"cpu": 1}`, each running the very
  objective `plain` runs (`plain_objective`: `plain_run`'s PyTorch loop, same
  model, data, per-trial seeds `trial_seeds(space seed, trial number)`, the
  same torch thread count) behind an Optuna `FixedTrial` whose `report` is
  `ray.tune.report`. The trial number is the order OptunaSearch asked the
  trial in, as Optuna numbers trials. Data: MNIST-1D built in each worker
  (`load_dataset`, no download), cached per worker process; actors are reused
  between trials (`reuse_actors=True`), so a worker builds it once.

Clocks: Ray's start-up (`ray.init` until its P prestarted worker processes are
up) is measured and reported apart (`extra["startup_s"]`). The wall clock
starts when the tuner starts (`tuner.fit()`) and stops when it returns, so it
holds what Tune does before the first trial trains: its set-up, the trial
actors starting in the prestarted workers and there importing torch and this
project, building the data and paying first-use costs (`processes` pays these
before its clock starts; no supported way to warm the workers Tune's actors
then use was found: a worker that ran a warm-up task was not given to an
actor, and a `worker_process_setup_hook` stopped Ray prestarting workers).
`extra["first_trial_s"]` is when the first trial function began (after Tune's
set-up, the actor's start and its first imports: torch, Optuna, this module),
`extra["first_result_s"]` when the first epoch was reported (after the rest of
the imports, the data and one epoch): an upper bound on that fixed cost. A
trial ends when the driver learns it ended (a Tune callback); a trial ASHA
stopped before the last epoch is PRUNED, one that reported every epoch COMPLETE
with its last value, one that ended on a non-finite value FAIL; a trial that
raised fails the run, as it fails `plain`.
CPU seconds: the driver's plus each trial's own (not the actors' start-up, nor
Ray's GCS and raylet processes).

Where this differs from `plain`'s budget: ASHA is not the space's pruner (no
start-up trials or warm-up epochs: it may stop a trial at epoch 1), and
OptunaSearch tells the sampler a stopped trial as COMPLETE with its last value
(Optuna's pruned trials are PRUNED), so the sampler learns from partial values.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import optuna
import torch
from optuna.trial import FrozenTrial, TrialState

from benchmarks._search_common import SearchRun, plain_objective
from hfta_nas.search_spaces import SearchSpace

MISSING_RAY = "the `ray` method needs Ray Tune: pip install 'hfta-nas[bench]' (or 'ray[tune]')"
REDUCTION_FACTOR = 2  # ASHA keeps the better half at each rung, as the median pruner keeps the better half

_DATASETS: dict[str, Any] = {}  # per Ray worker process: the data, built once (actors are reused)
_RECORDS: dict[str, dict[str, Any]] = {}  # per run, in the driver: what the Tune callback saw


def ray_available() -> bool:
    try:
        import ray  # noqa: F401 - only whether it imports
        from ray import tune  # noqa: F401 - only whether it imports
    except ImportError:
        return False
    return True


def _import_ray() -> Any:
    try:
        import ray
        from ray import tune  # noqa: F401 - only whether it imports
    except ImportError:
        raise SystemExit(MISSING_RAY) from None
    return ray


class _ReportingTrial(optuna.trial.FixedTrial):
    """The Optuna trial the plain objective sees inside a Ray trial: fixed params, reports go to Tune."""

    def __init__(self, params: dict[str, Any], number: int, metric: str, entered: float) -> None:
        super().__init__(params, number)
        self._metric_name = metric
        self._cpu, self._entered = time.process_time(), entered

    def report(self, value: float, step: int) -> None:
        from ray import tune

        tune.report(
            {
                self._metric_name: value,
                "epoch": step,
                "pid": os.getpid(),
                "entered": self._entered,
                "cpu_s": time.process_time() - self._cpu,
            }
        )

    def should_prune(self) -> bool:
        return False  # ASHA decides, after each report


def _threads(threads: int) -> None:
    torch.set_num_threads(threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _trainable(config: dict[str, Any], space: SearchSpace, device: str, dtype: str, threads: int) -> None:
    entered = time.perf_counter()  # CLOCK_MONOTONIC: one clock for the driver and the workers

    _threads(threads)
    params = {name: value for name, value in config.items() if name != "trial_number"}
    trial = _ReportingTrial(params, config["trial_number"], space.study.metrics[0], entered)
    plain_objective(space, device, dtype, _DATASETS)(trial)


@dataclass
class LocalRay:
    """A local Ray cluster from `local_ray`: the key of its Tune callback (`_callback`, in `run_config`), its
    start-up seconds, and, after the block, what the callback saw of each trial."""

    key: str
    startup_s: float = math.nan
    trials: dict[str, dict[str, Any]] = field(default_factory=dict)

    def run_config(self, name: str, folder: Path) -> Any:
        """Tune's RunConfig of a run on this cluster: quiet, results under `folder`, seen by its callback."""
        from ray import tune

        return tune.RunConfig(name=name, storage_path=str(folder.resolve()), verbose=0, callbacks=[_callback(self.key)])


@contextlib.contextmanager
def local_ray(cpus: int) -> Iterator[LocalRay]:
    """A local Ray cluster of `cpus` workers with no network, its workers up before the block starts
    (their start-up is Ray's, not the run's); shut down after the block."""
    ray = _import_ray()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no network
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's new console output ignores verbose=0
    started = time.perf_counter()
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    cluster = LocalRay(uuid.uuid4().hex)
    _RECORDS[cluster.key] = {"trials": {}}
    try:
        _wait_for_idle_workers(cpus)
        cluster.startup_s = time.perf_counter() - started
        yield cluster
    finally:
        ray.shutdown()
        cluster.trials = _RECORDS.pop(cluster.key)["trials"]


def _wait_for_idle_workers(count: int, timeout: float = 20.0) -> None:
    """Wait until Ray's `count` prestarted workers are up (processes titled ray::IDLE under this one):
    Tune's trial actors start in them, so their start-up belongs to Ray's, not to the search's clock.
    After `timeout` the search starts anyway (a Ray that prestarts none: their start is then timed)."""
    deadline = time.perf_counter() + timeout
    while _idle_workers() < count and time.perf_counter() < deadline:
        time.sleep(0.05)


def _idle_workers() -> int:
    children: dict[int, list[int]] = {}
    titles: dict[int, bytes] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            titles[int(entry.name)] = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry.name))
    mine, stack = [], [os.getpid()]
    while stack:
        for child in children.get(stack.pop(), []):
            mine.append(child)
            stack.append(child)
    return sum(titles.get(pid, b"").startswith(b"ray::IDLE") for pid in mine)


class _DefineByRun:
    """OptunaSearch's space: `space.suggest` on the Optuna trial (the captured suggestions, as Optuna
    encodes them, become the Ray config) plus the trial's number for its seeds. A class: Tune pickles it."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space

    def __call__(self, trial: Any) -> dict[str, Any]:
        self.space.suggest(trial)
        return {"trial_number": trial.number}


def _callback(key: str) -> Any:
    from ray.tune import Callback

    class Record(Callback):
        """Per Ray trial, in the driver: its config, every result, and when and how it ended."""

        def _trial(self, trial: Any) -> dict[str, Any]:
            return _RECORDS[key]["trials"].setdefault(trial.trial_id, {"config": dict(trial.config), "results": []})

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            self._trial(trial)["results"].append({**result, "seen": time.perf_counter()})

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._trial(trial).update(ended=time.perf_counter(), error=False)

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._trial(trial).update(ended=time.perf_counter(), error=True)

    return Record()


def run_ray(space: SearchSpace, n_trials: int, device: str, dtype: str, folder: Path, processes: int) -> Any:

    ray = _import_ray()
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    metric, direction, epochs = space.study.metrics[0], space.directions[0], space.training.epochs
    threads = torch.get_num_threads()
    with local_ray(processes) as cluster:
        mode = "max" if direction == "maximize" else "min"
        searcher = OptunaSearch(
            _DefineByRun(space), metric=metric, mode=mode, sampler=space.make_sampler(seed=space.seed)
        )
        scheduler = ASHAScheduler(
            time_attr="training_iteration", max_t=epochs, grace_period=1, reduction_factor=REDUCTION_FACTOR
        )
        trainable = tune.with_resources(
            tune.with_parameters(_trainable, space=space, device=device, dtype=dtype, threads=threads), {"cpu": 1}
        )
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                metric=metric,
                mode=mode,
                search_alg=searcher,
                scheduler=scheduler,
                num_samples=n_trials,
                max_concurrent_trials=processes,
                reuse_actors=True,
            ),
            run_config=cluster.run_config("bench-ray", folder / "ray"),
        )
        start, wall, cpu = datetime.now(), time.perf_counter(), time.process_time()
        grid = tuner.fit()
        seconds, cpu = time.perf_counter() - wall, time.process_time() - cpu
    records = cluster.trials
    if grid.errors:  # an exception in the objective ends `plain`'s study.optimize too
        raise RuntimeError(f"a Ray trial failed: {grid.errors[0]}")
    trials = [_frozen(space, record, start, wall, epochs, metric) for record in records.values()]
    trials.sort(key=lambda t: t.number)
    pids = {r["results"][-1]["pid"] for r in records.values() if r["results"]}
    cpu += sum(r["results"][-1]["cpu_s"] for r in records.values() if r["results"])
    extra = {
        "startup_s": cluster.startup_s,
        "processes": processes,
        "reduction_factor": REDUCTION_FACTOR,
        "ray_version": ray.__version__,
        "worker_processes": len(pids),
        "first_trial_s": min(
            (r["results"][0]["entered"] - wall for r in records.values() if r["results"]), default=None
        ),
        "first_result_s": min((r["results"][0]["seen"] - wall for r in records.values() if r["results"]), default=None),
    }
    return SearchRun(seconds, cpu, trials, start, extra)


def _frozen(
    space: SearchSpace, record: dict[str, Any], start: datetime, wall: float, epochs: int, metric: str
) -> FrozenTrial:
    """One Ray trial as the FrozenTrial the other methods' studies hold."""
    config, results = record["config"], record["results"]
    values = {int(r["epoch"]): float(r[metric]) for r in results if metric in r}
    last = values[max(values)] if values else None
    if record.get("error") or (values and not math.isfinite(last)):
        state = TrialState.FAIL
    elif values and max(values) >= epochs:
        state = TrialState.COMPLETE
    elif "ended" in record:
        state = TrialState.PRUNED  # ASHA stopped it before the last epoch
    else:
        state = TrialState.RUNNING  # never ended (should not happen: fit() waits for every trial)
    ended = record.get("ended")
    params = {name: value for name, value in config.items() if name != "trial_number"}
    distributions = space.distributions()
    return FrozenTrial(
        number=int(config["trial_number"]),
        state=state,
        value=last if state == TrialState.COMPLETE else None,
        datetime_start=start,
        datetime_complete=None if ended is None else start + timedelta(seconds=ended - wall),
        params=params,
        distributions={name: distributions[name] for name in params},
        user_attrs={},
        system_attrs={},
        intermediate_values=values,
        trial_id=int(config["trial_number"]),
    )
