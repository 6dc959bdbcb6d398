"""The search loop: Optuna proposes, arrays train, every trial is told.

One round reads top to bottom (the fill policy):

1. Ask a pool of trials freely: the sampler chooses each one's architecture
   (every searched parameter that changes the shape signature) and its
   hyper-parameters. The pool holds at most `pool_size` trials (default: the
   array size B) and stops early once ceil(T / B) signatures wait, T being
   the trials the budget has left, so every shape asked can still get a full
   array. Group the pool by shape signature.
2. The fullest group (the earliest asked on ties) trains next; the other
   groups wait, RUNNING, for their own arrays, which come before any new pool.
3. Fill the free slots: enqueue trials with the group's architecture fixed
   and ask again, so the sampler chooses only their per-slot hyper-parameters.
   Every architecture the sampler proposes is trained as proposed, and arrays
   stay full (mean occupancy is reported: running slots / array size).
4. Train the array. Each epoch every slot reports its metric to its trial;
   a pruned or failed slot is told at once and, while other slots train on,
   refilled with a waiting trial of its shape, else a new trial of the same
   architecture (fresh optimizer state, schedule position and seeds) from
   budget the waiting shapes do not need, else the array is compacted.
5. A slot that finishes its epochs is told COMPLETE with its metric values.
   When all slots end together the array ends; the next round's pool is
   asked with their results in the study.

Pruners that compare with completed trials (median, percentile) see none in
the first array and prune from the second on; successive halving and
hyperband compare trials at each rung as they report, lockstep or not.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import os
import socket
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import torch
from optuna.trial import TrialState

import hfta_nas
from hfta_nas._array import ModelArray
from hfta_nas._autosize import auto_array_size
from hfta_nas._oom import ArrayOutOfMemory, check_budget, is_out_of_memory
from hfta_nas._trainer import ArrayTrainer, EpochReport
from hfta_nas.data import Dataset, load_dataset
from hfta_nas.errors import HftaNasError
from hfta_nas.models import count_parameters, resolve_model
from hfta_nas.optim import OPTIMIZERS, LRSchedule
from hfta_nas._files import atomic_write_text, save_weights
from hfta_nas.search._signature import shape_signature
from hfta_nas.search._heartbeat import WORKER_ATTR, WORKER_HOST_ATTR, Heartbeat, host_identity, stale_reason
from hfta_nas.search._storage import dashboard_command, open_storage, study_lock
from search_spaces import check_sources

log = logging.getLogger(__name__)
AUTO_CAP = 64  # the most models --array-size auto puts in one array

# Optimizer hyper-parameters and schedule settings differ per slot; every
# other searched parameter decides the architecture (the array's shape).
_PER_SLOT_PREFIXES = ("training.schedule.",)
_SHARED_OPTIMIZER_KEYS = ("training.optimizer.name", *(f"training.optimizer.{f}" for f in ("amsgrad", "maximize", "nesterov", "centered")))
INTERRUPTED = "interrupted: its worker stopped (killed, crashed or lost) while it ran; failed and retried"
STOPPED = "stopped: not trained, the search stopped on an error:"
RETRY_OF = "retry_of"  # user attribute of a retried trial: the number of the trial whose seeds it takes
SURPLUS = "surplus: an enqueued trial (a retry, or a request to fill an array) left over when the budget was full; never trained"
_NOT_COUNTED = ("interrupted:", "surplus:", "stopped:")  # fail_reason prefixes that do not count against the budget


def _as_worker(run: Callable[..., Any]) -> Callable[..., Any]:
    """Search.run as one worker of a study: the study lock ("count the budget, then
    ask" is atomic across workers) and the heartbeat live as long as the run."""

    @functools.wraps(run)
    def wrapper(self: "Search") -> Any:
        if getattr(self, "dry_run", False):  # a plan asks into an in-memory copy: no workers there
            return run(self)
        self._lock = study_lock(self.storage, self.dashboard_location, self.study_name)
        self._array_trials = {}
        with Heartbeat(self.study, self._held_trial_ids, self.worker) as self._heartbeat:
            try:
                return run(self)
            except HftaNasError as error:  # a user error (e.g. a factory of changing shapes): nothing stays RUNNING
                self._fail_held(f"{STOPPED} {error}")
                raise

    return wrapper


def _locked(method: Callable[..., Any]) -> Callable[..., Any]:
    """A Search method that checks the budget and asks, under the study lock."""

    @functools.wraps(method)
    def wrapper(self: "Search", *args: Any, **kwargs: Any) -> Any:
        with self._study_lock():
            return method(self, *args, **kwargs)

    return wrapper


@dataclass
class Candidate:
    """One asked trial, its sampled values, the config they resolve to, and its seeds."""

    trial: optuna.Trial
    values: dict[str, Any]
    config: Any
    seeds: dict[str, int]
    signature: str = ""
    filled: bool = False  # asked with its architecture fixed (to fill an array), not freely
    reported: set[int] = field(default_factory=set)  # epochs reported (a retry after out-of-memory repeats them)


@dataclass
class SearchSummary:
    """What a search did, for the table, `--json` and the caller."""

    study_name: str
    storage: str
    dashboard: str
    metrics: list[str]
    directions: list[str]
    trials: dict[str, int]  # state -> count, this study
    best: list[dict[str, Any]]  # best trial(s): number, values, params
    arrays: int
    mean_occupancy: float
    seconds: float
    exported: dict[str, str] = field(default_factory=dict)  # what -> path
    samples_per_s: float = 0.0  # training samples this run / its wall time, summed over slots


def trial_seeds(base_seed: int, trial_number: int) -> dict[str, int]:
    """Independent init / data / dropout seeds for a trial, from the space seed."""
    states = np.random.SeedSequence([base_seed, trial_number]).spawn(3)
    return {source: int(s.generate_state(1, dtype=np.uint32)[0]) for source, s in zip(("init", "data", "dropout"), states)}


class Search:
    """Runs a SearchSpace against an Optuna study; see the module docstring."""

    def __init__(
        self,
        space: Any,
        *,
        storage: str | None = None,
        study_name: str | None = None,
        n_trials: int | None = None,
        timeout: float | None = None,
        array_size: int | str | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        out_dir: str | Path | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        pool_size: int | None = None,
        dry_run: bool = False,
    ) -> None:
        self.space = space
        if pool_size is not None and (isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1):
            raise HftaNasError(f"pool size must be a positive integer, got {pool_size!r}.")
        self.pool_size = pool_size
        self.dry_run = dry_run
        self.n_trials = n_trials if n_trials is not None else space.budget.n_trials
        self.timeout = timeout if timeout is not None else space.budget.timeout
        for name, value in (("n_trials", self.n_trials), ("timeout", self.timeout)):
            if value is not None and (not isinstance(value, (int, float)) or value <= 0):
                raise HftaNasError(f"{name} must be a positive number, got {value!r}.")
        size = array_size if array_size is not None else space.array.size
        if size != "auto" and (not isinstance(size, int) or size < 1):
            raise HftaNasError(f"array size must be a positive integer or 'auto', got {size!r}.")
        self.array_size = size
        self.device, self.dtype = device, hfta_nas._run.DTYPES[dtype]
        self.metrics = list(space.study.metrics)
        self.directions = list(space.study.directions)
        self.study_name = study_name or space.study.name or Path(space.source).stem
        self.out_dir = Path(out_dir) if out_dir is not None else Path("runs") / self.study_name
        self.on_event = self._enriched(on_event or (lambda kind, info: None))
        check_sources(space)  # a missing factory or data file fails here, before any trial is asked
        if dry_run:  # an in-memory copy of the study: asks there never reach the real storage
            from hfta_nas.search._plan import in_memory_copy

            self.storage, self.dashboard_location = in_memory_copy(storage, self.study_name)
        else:
            self.storage, self.dashboard_location = open_storage(storage)
        self.study = optuna.create_study(
            storage=self.storage, study_name=self.study_name, directions=self.directions,
            sampler=space.make_sampler(seed=space.seed), pruner=space.make_pruner(), load_if_exists=True,
        )
        if list(self.study.directions) != [optuna.study.StudyDirection[d.upper()] for d in self.directions]:
            raise HftaNasError(f"study '{self.study_name}' exists in the storage with other directions; choose another --study-name.")
        with warnings.catch_warnings():  # set_metric_names is "experimental" in Optuna, and stable in use
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self.study.set_metric_names(self.metrics)
        self.study.set_user_attr("space_source", str(space.source))
        self.study.set_user_attr("space_text", space.text)
        self.study.set_user_attr("versions", {"hfta_nas": hfta_nas.__version__, "torch": torch.__version__, "optuna": optuna.__version__})
        self.study.set_user_attr("sampler", space.sampler.name)
        self.study.set_user_attr("pruner", space.pruner.name)
        self.study.set_user_attr("seed", space.seed)
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self._datasets: dict[str, Dataset] = {}
        self._auto: dict[str, int] = {}  # signature -> the size --array-size auto chose
        self._max_slots: dict[str, int] = {}  # signature -> array size that fits, after an out-of-memory split
        self._pending: dict[str, list[Candidate]] = defaultdict(list)
        self._asked = 0
        self._arrays = 0
        self._occupancy: list[float] = []  # running slots / array width, per epoch
        self._fill: list[float] = []  # running slots / array size (array.size or auto's choice), per epoch
        self._target = 0  # the array size of the array being trained
        self._n_train = 0  # its training samples per slot and epoch
        self._samples = 0  # training samples processed this run, summed over slots
        self._exported: dict[str, str] = {}
        self._best_first_metric = self._current_best()

    # ------------------------------------------------------------------ events
    def _enriched(self, on_event: Callable[[str, dict[str, Any]], None]) -> Callable[[str, dict[str, Any]], None]:
        """`on_event` with the search-wide figures a progress display shows added to
        the events: per epoch the array's occupancy, the mean so far, and the
        training throughput of this run (samples/s summed over slots)."""

        def emit(kind: str, info: dict[str, Any]) -> None:
            info = dict(info)
            if kind == "epoch":
                running = int(info.get("running", 0))
                self._fill.append(running / self._target if self._target else 0.0)
                self._samples += running * self._n_train
                elapsed = time.monotonic() - self._started
                info.update(array_size=self._target, occupancy=self._fill[-1], mean_occupancy=self._mean_fill(),
                            samples=self._samples, samples_per_s=self._samples / max(elapsed, 1e-9))
            elif kind == "array":
                info.setdefault("array_size", self._target)
            on_event(kind, info)

        return emit

    def _mean_fill(self) -> float:
        """Mean array occupancy: running slots / array size, over every epoch of every array."""
        return float(np.mean(self._fill)) if self._fill else 0.0

    def _best_trials(self) -> list[optuna.trial.FrozenTrial]:
        """The best trial (single objective) or the Pareto front; [] before any COMPLETE trial."""
        if not self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            return []
        return list(self.study.best_trials) if len(self.metrics) > 1 else [self.study.best_trial]

    # ------------------------------------------------------------------ budget
    def _finished(self) -> int:
        """Ended trials that count against the budget: all but interrupted retries and surplus."""
        return self._counted((TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))

    def _counted(self, states: tuple[TrialState, ...] = (TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED,
                                                          TrialState.FAIL)) -> int:
        """Trials in the storage that take a place in the budget, whichever worker asked
        them: RUNNING and ended ones, less interrupted retries and surplus (see _NOT_COUNTED)."""
        trials = self.study.get_trials(deepcopy=False, states=states)
        return sum(1 for t in trials if not str(t.user_attrs.get("fail_reason", "")).startswith(_NOT_COUNTED))

    def _remaining(self) -> int:
        if self.n_trials is None:  # a timeout-only budget
            return sys.maxsize
        return self.n_trials - self._counted()  # across workers: read from the storage, under the study lock

    def _time_left(self) -> bool:
        return self.timeout is None or time.monotonic() - self._started < self.timeout

    # --------------------------------------------------------------------- run
    @_as_worker
    def run(self) -> SearchSummary:
        if self.dry_run:
            raise HftaNasError("this Search was made with dry_run=True: call plan(), not run()")
        self._started = time.monotonic()
        self._retry_interrupted_trials()
        self._finished_at_start = self._finished()
        states: dict[str, int] = defaultdict(int)
        for trial in self.study.get_trials(deepcopy=False):
            states[trial.state.name] += 1
        self.on_event("start", {"study": self.study_name, "storage": self.dashboard_location,
                                "dashboard": dashboard_command(self.dashboard_location), "done": self._finished_at_start,
                                "n_trials": self.n_trials, "timeout": self.timeout, "states": dict(states),
                                "metrics": self.metrics, "directions": self.directions, "best": self._best_first_metric,
                                "best_values": [list(t.values) for t in self._best_trials()]})
        while self._time_left():
            with self._study_lock():
                self._retry_interrupted_trials()
                group = self._next_group()
            if not group and self._wait_for_other_workers():
                continue
            if not group:
                break
            self._train_group(group)
            self.on_event("array_done", {"array": self._arrays, "mean_occupancy": self._mean_fill()})
        for candidates in self._pending.values():  # asked but never trained (time ran out)
            for candidate in candidates:
                self._tell_fail(candidate, "not trained: the search's timeout ran out before its array started")
        self._discard_surplus_waiting()
        return self._summary()

    def plan(self, max_arrays: int | None = None) -> Any:
        """The arrays this search would train, by its fill policy, without training
        (`hfta-nas search --dry-run`); needs `dry_run=True`. See `hfta_nas.search._plan`."""
        from hfta_nas.search._plan import make_plan

        if not self.dry_run:
            raise HftaNasError("plan() asks trials: make the Search with dry_run=True so they go to an in-memory copy")
        return make_plan(self, max_arrays)

    def _retry_interrupted_trials(self) -> int:
        """RUNNING trials whose worker is gone (see _heartbeat: stale heartbeat, or a
        dead process on this machine) are failed, never left RUNNING, and their
        parameters enqueued so the budget still gets them trained; the live trials
        of other workers are left alone. Returns how many were retried."""
        held, now, retried = set(self._held_trial_ids()), time.time(), 0
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            why = None if trial._trial_id in held else stale_reason(trial, now=now, me=self.worker)
            if why is None:
                continue
            try:
                self.study._storage.set_trial_user_attr(trial._trial_id, "fail_reason", INTERRUPTED)
                self.study._storage.set_trial_user_attr(trial._trial_id, "interrupted_because", why)
                self.study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # told meanwhile, by its worker or by another that retried it first
            # the retry trains with the interrupted trial's seeds (its first one's, for a retry of a retry)
            original = trial.user_attrs.get(RETRY_OF, trial.number)
            self.study.enqueue_trial(trial.params or trial.system_attrs.get("fixed_params", {}),
                                     user_attrs={RETRY_OF: original}, skip_if_exists=False)
            self.on_event("retry", {"trial": trial.number, "why": why})
            retried += 1
        return retried

    def _wait_for_other_workers(self) -> bool:
        """The budget is taken but other workers' trials still run: wait, retrying any
        that go stale. True when there is work again; False when none is RUNNING."""
        while self._time_left():
            if not self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                return False
            with self._study_lock():
                if self._retry_interrupted_trials() or self._remaining() > 0:
                    return True
            time.sleep(min(self._heartbeat.interval, 2.0))
        return False

    def _discard_surplus_waiting(self) -> None:
        """With the budget full, enqueued retries nobody will ask are told FAIL (SURPLUS,
        not counted) so the study ends with no WAITING trial."""
        with self._study_lock():
            if self._remaining() > 0 or not self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                return
            for _ in self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                trial = self.study.ask()
                trial.set_user_attr("fail_reason", SURPLUS)
                self.study.tell(trial, state=TrialState.FAIL)

    def _fail_held(self, reason: str) -> None:
        """Tell FAIL every trial this worker holds that is still RUNNING (the array's and the waiting ones)."""
        held = list(getattr(self, "_array_trials", {}).values()) + [c for g in self._pending.values() for c in g]
        for candidate in held:
            if self.study._storage.get_trial(candidate.trial._trial_id).state == TrialState.RUNNING:
                self._tell_fail(candidate, reason)
        self._pending.clear()

    def _held_trial_ids(self) -> list[int]:
        """Trials this worker holds: the array training now and the candidates waiting for theirs."""
        held = [c.trial._trial_id for c in list(getattr(self, "_array_trials", {}).values())]
        return held + [c.trial._trial_id for group in list(self._pending.values()) for c in list(group)]

    def _study_lock(self) -> Any:
        return getattr(self, "_lock", None) or contextlib.nullcontext()

    # -------------------------------------------------------------- candidates
    def _ask(self, fixed: dict[str, Any] | None = None) -> Candidate:
        if fixed is not None:
            self.study.enqueue_trial(fixed, skip_if_exists=False)
        trial = self.study.ask()
        # whose it is, from the ask on: a worker killed before its first heartbeat (asking, loading data)
        # leaves trials that the next run on this machine retries at once, not after the no-heartbeat grace
        trial.set_user_attr(WORKER_ATTR, self.worker)
        trial.set_user_attr(WORKER_HOST_ATTR, host_identity())
        self._asked += 1
        values = self.space.suggest(trial)
        config = self.space.resolve(values)
        seeds = trial_seeds(self.space.seed, trial.user_attrs.get(RETRY_OF, trial.number))
        candidate = Candidate(trial, values, config, seeds, filled=fixed is not None)
        data = self._dataset(config)
        factory = resolve_model(config.model, config.model_config, input_shape=data.input_shape, num_classes=data.num_classes)
        candidate.signature = shape_signature(config, factory)
        return candidate

    def _architecture(self, candidate: Candidate) -> dict[str, Any]:
        """The trial's parameters that fix its array (shape signature)."""
        return {
            name: value for name, value in candidate.trial.params.items()
            if not (name.startswith("training.optimizer.") and name not in _SHARED_OPTIMIZER_KEYS)
            and not name.startswith(_PER_SLOT_PREFIXES)
        }

    def _size_for(self, remaining: int) -> int:
        # 'auto': up to AUTO_CAP here (pools, before any shape is known); each shape's own
        # size is chosen by _auto_size when its array is formed.
        return min(remaining, AUTO_CAP if self.array_size == "auto" else self.array_size)

    def _ask_pool(self) -> None:
        """Ask a pool of free candidates (the sampler picks everything) into `_pending`.

        At most `pool_size` asks (default: the array size), and no more shapes
        than the budget can give full arrays: with T trials left (waiting ones
        included) and arrays of B, asking stops once ceil(T / B) signatures wait.
        """
        left = self.pool_size or self._size_for(self._remaining())
        size = self._size_for(self._remaining())
        while left > 0 and self._remaining() > 0:
            waiting = sum(len(g) for g in self._pending.values())
            if len(self._pending) >= math.ceil((waiting + self._remaining()) / size):
                break
            candidate = self._ask()
            self._pending[candidate.signature].append(candidate)
            left -= 1

    def _spare(self, signature: str) -> int:
        """Budget left once the waiting groups of other shapes are filled to full arrays."""
        needed = sum(max(0, self._target - len(g)) for s, g in self._pending.items() if s != signature)
        return self._remaining() - needed

    def _next_group(self) -> list[Candidate]:
        """The candidates of the next array (the fill policy, see the module docstring).

        Waiting candidates go first; with none waiting, a pool of free asks is
        grouped by signature. The fullest group (the earliest asked on ties)
        trains next; the others wait for their own arrays; the free slots are
        filled with the group's architecture and fresh hyper-parameters.
        """
        if not self._pending and self._remaining() > 0:
            self._ask_pool()
        if not self._pending:
            return []
        signature = max(self._pending, key=lambda s: len(self._pending[s]))
        group = self._pending.pop(signature)
        size = min(self._size_for(len(group) + self._remaining()), self._max_slots.get(signature, sys.maxsize))
        if self.array_size == "auto":
            size = min(size, self._auto_size(group[0]))
        self._target = size if self.array_size == "auto" or signature in self._max_slots else self.array_size
        self._n_train = len(self._dataset(group[0].config).y_train)
        while len(group) < size and self._remaining() > 0 and self._time_left():
            candidate = self._ask(self._architecture(group[0]))
            if candidate.signature == group[0].signature:
                group.append(candidate)
            else:  # e.g. a retried trial of another architecture: it waits for its own array
                self._pending[candidate.signature].append(candidate)
        extra = group[size:]
        if extra:
            self._pending[group[0].signature].extend(extra)
        return group[:size]

    def _auto_size(self, candidate: Candidate) -> int:
        """`--array-size auto` for this candidate's shape: memory limit and throughput knee
        (hfta_nas._autosize), measured once per signature."""
        if candidate.signature not in self._auto:
            config = candidate.config
            data = self._dataset(config)
            factory = resolve_model(config.model, config.model_config, input_shape=data.input_shape,
                                    num_classes=data.num_classes)
            with torch.random.fork_rng(devices=[]):  # the probe must not move the global RNG
                chosen = auto_array_size(factory, data.input_shape, data.num_classes,
                                         batch_size=config.data.get("batch_size", 100), dtype=self.dtype,
                                         optimizer=config.optimizer, device=self.device, cap=AUTO_CAP)
            self._auto[candidate.signature] = chosen.size
            self.on_event("auto_size", {"signature": candidate.signature, "size": chosen.size, "reason": chosen.reason,
                                        "throughput": chosen.throughput})
            self.study.set_user_attr(f"auto_array_size:{candidate.signature}",
                                     {"size": chosen.size, "reason": chosen.reason})
        return self._auto[candidate.signature]

    def _dataset(self, config: Any) -> Dataset:
        kwargs = config.dataset_kwargs()
        key = repr((str(config.dataset), sorted(kwargs.items())))
        if key not in self._datasets:
            self._datasets[key] = load_dataset(config.dataset, **kwargs, device=self.device, dtype=self.dtype)
        return self._datasets[key]

    # ----------------------------------------------------------------- training
    def _fits(self, group: list[Candidate], factory: Callable[[], Any], data: Dataset) -> list[Candidate]:
        """The leading part of `group` that fits the memory budget (see hfta_nas._oom),
        halving as the budget demands; the rest waits (RUNNING) for its own arrays,
        and later arrays of this shape are no larger. A candidate that does not fit
        even alone is told FAIL with the reason."""
        first = group[0].config
        while True:
            try:
                check_budget(factory, data.input_shape, batch_size=first.data.get("batch_size", 100), slots=len(group),
                             dtype=self.dtype, optimizer=first.optimizer, device=torch.device(self.device))
                return group
            except ArrayOutOfMemory as error:
                if len(group) == 1:
                    self._tell_fail(group[0], f"out of memory even alone: {error}")
                    return []
                group = self._split(group, str(error))

    def _split(self, group: list[Candidate], reason: str) -> list[Candidate]:
        """The first half of `group`; the second half goes back to wait, first in line."""
        half = (len(group) + 1) // 2
        signature = group[0].signature
        self._max_slots[signature] = half
        self._pending[signature][:0] = group[half:]
        log.warning("array of %d models out of memory (%s); training %d now, the rest in later arrays",
                    len(group), reason, half)
        self.on_event("split", {"size": len(group), "half": half, "reason": reason})
        return group[:half]

    def _train_group(self, group: list[Candidate]) -> None:
        first = group[0].config
        data = self._dataset(first)
        factory = resolve_model(first.model, first.model_config, input_shape=data.input_shape, num_classes=data.num_classes)
        group = self._fits(group, factory, data)
        if not group:
            return
        self._arrays += 1
        array_id = f"{self.worker}/{self._arrays}"
        capacity = len(group)
        by_number = {c.trial.number: c for c in group}
        self._array_trials = by_number  # what the heartbeat stamps, with the waiting candidates
        started = {c.trial.number: time.monotonic() for c in group}
        static = self._static_metrics(factory, data)
        array = ModelArray.from_factory(factory, [c.seeds["init"] for c in group],
                                        dropout_seeds=[c.seeds["dropout"] for c in group], device=self.device, dtype=self.dtype)
        optimizer = OPTIMIZERS[first.optimizer](array, **_per_slot_hparams(first.optimizer, [c.config for c in group]))
        schedule = _per_slot_schedule(optimizer, [c.config for c in group])
        trainer = ArrayTrainer(array, optimizer, data, batch_size=first.data.get("batch_size", 100), schedule=schedule,
                               data_seeds=[c.seeds["data"] for c in group], slot_ids=list(by_number))
        for position, candidate in enumerate(group):
            self._set_attrs(candidate, array_id=array_id, slot=position, signature=candidate.signature, worker=self.worker,
                            seed_init=candidate.seeds["init"], seed_data=candidate.seeds["data"], seed_dropout=candidate.seeds["dropout"])
        if getattr(self, "_heartbeat", None) is not None:
            self._heartbeat.beat()  # at once: a kill before the first epoch ends is then seen at once too
        self.on_event("array", {"array": self._arrays, "size": capacity, "trials": list(by_number), "signature": group[0].signature})

        def on_epoch(report: EpochReport, trainer: ArrayTrainer) -> None:
            self._occupancy.append(len(report.metrics) / capacity)
            for number, metrics in report.metrics.items():
                candidate = by_number[number]
                result = trainer.results[number]
                wall = time.monotonic() - started[number]
                self._set_attrs(candidate, epochs_run=result.epochs, wall_time_s=round(wall, 3), heartbeat=time.time(),
                                samples_per_s=round(result.epochs * len(data.y_train) / max(wall, 1e-9), 1))
                if number in report.failed:
                    self._tell_fail(candidate, report.failed[number])
                    self._refill_or_stop(trainer, candidate, by_number, started, "failed")
                    continue
                values = [metrics[m] if m in metrics else static[m] for m in self.metrics]
                if len(self.metrics) == 1 and result.epochs not in candidate.reported:
                    candidate.trial.report(values[0], result.epochs)
                    candidate.reported.add(result.epochs)
                if result.status == "completed":
                    self._tell_complete(candidate, values, trainer)
                    self._refill_or_stop(trainer, candidate, by_number, started, "completed")
                elif len(self.metrics) == 1 and candidate.trial.should_prune():
                    self.study.tell(candidate.trial, state=TrialState.PRUNED)
                    self.on_event("trial", {"trial": number, "state": "PRUNED", "epoch": result.epochs})
                    self._refill_or_stop(trainer, candidate, by_number, started, "pruned")
            self.on_event("epoch", {"array": self._arrays, "epoch": report.epoch, "running": len(report.metrics),
                                    "finished": self._finished_at_start + self._asked - len(trainer.slot_ids)})

        try:
            trainer.fit(first.epochs, on_epoch=on_epoch)
        except HftaNasError:
            raise
        except (RuntimeError, torch.OutOfMemoryError, MemoryError) as error:
            if is_out_of_memory(error) and len(trainer.slot_ids) > 1:
                self._retry_smaller(trainer, by_number, group[0].signature, error)
                return
            for number in list(trainer.slot_ids):
                candidate = by_number[number]
                if self.study._storage.get_trial(candidate.trial._trial_id).state == TrialState.RUNNING:
                    self._tell_fail(candidate, f"array {array_id} failed: {type(error).__name__}: {error}")
            self.on_event("array_failed", {"array": self._arrays, "error": str(error)})

    @_locked
    def _retry_smaller(self, trainer: ArrayTrainer, by_number: dict[int, Candidate], signature: str,
                       error: BaseException) -> None:
        """An array that ran out of memory while training (CUDA): its trials still
        running go back to wait, first in line, and train again from their start in
        arrays of half the size from now on. They stay the same trials (RUNNING,
        same seeds); epochs they report again are the values already reported
        (a slot trains alike in any array), which Optuna keeps."""
        running = [by_number[n] for n in trainer.slot_ids
                   if self.study._storage.get_trial(by_number[n].trial._trial_id).state == TrialState.RUNNING]
        half = max(1, (len(running) + 1) // 2)
        self._max_slots[signature] = min(half, self._max_slots.get(signature, half))
        log.warning("array of %d models out of memory while training (%s: %s); retrying them in arrays of %d",
                    len(running), type(error).__name__, error, self._max_slots[signature])
        self.on_event("split", {"size": len(running), "half": self._max_slots[signature], "reason": str(error)})
        for candidate in running:
            candidate.trial.set_user_attr("out_of_memory", f"{type(error).__name__}: {error}")
        self._pending[signature][:0] = running

    @_locked
    def _refill_or_stop(self, trainer: ArrayTrainer, ended: Candidate, by_number, started, why: str) -> None:
        """Refill the slot of a trial that ended, or let the array shrink.

        Only while other slots train on (an array whose slots all end together
        ends, and the next round asks the sampler afresh). A candidate already
        asked for this shape goes first; a new one (same architecture, fresh
        hyper-parameters) only replaces a pruned or failed slot, and only from
        budget that the other waiting shapes do not need to fill their arrays.
        Completed slots are never refilled with new asks, so an array ends.
        """
        number = ended.trial.number
        others = any(trainer.results[s].status == "running" for s in trainer.slot_ids if s != number)
        waiting = self._pending.get(ended.signature) if others else None
        ask = others and why != "completed" and self._spare(ended.signature) > 0 and self._time_left()
        if waiting or ask:
            # a candidate already asked for this shape first (it is RUNNING and waits), else a new one
            candidate = waiting.pop(0) if waiting else self._ask(self._architecture(ended))
            if ended.signature in self._pending and not self._pending[ended.signature]:
                del self._pending[ended.signature]
            if candidate.signature == ended.signature:
                position = trainer.position_of(number)
                data = self._dataset(candidate.config)
                factory = resolve_model(candidate.config.model, candidate.config.model_config,
                                        input_shape=data.input_shape, num_classes=data.num_classes)
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(candidate.seeds["init"])
                    model = factory()
                trainer.replace(number, candidate.trial.number, model, data_seed=candidate.seeds["data"],
                                dropout_seed=candidate.seeds["dropout"], hparams=_slot_hparams(candidate.config),
                                schedule_params=_slot_schedule(candidate.config) if trainer.schedule is not None else None)
                by_number[candidate.trial.number] = candidate
                started[candidate.trial.number] = time.monotonic()
                self._set_attrs(candidate, array_id=f"{self.worker}/{self._arrays}", slot=position, signature=candidate.signature,
                                worker=self.worker, refilled_after=number, seed_init=candidate.seeds["init"],
                                seed_data=candidate.seeds["data"], seed_dropout=candidate.seeds["dropout"])
                self.on_event("refill", {"slot": position, "old": number, "new": candidate.trial.number, "why": why})
                return
            self._pending[candidate.signature].append(candidate)
        if why != "completed":
            trainer.stop([number], reason=why)

    # ------------------------------------------------------------------ telling
    def _set_attrs(self, candidate: Candidate, **attrs: Any) -> None:
        for key, value in attrs.items():
            candidate.trial.set_user_attr(key, value)

    def _tell_fail(self, candidate: Candidate, reason: str) -> None:
        candidate.trial.set_user_attr("fail_reason", reason)
        self.study.tell(candidate.trial, state=TrialState.FAIL)
        self.on_event("trial", {"trial": candidate.trial.number, "state": "FAIL", "reason": reason})

    def _tell_complete(self, candidate: Candidate, values: list[float], trainer: ArrayTrainer) -> None:
        if not all(math.isfinite(v) for v in values):
            self._tell_fail(candidate, f"non-finite metric values {values}")
            return
        self.study.tell(candidate.trial, values if len(values) > 1 else values[0])
        self.on_event("trial", {"trial": candidate.trial.number, "state": "COMPLETE", "values": values})
        if self._improves(values[0]):
            self._best_first_metric = values[0]
            position = trainer.position_of(candidate.trial.number)
            self.out_dir.mkdir(parents=True, exist_ok=True)
            weights = self.out_dir / "best_weights.pt"
            config_path = self.out_dir / "best_config.yaml"
            save_weights(trainer.array.slot_state_dict(position), weights)
            atomic_write_text(config_path, candidate.config.to_yaml(
                seeds=candidate.seeds, trial=candidate.trial.number, study=self.study_name, values=dict(zip(self.metrics, values))))
            self._exported = {"config": str(config_path), "weights": str(weights)}

    def _improves(self, value: float) -> bool:
        """Whether a trial just told COMPLETE beats every trial in the storage, other
        workers' included (they export to the same files)."""
        best = self._best_first_metric
        if best is not None and not (value > best if self.directions[0] == "maximize" else value < best):
            return False
        stored = self._current_best()  # this trial included: it improves when it is the best there
        return stored is None or value == stored

    def _current_best(self) -> float | None:
        done = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if not done:
            return None
        pick = max if self.directions[0] == "maximize" else min
        return pick(t.values[0] for t in done)

    def _static_metrics(self, factory: Callable[[], torch.nn.Module], data: Dataset) -> dict[str, float]:
        """Metrics that do not depend on training: parameter count and latency."""
        static: dict[str, float] = {}
        if "params" in self.metrics or "latency_ms" in self.metrics:
            with torch.random.fork_rng(devices=[]):
                model = factory().to(device=self.device, dtype=self.dtype).eval()
            static["params"] = float(count_parameters(model))
            if "latency_ms" in self.metrics:
                static["latency_ms"] = _latency_ms(model, data)
        return static

    # ------------------------------------------------------------------ summary
    def _summary(self) -> SearchSummary:
        trials = self.study.get_trials(deepcopy=False)
        counts: dict[str, int] = defaultdict(int)
        for trial in trials:
            counts[trial.state.name] += 1
        best = []
        if counts.get("COMPLETE"):
            chosen = self.study.best_trials if len(self.metrics) > 1 else [self.study.best_trial]
            best = [{"number": t.number, "values": dict(zip(self.metrics, t.values)), "params": t.params,
                     "seeds": {s: t.user_attrs.get(f"seed_{s}") for s in ("init", "data", "dropout")}} for t in chosen]
        summary = SearchSummary(
            self.study_name, self.dashboard_location, dashboard_command(self.dashboard_location), self.metrics,
            self.directions, dict(counts), best, self._arrays,
            self._mean_fill(), time.monotonic() - self._started,
            dict(self._exported), self._samples / max(time.monotonic() - self._started, 1e-9),
        )
        return summary


def _slot_hparams(config: Any) -> dict[str, float]:
    hparams = config.slot_hparams()
    if "betas" in hparams:
        hparams["beta1"], hparams["beta2"] = hparams.pop("betas")
    return hparams


def _per_slot_hparams(optimizer: str, configs: list[Any]) -> dict[str, Any]:
    """Per-slot lists of every hyper-parameter any slot sets (defaults fill the rest)."""
    cls = OPTIMIZERS[optimizer]
    per_slot = [_slot_hparams(c) for c in configs]
    names = sorted({name for hp in per_slot for name in hp})
    result: dict[str, Any] = {name: [hp.get(name, cls.defaults.get(name)) for hp in per_slot] for name in names}
    result.update({flag: bool(configs[0].hparams.get(flag, default)) for flag, default in cls.flags.items()})
    return result


def _slot_schedule(config: Any) -> dict[str, Any]:
    schedule = dict(config.schedule or {"kind": "constant"})
    return schedule


def _per_slot_schedule(optimizer: Any, configs: list[Any]) -> LRSchedule | None:
    """One LRSchedule with each slot's kind and arguments; None when no slot schedules."""
    if not any(c.schedule for c in configs):
        return None
    schedules = [_slot_schedule(c) for c in configs]
    names = sorted({k for s in schedules for k in s if k != "kind"})
    defaults = inspect.signature(LRSchedule).parameters
    args = {name: [s.get(name, defaults[name].default) for s in schedules] for name in names}
    return LRSchedule(optimizer, [s["kind"] for s in schedules], **args)


def _latency_ms(model: torch.nn.Module, data: Dataset, repeats: int = 20) -> float:
    """Median inference time of one model on one sample, in milliseconds."""
    x = data.x_val[:1]
    with torch.no_grad():
        for _ in range(3):
            model(x)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - start)
    return float(np.median(times) * 1000)
