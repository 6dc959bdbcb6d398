"""`optimize(study, build, data)`: an Optuna search whose trials train as fused arrays.

The loop, one round at a time:

1. Under the study lock: retry trials dead workers left RUNNING, then ask a
   pool of trials (the array size, less those already waiting). The sampler
   chooses every trial's architecture and hyper-parameters; `build(trial)`
   turns each into a Candidate.
2. Pack the pool into arrays (`_packing`: structures never mix; the cut
   that minimises the estimated time on this device's measured step cost).
3. Train the arrays one after another (`_array_job`); a freed slot is
   refilled with a newly asked trial whose model fits the array, and a trial
   that does not fit waits for the next round.

With `replicate=[param names]` a round is instead one array: the first trial
asked freely, the other slots asked with those params copied from it (HPO over
a fixed architecture, the policy of hfta-nas 0.1).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from hfta_nas._limits import MAX_ARRAY_SIZE, MAX_TRIALS
from hfta_nas._time_account import TimeAccount
from hfta_nas.data import Dataset
from hfta_nas.envelope._probe import padding_fraction
from hfta_nas.errors import HftaNasError
from hfta_nas.search._array_job import STATIC_METRICS, ArrayJob, FreedSlot, JobContext, Request, TrainApart
from hfta_nas.search._candidate import (
    Candidate,
    Proposal,
    as_candidate,
    built,
    check_split_has_data,
    meta_shell,
    trial_seeds,
)
from hfta_nas.search._cost import StepCost, StepCostCache, StepCurve, cost_from_dict, device_name, measure_step_cost
from hfta_nas.search._events import ArrayEnded, ArraySizeChosen, SearchStarted, TrialWaits
from hfta_nas.search._export import BestExport
from hfta_nas.search._heartbeat import WORKER_ATTR, WORKER_HOST_ATTR, Heartbeat, host_identity
from hfta_nas.search._ledger import RETRY_OF, Ledger, Outcome, counts
from hfta_nas.search._optuna_private import optimize_loop, random_startup, stop_requested, storage_of, trial_id
from hfta_nas.search._packing import (
    Group,
    Pack,
    architecture_key,
    cost_key,
    pack_groups,
    shape_key,
    structure_groups,
    structure_key,
)
from hfta_nas.search._patience import StorageUnreachable
from hfta_nas.search._recovery import (
    interrupt_held,
    interrupts_deferred,
    retry_stale_trials,
    told_despite_interrupts,
    wait_for_other_workers,
)
from hfta_nas.search._resume import Claim, claim, prune
from hfta_nas.search._shape_checks import ShapeChecks
from hfta_nas.search._storage import checkpoint_folder, dashboard_command, storage_location, study_lock
from hfta_nas.training._autosize import free_memory, memory_limit
from hfta_nas.training._checkpoint import enabled as checkpoints_enabled
from hfta_nas.training._objectives import as_objective
from hfta_nas.training._run import DTYPES, _checked_device

AUTO_CAP = 64  # the most models array_size="auto" puts in one array
AUTO_POOL = 16  # the most trials a round asks when the array size is "auto" (see auto_pool)
log = logging.getLogger(__name__)
TARGET_OCCUPANCY = 0.7  # a round asks more trials until one of its arrays fills this share of its slots
POOL_ARRAYS = 2  # at most this many array sizes of trials asked and not yet training


@dataclass
class SearchSummary:
    """What a search did, for the table, `--json` and the caller."""

    study_name: str
    storage: str
    dashboard: str
    metrics: list[str]
    directions: list[str]
    trials: dict[str, int]  # state -> count, this study
    best: list[dict[str, Any]]  # best trial (or the Pareto front): number, values, params, seeds
    arrays: list[dict[str, Any]]  # per array: trials, slots, architectures, multiply-adds, waste, seconds
    mean_occupancy: float  # running slots / array size, over every epoch of every array of this run
    architectures_proposed: int  # distinct models (shapes) the sampler proposed in this run
    architectures_trained: int  # ... and of those, how many trained
    seconds: float
    samples_per_s: float  # training samples this run / its wall time, summed over slots
    exported: dict[str, str] = field(default_factory=dict)  # what -> path
    # phase -> {"seconds", "share"} of this run's wall time (hfta_nas._time_account.PHASES, "other", "overhead")
    time_account: dict[str, dict[str, float]] = field(default_factory=dict)
    # trial number -> why it trained in an array of its own (its array's check refused its place there)
    trained_apart: dict[int, str] = field(default_factory=dict)
    unsaved_best: str | None = None  # why `exported` is not the study's best trial's (its weights were never written)

    @property
    def waste(self) -> float:
        """Padding's share of the multiply-adds this run's arrays executed."""
        return padding_fraction(
            sum(a["useful_macs"] for a in self.arrays), sum(a["executed_macs"] for a in self.arrays)
        )


def optimize(
    study: optuna.Study,
    build: Callable[[optuna.Trial], Candidate],
    data: Dataset | None = None,
    *,
    n_trials: int | None = None,
    timeout: float | None = None,
    array_size: int | str = "auto",
    metrics: Sequence[str] | None = None,
    seed: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
    out_dir: str | Path | None = None,
    on_event: Callable[[Any], None] | None = None,
    max_waste: float | None = None,
    replicate: Sequence[str] | None = None,
    step_cost: StepCost | StepCurve | None = None,
    callbacks: Sequence[Callable[[optuna.Study, optuna.trial.FrozenTrial], None]] | None = None,
    constraints: Callable[[dict[str, float]], Mapping[str, float]] | None = None,
) -> SearchSummary:
    """Search with `study`'s sampler and pruner, training `build(trial)`'s candidates as arrays.

    - n_trials / timeout: the budget (trials in the study, across workers; seconds of this run).
    - array_size: slots per array, or "auto" [default] (per structure: the knee of its measured step curve,
      bounded by memory and a third of n_trials).
    - metrics: what each objective is: val_acc, val_loss, train_loss, test_acc, test_loss, params,
      latency_ms or a name in Candidate.metrics [default: val_acc; the study's metric names if set].
    - seed: the trials' init / data / dropout seeds derive from (seed, trial number).
    - max_waste: at most this fraction of an array's multiply-adds may be padding
      [default: no bound, the measured cost decides]; 0 packs only equal shapes.
    - replicate: fill each array with copies of its first trial's values of these params.
    - step_cost: a fixed cost model (a StepCost line, or a StepCurve a search measured: `plan().step_costs`
      through `cost_from_dict`) instead of measuring one, to repeat a packing exactly.
    - callbacks: Optuna callbacks, called as `study.optimize` calls them: `callback(study, frozen_trial)`
      after each trial this run told COMPLETE, PRUNED or FAIL (optuna-integration's MLflowCallback, say);
      `study.stop()` inside one stops asking new trials, and the arrays in flight finish.
    - constraints: outcome constraints, `constraints(metrics) -> {name: value}` (feasible when every value
      is <= 0), called with a completed trial's final metrics (every metric its last epoch measured, its
      objectives and `params`, its parameter count; also its user attribute `final_metrics`); each value
      is set with `trial.set_constraint` before the trial is told, so constraint-aware samplers (TPE,
      NSGA-II, GP) see it, as Optuna 5 asks an objective to do. A `constraints` with a `metrics`
      attribute naming `latency_ms` has it measured for every trial, as for an objective (a space
      file's `constraints:` block builds one).
    """
    return _Search(
        study,
        build,
        data,
        n_trials=n_trials,
        timeout=timeout,
        array_size=array_size,
        metrics=metrics,
        seed=seed,
        device=device,
        dtype=dtype,
        out_dir=out_dir,
        on_event=on_event,
        max_waste=max_waste,
        replicate=replicate,
        step_cost=step_cost,
        callbacks=callbacks,
        constraints=constraints,
    ).run()


def auto_pool(budget_cap: int) -> int:
    """Trials a round asks when the array size is "auto": a positive $HFTA_NAS_ASK_POOL
    (benchmarks/ask_batch.py compares pool sizes with it), else AUTO_POOL but no more than
    `budget_cap`, the third of the budget an array may take. A pool of the whole budget would
    sample every trial before any result (TPE then draws them all at random) and start them
    together, so that the pruner, which compares with completed trials only, prunes none."""
    setting = os.environ.get("HFTA_NAS_ASK_POOL", "").strip()
    return int(setting) if setting.isdigit() and int(setting) > 0 else min(AUTO_POOL, budget_cap)


def check_options(n_trials: Any, timeout: Any, array_size: Any, max_waste: Any) -> None:
    """HftaNasError naming the first bad budget or array option."""
    for name, value in (("n_trials", n_trials), ("timeout", timeout)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0
        ):
            raise HftaNasError(f"{name} must be a positive number, got {value!r}.")
    if n_trials is not None and n_trials > MAX_TRIALS:
        raise HftaNasError(f"n_trials must be at most {MAX_TRIALS:,} (a study keeps every trial), got {n_trials!r}.")
    if array_size != "auto" and (isinstance(array_size, bool) or not isinstance(array_size, int) or array_size < 1):
        raise HftaNasError(f"array size must be a positive integer or 'auto', got {array_size!r}.")
    if array_size != "auto" and array_size > MAX_ARRAY_SIZE:
        raise HftaNasError(
            f"array size must be at most {MAX_ARRAY_SIZE} (throughput stops rising long before), got {array_size!r}."
        )
    if max_waste is not None and not (isinstance(max_waste, (int, float)) and 0 <= max_waste <= 1):
        raise HftaNasError(f"max_waste must be a fraction in [0, 1], got {max_waste!r}.")


class _Search:
    """One worker's run of `optimize`; see the module docstring."""

    def __init__(
        self,
        study: optuna.Study,
        build: Callable[[optuna.Trial], Candidate],
        data: Dataset | None,
        *,
        n_trials,
        timeout,
        array_size,
        metrics,
        seed,
        device,
        dtype,
        out_dir,
        on_event,
        max_waste,
        replicate,
        step_cost,
        callbacks=None,
        constraints=None,
    ) -> None:
        check_options(n_trials, timeout, array_size, max_waste)
        if callbacks is not None and not all(callable(c) for c in callbacks):
            raise HftaNasError("callbacks must be callables taking (study, frozen_trial), as study.optimize's.")
        if constraints is not None and not callable(constraints):
            raise HftaNasError("constraints must be a function of a trial's final metrics returning {name: value}.")
        self.constraints = constraints
        if dtype not in DTYPES:
            raise HftaNasError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}.")
        self.study, self.build, self.data = study, build, data
        self.n_trials, self.timeout, self.array_size = n_trials, timeout, array_size
        self.metrics = list(metrics or study.metric_names or ["val_acc"])
        self.directions = [d.name.lower() for d in study.directions]
        if len(self.metrics) != len(self.directions):
            raise HftaNasError(
                f"the study has {len(self.directions)} objective(s) but {len(self.metrics)} metric(s) "
                f"were given ({', '.join(self.metrics)})."
            )
        self.seed, self.device, self.dtype = seed, _checked_device(device), DTYPES[dtype]
        self.max_waste, self.replicate, self.fixed_cost = max_waste, list(replicate or []), step_cost
        self.emit = on_event or (lambda event: None)
        self.location = storage_location(storage_of(study))
        lock = study_lock(storage_of(study), self.location, study.study_name)
        self.ledger = Ledger(study, n_trials, lock, callbacks or ())
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self.pool_size = array_size if isinstance(array_size, int) else auto_pool(self._budget_cap())
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.waiting: list[Proposal] = []  # asked, RUNNING, waiting for an array (first in line first)
        self.asked: dict[int, optuna.Trial] = {}  # trial id -> every trial this run asked (held until told)
        self.proposed: set[str] = set()  # shape keys of the candidates asked this run
        self.trained_apart: dict[int, str] = {}  # trial number -> why its array refused it (SearchSummary)
        self.trained: set[str] = set()  # ... and of those that trained
        self.costs: dict[str, StepCost | StepCurve] = {}
        self.sizes: dict[str, int] = {}  # structure -> array size (auto, or halved after out of memory)
        self.curves: dict[str, StepCurve] = {}  # structure -> its measured step curve
        self.arrays: list[dict[str, Any]] = []
        self.account = TimeAccount()  # where this run's wall time goes (the summary's time_account)
        self.shape_checks = ShapeChecks()  # per-architecture checks and multiply-adds, done once each
        self.cost_cache = StepCostCache()  # measured step costs kept on disk between searches
        # how many trials the sampler draws at random before its draws follow results (a trial-seeded
        # sampler's trials each draw with a sampler of its kind)
        self.startup = random_startup(getattr(study.sampler, "kind", study.sampler))

    # ------------------------------------------------------------------ the loop
    def run(self) -> SearchSummary:
        self.started = time.monotonic()
        self.account = TimeAccount()
        self.ctx = JobContext(
            self.study.study_name,
            self.ledger,
            self.metrics,
            self.worker,
            self.device,
            self.dtype,
            BestExport(self.study, self.out_dir, self.metrics, self.directions, self.ledger.lock),
            self.emit,
            self.started,
            checkpoints=self._checkpoint_folder(),
            account=self.account,
            constraints=self.constraints,
        )
        with (
            optimize_loop(self.study),
            Heartbeat(self.study, lambda: list(self.asked)) as heartbeat,
        ):
            try:
                with self.account.phase("storage"):
                    self.ctx.export.repair()  # a kill of an earlier run may have left the pair unfinished
                    self._announce()
                while self._time_left():
                    with self.ledger.lock:
                        with self.account.phase("storage"):
                            retry_stale_trials(self.ledger, list(self.asked), self.worker, self.emit)
                        pool = self.next_pool()
                    if not pool:
                        with self.account.phase("waiting"):
                            waited = wait_for_other_workers(
                                self.ledger, self.worker, self.emit, self._time_left, heartbeat.interval
                            )
                        if waited:
                            continue
                        break
                    # arrays a stopped run left mid-training
                    with self.account.phase("storage"):
                        claims, pool = claim(
                            self.ctx.checkpoints, pool, self.device.type, str(self.dtype), self._ended_trials
                        )
                    for resumed in claims:
                        self._train(Pack(list(resumed.proposals.values()), 0, 0, 0.0), resume=resumed)
                    for planned in self.next_arrays(pool):
                        self._train(planned)
            except BaseException as error:
                raise self._tell_held_on(error)  # noqa: B904 - `error` itself, or the user-facing error made from it
        with self.account.phase("storage"):
            self._release("not trained: the search's timeout ran out before its array started")
            self.ledger.discard_surplus()
            with self.ledger.lock:  # not between another worker's fail and its enqueue of the retry
                prune(self.ctx.checkpoints, self.study)  # checkpoints no retry will claim
            self.ctx.export.repair()  # another worker may have published a better trial meanwhile
        return self._summary()

    def _tell_held_on(self, error: BaseException) -> BaseException:
        """Tell every trial this run holds how the search stopped (nothing stays RUNNING);
        the exception to raise: a user's error as one HftaNasError line."""
        if isinstance(error, KeyboardInterrupt):  # failed as interrupted and queued again: the next run trains them
            told_despite_interrupts(lambda: interrupt_held(self.ledger, list(self.asked.values()), self.emit))
            return error
        if isinstance(error, StorageUnreachable):  # nothing can be told: a re-run retries what is left RUNNING
            return error
        if isinstance(error, HftaNasError):  # a user error (e.g. in build)
            reason, raised = f"not trained: the search stopped on an error: {error}", error
        elif isinstance(error, SystemExit):  # user code (a model's forward, a loss) ended the process
            reason = f"not trained: user code called sys.exit({error.code!r})"
            raised = HftaNasError(
                f"the search stopped: user code called sys.exit({error.code!r}) while an array "
                "trained; its trials were failed (not counted), a re-run trains them"
            )
            raised.__suppress_context__ = True
        elif isinstance(error, Exception):  # an error in the user's model or loss while training
            reason = f"not trained: the search stopped on an error: {type(error).__name__}: {error}"
            raised = HftaNasError(
                f"the search stopped: training raised {type(error).__name__}: {error}; its trials "
                "were failed (not counted against the budget), a re-run trains them"
            )
            raised.__cause__ = error
        else:
            return error
        told_despite_interrupts(lambda: self._release(reason))
        return raised

    def _time_left(self) -> bool:
        """Whether new trials may still be asked: within the timeout, and no callback called study.stop()."""
        if stop_requested(self.study):
            return False
        return self.timeout is None or time.monotonic() - self.started < self.timeout

    def next_pool(self) -> list[Proposal]:
        """The waiting proposals and fresh asks up to the pool size (or a replicate round)."""
        pool, self.waiting = self.waiting, []
        if self.replicate:
            return self._replicate_round(pool)
        while (
            len(pool) < self.pool_size
            and self.ledger.remaining() > 0
            and self._time_left()
            and (not pool or not self._ask_would_be_blind())  # a worker with nothing to train asks anyway
        ):
            pool.append(self._ask())
        return pool

    def _train(self, planned: Pack, resume: Claim | None = None) -> None:
        if not self._time_left():
            self.waiting.extend(planned.proposals)
            return
        started = time.monotonic()
        number = len(self.arrays) + 1
        size = planned.array_size or self.max_slots(planned.proposals)
        job = ArrayJob(self.ctx, planned, number, size, resume=resume, rebuild=self._rebuilt)
        self.trained.update(shape_key(p) for p in planned.proposals)
        self._answer_requests(job.run())
        self.arrays.append(
            {
                "array": number,
                "trials": [p.number for p in planned.proposals],
                "array_size": size,
                "slots": len(planned.proposals),
                "architectures": planned.architectures,
                "useful_macs": planned.useful_macs,
                "executed_macs": planned.executed_macs,
                "waste": round(planned.waste, 4),
                "estimated_s": round(planned.seconds, 3),
                "seconds": round(time.monotonic() - started, 3),
            }
        )
        self.emit(ArrayEnded(number, self._mean_occupancy()))

    def _answer_requests(self, requests: Generator[Request, Proposal | None, None]) -> None:
        """Run an array job to its end, answering what it asks of the search: a trial for a freed
        slot (`_refill`), or taking back proposals that must wait for smaller arrays (`_requeue`)."""
        answer: Proposal | None = None
        try:
            while True:
                request = requests.send(answer)
                if isinstance(request, FreedSlot):
                    answer = self._refill(request.ended, request.fits)
                elif isinstance(request, TrainApart):
                    self.waiting[:0] = request.proposals  # first in line; `pack` gives the refused arrays of one
                    self.trained_apart.update({p.number: p.apart for p in request.proposals if p.apart})
                    answer = None
                else:
                    self._requeue(request.proposals, request.limit)
                    answer = None
        except StopIteration:
            return
        finally:
            requests.close()  # on an error here: the job's open phases end now, in order

    def _release(self, reason: str) -> None:
        """Every trial this run asked that is still RUNNING is told FAIL (not counted: it never trained)."""
        running = {trial_id(t) for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        for held_id, trial in self.asked.items():
            if held_id in running:
                self.ledger.fail(trial, Outcome.NOT_TRAINED, reason)
        self.waiting = []

    # --------------------------------------------------------------- asking
    def _ask(self, fixed: dict[str, Any] | None = None) -> Proposal:
        # A Ctrl-C (or the SIGINT a killed parent sends) between the ask and `asked` would leave the
        # trial RUNNING and held by no one: it waits until the trial is held, and the stop tells it.
        with self.account.phase("ask"), interrupts_deferred():
            if fixed:
                self.study.enqueue_trial(fixed, skip_if_exists=False)
            trial = self.study.ask()
            self.asked[trial_id(trial)] = trial  # held (and failed on an error) from here on
        with self.account.phase("storage"):
            # whose it is, from the ask on: a worker killed before its first heartbeat leaves
            # trials that the next run on this machine retries at once
            trial.set_user_attr(WORKER_ATTR, self.worker)
            trial.set_user_attr(WORKER_HOST_ATTR, host_identity())
        with self.account.phase("ask"):
            candidate = built(self.build, trial)
        with self.account.phase("checks"):
            candidate = as_candidate(candidate).checked(self.data)
            self._check_metrics(candidate)
            shell = meta_shell(candidate)
            architecture = architecture_key(shell)
            macs = self.shape_checks.checked_macs(candidate, shell)
        seeds = trial_seeds(self.seed, trial.user_attrs.get(RETRY_OF, trial.number))
        self.proposed.add(architecture)
        return Proposal(trial, candidate, seeds, shell, macs)

    def _ended_trials(self) -> dict[int, int]:
        """Trials told how they ended for good (not failed as interrupted) -> the epochs they trained."""
        finished = self.study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
        )
        return {
            t.number: int(t.user_attrs.get("epochs_run", len(t.intermediate_values))) for t in finished if counts(t)
        }

    def _rebuilt(self, record: dict[str, Any]) -> Proposal:
        """The proposal of a trial that is no longer asked (it ended before a checkpoint of its array), from
        its stored parameters: a resumed array rebuilds its slots' models from it."""
        trial = optuna.trial.FixedTrial(record["params"], number=record["origin"])
        candidate = as_candidate(self.build(trial)).checked(self.data)
        return Proposal(trial, candidate, trial_seeds(self.seed, record["origin"]), meta_shell(candidate), 0)

    def _checkpoint_folder(self) -> Path | None:
        """This study's checkpoint folder beside the storage; None when checkpoints are off or the storage is
        in memory (nothing would resume from them)."""
        return checkpoint_folder(self.location, self.study.study_name) if checkpoints_enabled() else None

    def _check_metrics(self, candidate: Candidate) -> None:
        objective = as_objective(candidate.loss)
        trained = {name for split in ("train", "val", "test") for name in objective.metric_names(split)}
        known = {*trained, *STATIC_METRICS, *candidate.metrics}
        for metric in self.metrics:
            if metric not in known:
                raise HftaNasError(f"unknown metric '{metric}': expected one of {', '.join(sorted(known))}.")
            if metric in trained:
                check_split_has_data(candidate, metric)

    def _replicate_round(self, pool: list[Proposal]) -> list[Proposal]:
        """One array: the first waiting (else a freely asked) trial and copies of its `replicate` params."""
        if not pool:
            if self.ledger.remaining() <= 0:
                return []
            pool = [self._ask()]
        first, rest = pool[0], pool[1:]
        group = [first] + [p for p in rest if _same_array(p, first)]
        self.waiting = [p for p in rest if not _same_array(p, first)]
        size = self.max_slots(group)
        while len(group) < size and self.ledger.remaining() > 0 and self._time_left():
            proposal = self._ask(self._replicated(first))
            (group if _same_array(proposal, first) else self.waiting).append(proposal)
        self.waiting = group[size:] + self.waiting
        return group[:size]

    def _replicated(self, proposal: Proposal) -> dict[str, Any]:
        return {k: v for k, v in proposal.trial.params.items() if k in self.replicate}

    def _refill(self, ended: Proposal, fits: Callable[[Proposal], bool]) -> Proposal | None:
        """A proposal for the slot `ended` freed: a waiting one that fits, else new asks until one
        fits, while fewer than a pool of trials wait; those that do not fit wait for the next round."""
        with self.ledger.lock:
            for i, proposal in enumerate(self.waiting):
                if fits(proposal):
                    self.trained.add(shape_key(proposal))
                    return self.waiting.pop(i)
            while (
                len(self.waiting) < self.pool_size
                and self.ledger.remaining() > 0
                and self._time_left()
                and not self._ask_would_be_blind()
            ):
                proposal = self._ask(self._replicated(ended) if self.replicate else None)
                if fits(proposal):
                    self.trained.add(shape_key(proposal))
                    return proposal
                self.waiting.append(proposal)
                self.emit(TrialWaits(proposal.number, len(self.arrays) + 1))
                if self.replicate:  # a replicate ask copies the ended trial's architecture: no second try
                    break
        return None

    def _requeue(self, proposals: list[Proposal], limit: int) -> None:
        """Out of memory: these wait first in line, in arrays of at most `limit` of their structure."""
        key = structure_key(proposals[0])
        self.sizes[key] = min(limit, self.sizes.get(key, limit))
        self.waiting[:0] = proposals

    # -------------------------------------------------------------- packing
    def next_arrays(self, pool: list[Proposal]) -> list[Pack]:
        """The arrays to train now for `pool` (the real run and `plan` both call this).

        While no array would start at TARGET_OCCUPANCY of its size and more trials can be asked,
        the pool grows one ask at a time, up to POOL_ARRAYS array sizes. Then every array of the
        round trains, in the packer's order (trials trained apart first, then by first trial).
        None waits for a later round to fill: a trial asked early then trained after trials asked
        later, so the sampler drew those later trials without its result (never_slower, 5 seeds,
        median best val acc of mnist1d_mlp: 54.00% with arrays waiting up to two rounds, 58.75%
        without, plain Optuna 59.25%)."""
        packs = self.pack(pool)
        if self.replicate:
            return packs
        while not any(self._full(p) for p in packs):
            with self.ledger.lock:
                if not self._may_grow(pool):
                    return packs
                pool.append(self._ask())
            packs = self.pack(pool)
        return packs

    def _full(self, planned: Pack) -> bool:
        return len(planned.proposals) >= TARGET_OCCUPANCY * planned.array_size

    def _may_grow(self, pool: list[Proposal]) -> bool:
        """Whether a round may ask one more trial to fill its arrays."""
        return (
            len(pool) + len(self.waiting) < POOL_ARRAYS * self.pool_size
            and self.ledger.remaining() > 0
            and self._time_left()
            and not self._ask_would_be_blind()
        )

    def _ask_would_be_blind(self) -> bool:
        """Whether a trial asked now would be drawn at random where a later ask would follow results:
        the sampler's random start (TPE's first 10 trials by default) is all asked, not yet that many have
        finished, and some are still running (waiting helps only then). Plain Optuna's study.optimize asks
        the next trial once the earlier ones finished, so its draws past the start follow them; a fuller
        round is not worth guided draws spent blind (mnist1d_mlp, 16 trials: growth to fill arrays asked
        trials 10 and 11 before any result, and TPE drew them at random; over 10 seeds pack's best was
        below plain's in 8, by a median 2.4 points). Rounds, their growth and refills all wait (a replicate
        round copies an ended trial's draw and is not held), except a round's first ask: a worker with
        nothing to train asks one trial, as each of several plain Optuna processes would, rather than
        idle while another worker's start trains (`--workers`)."""
        if self.startup is None:
            return False
        count, states = self.startup
        trials = self.study.get_trials(deepcopy=False)
        if any(t.state == TrialState.WAITING for t in trials):
            return False  # the next ask takes a queued trial: no draw
        finished = sum(t.state in states for t in trials)
        if finished >= count:  # finished trials stay finished: no ask of this search is blind again
            self.startup = None
            return False
        running = any(t.state == TrialState.RUNNING for t in trials)
        return running and len(trials) >= count

    def pack(self, pool: list[Proposal]) -> list[Pack]:
        """The packing policy's arrays for `pool`: the groups' array sizes and step costs are looked up
        (or measured) here, then `pack_groups` decides from those numbers alone."""
        apart = [Pack([p], p.useful_macs, p.useful_macs, 0.0, array_size=1) for p in pool if p.apart is not None]
        pool = [p for p in pool if p.apart is None]
        if not pool:
            return apart
        with self.account.phase("packing"):
            groups = structure_groups(pool, self.shape_checks)
        sized = [
            Group(g, self.max_slots(g), self._step_cost(g) if not self.replicate else StepCost(1.0, 0.0))
            for g in groups
        ]
        with self.account.phase("packing"):
            max_waste = self.max_waste if not self.replicate else 0.0
            packed = pack_groups(sized, max_waste=max_waste, shapes=self.shape_checks)
        return apart + packed

    def max_slots(self, group: list[Proposal]) -> int:
        key = structure_key(group[0])
        if self.array_size == "auto" and key not in self.sizes:
            self._auto_size(group, key)
        return self.sizes.get(key, self.array_size if isinstance(self.array_size, int) else AUTO_CAP)

    def _auto_size(self, group: list[Proposal], key: str) -> None:
        """The knee of the structure's measured step curve, bounded by memory and by a third of the
        budget (so that the sampler sees results from at least three rounds)."""
        fits = self._memory_limit(group)
        curve = self._curve(group)
        size, reason = (
            min(curve.knee, fits),
            f"throughput knee of the measured step curve {dict(zip(curve.sizes, curve.step_s))}",
        )
        if fits < curve.knee:
            reason = f"memory: {fits} models fit"
        if size > self._budget_cap():
            size, reason = self._budget_cap(), f"a third of the budget of {self.n_trials} trials"
        self.sizes[key] = size
        self.pool_size = max(self.pool_size, size)  # a round asks at least one array of the largest size
        if all(chosen == 1 for chosen in self.sizes.values()):
            # fusion pays for no structure measured: one trial at a time, each asked with every result
            # so far, as plain Optuna's study.optimize asks (a pool only spreads trials over arrays)
            self.pool_size = 1
        with self.account.phase("storage"):
            self.study.set_user_attr(f"array_size:{key}", {"size": size, "reason": reason})
        self.emit(ArraySizeChosen(key, size, reason))

    def _budget_cap(self) -> int:
        """The largest array `auto` takes: a third of the budget (so that the sampler sees results from at
        least three rounds), at least 2; no bound without a trial budget."""
        return AUTO_CAP if self.n_trials is None else min(AUTO_CAP, max(2, math.ceil(self.n_trials / 3)))

    def _memory_limit(self, group: list[Proposal]) -> int:
        """How many of the group's largest models fit in this device's memory budget (at most AUTO_CAP)."""
        largest = max(group, key=lambda p: p.useful_macs).candidate
        with self.account.phase("cost"):
            return memory_limit(
                largest.model,
                largest.data.input_shape,
                batch_size=largest.batch_size,
                dtype=self.dtype,
                optimizer=largest.optimizer,
                available=free_memory(self.device),
                cap=AUTO_CAP,
            )

    def _curve(self, group: list[Proposal]) -> StepCurve:
        """The group's structure's step curve: measured once per run, and per machine (on disk)."""
        key = structure_key(group[0])
        if key not in self.curves:
            # measured only as far as this search can use: memory, and a third of the budget
            limit = min(self._memory_limit(group), self._budget_cap()) if self.array_size == "auto" else self.array_size
            self.curves[key] = self._measured_cost(group, limit)
        return self.curves[key]

    def _step_cost(self, group: list[Proposal]) -> StepCost | StepCurve:
        """This device's measured step cost for the group's structure: kept in the study so a
        resumed run (or another worker on the same kind of device) packs alike, and on disk
        (`StepCostCache`) so that the next search on this machine does not measure it again."""
        if self.fixed_cost is not None:
            return self.fixed_cost
        key = f"step_cost:{device_name(self.device)}:{structure_key(group[0])}"
        if key not in self.costs:
            stored = self.study.user_attrs.get(key)
            if stored:
                self.costs[key] = cost_from_dict(stored)
            else:
                self.costs[key] = self._curve(group)
                with self.account.phase("storage"):
                    self.study.set_user_attr(key, self.costs[key].as_dict())
        return self.costs[key]

    def _measured_cost(self, group: list[Proposal], slots: int) -> StepCurve:
        """The disk cache's step curve for the group's structure up to `slots`, else a measurement (then cached).
        The curve is measured on the group's largest model and kept for the structure, whatever its sizes:
        it prices any envelope of that structure by the envelope's multiply-adds (`StepCurve.step_seconds`),
        so a later search whose first group holds other sizes (another seed's draws) measures nothing."""
        largest = max(group, key=lambda p: p.useful_macs)
        smallest = min(group, key=lambda p: p.useful_macs)
        candidate = largest.candidate
        with self.account.phase("cost"):
            cache_key = StepCostCache.key(cost_key(largest), slots, self.device, self.dtype)
            cost = self.cost_cache.get(cache_key)
            if not isinstance(cost, StepCurve):
                cost = measure_step_cost(
                    candidate.model,
                    largest.useful_macs,
                    input_shape=candidate.data.input_shape,
                    num_classes=candidate.data.num_classes,
                    batch_size=candidate.batch_size,
                    dtype=self.dtype,
                    optimizer=candidate.optimizer,
                    device=self.device,
                    slots=slots,
                    smallest=(smallest.candidate.model, smallest.useful_macs),
                )
                if cost.steady:
                    self.cost_cache.put(cache_key, cost)
                else:  # packed by this run only: the next search measures again, on a quieter machine
                    log.warning("step curve measured under load (%s): not kept for later searches", cost.describe())
        return cost

    # -------------------------------------------------------------- reporting
    def _states(self) -> dict[str, int]:
        """The study's trials by state name."""
        return dict(Counter(t.state.name for t in self.study.get_trials(deepcopy=False)))

    def _announce(self) -> None:
        self.emit(
            SearchStarted(
                self.study.study_name,
                self.location,
                dashboard_command(self.location),
                self.ledger.counted(ended_only=True),
                self.n_trials,
                self.timeout,
                self._states(),
                self.metrics,
                self.directions,
                [list(t.values) for t in self._best_trials()],
            )
        )

    def _best_trials(self) -> list[optuna.trial.FrozenTrial]:
        if not self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            return []
        try:
            return list(self.study.best_trials) if len(self.metrics) > 1 else [self.study.best_trial]
        except ValueError:  # Optuna's word for "no completed trial is feasible" under constraints
            return []

    def _mean_occupancy(self) -> float:
        return float(np.mean(self.ctx.occupancy)) if self.ctx.occupancy else 0.0

    def _summary(self) -> SearchSummary:
        with self.account.phase("storage"):
            best_trials = self._best_trials()
        best = [
            {
                "number": t.number,
                "values": dict(zip(self.metrics, t.values)),
                "params": t.params,
                "seeds": {s: t.user_attrs.get(f"seed_{s}") for s in ("init", "data", "dropout")},
            }
            for t in best_trials
        ]
        with self.account.phase("storage"):
            states = self._states()
        seconds = time.monotonic() - self.started
        return SearchSummary(
            self.study.study_name,
            self.location,
            dashboard_command(self.location),
            self.metrics,
            self.directions,
            states,
            best,
            self.arrays,
            self._mean_occupancy(),
            len(self.proposed),
            len(self.proposed & self.trained),
            seconds,
            self.ctx.samples / max(seconds, 1e-9),
            dict(self.ctx.export.files),
            self.account.report(),
            dict(self.trained_apart),
            self.ctx.export.unsaved_best,
        )


def _same_array(a: Proposal, b: Proposal) -> bool:
    return shape_key(a) == shape_key(b) and a.candidate.shared_settings() == b.candidate.shared_settings()
