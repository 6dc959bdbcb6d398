"""One array of a search: build it from a pack, train it, and tell every trial.

Each epoch every slot reports its metrics to its trial (single objective:
`trial.report`, so pruners work; several objectives: the user attribute
`learning_curve`, which the dashboard shows, because Optuna forbids
`report` there). A slot that is pruned or fails while other slots train on
is refilled with a trial whose model fits this array's envelope, else the
array shrinks. The job does not call back into the search for that: `run()`
is a generator that yields requests (`FreedSlot`: a slot to refill; `Requeue`:
proposals that must wait for smaller arrays; `TrainApart`: proposals whose array's
check refused it, to train again, the refused ones in arrays of their own) and the
search's loop answers each one, a proposal or None. One refused candidate never fails
its array-mates or ends the search; alone, a refused model is told FAIL with the reason.
A slot that finishes its epochs is told COMPLETE. The
user attributes `train_start` / `train_end` say when a trial's slot trained:
a trial's Optuna duration also counts the time it waited for its array.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import re
import secrets
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import torch

from hfta_nas._time_account import TimeAccount
from hfta_nas.array._model_array import ModelArray
from hfta_nas.envelope._probe import envelope_macs
from hfta_nas.errors import FusionError, HftaNasError
from hfta_nas.models import count_parameters
from hfta_nas.optim import OPTIMIZERS, LRSchedule
from hfta_nas.search._candidate import Proposal, example_input
from hfta_nas.search._events import (
    ArrayFailed,
    ArrayRefused,
    ArrayResumed,
    ArraySplit,
    ArrayStarted,
    EpochEnded,
    SlotRefilled,
    TrialEnded,
    TrialEpochEnded,
    TrialStarted,
)
from hfta_nas.search._export import BestExport
from hfta_nas.search._heartbeat import WORKER_ATTR
from hfta_nas.search._ledger import Ledger, Outcome
from hfta_nas.search._packing import Pack, shape_key
from hfta_nas.search._pruning import should_prune
from hfta_nas.search._resume import Claim, slot_record
from hfta_nas.training._checkpoint import remove as remove_checkpoint
from hfta_nas.training._checkpoint import save as save_checkpoint
from hfta_nas.training._oom import ArrayOutOfMemory, check_budget, is_out_of_memory
from hfta_nas.training._trainer import ArrayTrainer, EpochReport

log = logging.getLogger(__name__)
STATIC_METRICS = ("params", "latency_ms")
# The most of an array's time its checkpoints may take; None: a checkpoint at every epoch's end.
CHECKPOINT_SHARE: float | None = 0.02


@dataclass
class JobContext:
    """What every array job of one search shares."""

    study_name: str
    ledger: Ledger
    metrics: list[str]
    worker: str
    device: torch.device
    dtype: torch.dtype
    export: BestExport
    emit: Callable[[Any], None]
    started: float  # monotonic time the run started
    occupancy: list[float] = field(default_factory=list)  # running slots / array size, per epoch of every array
    samples: int = 0  # training samples processed this run, summed over slots
    checkpoints: Path | None = None  # where arrays save themselves every epoch (None: they do not)
    account: TimeAccount = field(default_factory=TimeAccount)  # where the search's wall time goes
    # a completed trial's final metrics -> its named constraints (feasible at <= 0), set before it is told
    constraints: Callable[[dict[str, float]], Mapping[str, float]] | None = None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class FreedSlot:
    """A slot whose trial ended while others train on: answer with a proposal that `fits`, or None
    (the slot leaves the array)."""

    ended: Proposal
    fits: Callable[[Proposal], bool]
    why: str  # pruned, failed, early stopped


@dataclass(frozen=True)
class Requeue:
    """Proposals that must wait, first in line, for arrays of at most `limit` slots (out of memory);
    answered with None."""

    proposals: list[Proposal]
    limit: int


@dataclass(frozen=True)
class TrainApart:
    """An array's check refused it (`hfta_nas.FusionError`): these proposals train again from the start,
    those whose `apart` is set in arrays of their own, the others packed as usual; answered with None."""

    proposals: list[Proposal]


Request = FreedSlot | Requeue | TrainApart


class ArrayJob:
    """Trains one pack; see the module docstring."""

    def __init__(
        self,
        ctx: JobContext,
        pack: Pack,
        number: int,
        array_size: int,
        *,
        resume: Claim | None = None,
        rebuild: Callable[[dict[str, Any]], Proposal] | None = None,
    ) -> None:
        self.ctx, self.number, self.array_size = ctx, number, array_size
        self.pack = pack
        self.first = pack.proposals[0].candidate
        self.array_id = f"{ctx.worker}/{number}"
        self.by_number: dict[int, Proposal] = {}  # trial number -> the proposal in (or once in) a slot
        self.started: dict[int, float] = {}  # trial number -> when its slot started training
        self.static: dict[int, dict[str, float]] = {}  # trial number -> its metrics known without training
        # per-epoch checkpoints (`_resume`): the file, the trial of every slot id it names, and the
        # claimed checkpoint of a stopped run this job continues (removed once this one is saved)
        # a random part: a restarted container may have the worker's hostname and pid again
        name = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', ctx.worker)}-{number}-{secrets.token_hex(4)}"
        self.path = ctx.checkpoints / f"{name}.pt" if ctx.checkpoints is not None else None
        self.records: dict[int, dict[str, Any]] = {}
        self.resume, self.rebuild = resume, rebuild
        self.previous = resume.path if resume is not None else None
        self.saved_at: float | None = None  # when the last checkpoint was written (monotonic), and what it took
        self.save_seconds = 0.0
        self.ended: dict[int, int] = dict(resume.ended) if resume is not None else {}  # slot id -> its last epoch

    # ------------------------------------------------------------------ build
    def _within_memory(self, proposals: list[Proposal]) -> Generator[Request, Proposal | None, list[Proposal]]:
        """The leading part that fits the memory budget (halving); the rest waits (a Requeue). A
        proposal too big even alone is told FAIL."""
        largest = max(proposals, key=lambda p: p.useful_macs)
        while True:
            try:
                check_budget(
                    largest.candidate.model,
                    self.first.data.input_shape,
                    batch_size=self.first.batch_size,
                    slots=len(proposals),
                    dtype=self.ctx.dtype,
                    optimizer=self.first.optimizer,
                    device=self.ctx.device,
                )
                return proposals
            except ArrayOutOfMemory as error:
                if len(proposals) == 1:
                    self._fail(proposals[0], f"out of memory even alone: {error}")
                    return []
                half = (len(proposals) + 1) // 2
                log.warning(
                    "array of %d models out of memory (%s); training %d now, the rest in later arrays",
                    len(proposals),
                    error,
                    half,
                )
                self.ctx.emit(ArraySplit(len(proposals), half, str(error)))
                yield Requeue(proposals[half:], half)
                proposals = proposals[:half]

    def _trainer(self, proposals: list[Proposal], slot_ids: list[int] | None = None) -> ArrayTrainer:
        return array_trainer(proposals, self.ctx.device, self.ctx.dtype, self._needs_test(), slot_ids)

    def _needs_test(self) -> bool:
        """Whether any objective (or the early-stopping rule) reads the test split: else a search's
        epochs skip evaluating it (the search reports only its objectives)."""
        stopping = self.first.early_stopping
        names = [*self.ctx.metrics, *([stopping.metric] if stopping is not None else [])]
        return any(name.startswith("test_") for name in names)

    def _start_slot(self, proposal: Proposal, slot: int, **extra: Any) -> None:
        self.started[proposal.number] = time.monotonic()
        # constraints may read a static metric the objectives do not (a latency bound): measured then too
        wanted = [*self.ctx.metrics, *getattr(self.ctx.constraints, "metrics", ())]
        self.static[proposal.number] = static_metrics(proposal, wanted, self.ctx.device, self.ctx.dtype)
        self.records[proposal.number] = slot_record(proposal)
        with self.ctx.account.phase("storage"):
            if self.ctx.ledger.beyond_budget(proposal.trial):  # asked on a count a database crash made stale
                self._refuse_surplus(proposal)
                return
            try:
                self._tell_start(proposal, slot, **extra)
            except optuna.exceptions.UpdateFinishedTrialError:
                # This worker was cut off (or paused) past the heartbeat grace after asking the trial:
                # another worker failed it as stale and retries it. Its slot trains untold until its
                # first epoch ends, then leaves; nothing is told twice.
                self.ended[proposal.number] = 0
                self.ctx.emit(
                    TrialEnded(
                        proposal.number, "FAIL", reason="taken over: another worker retried it before it started"
                    )
                )

    def _refuse_surplus(self, proposal: Proposal) -> None:
        """Fail a trial past the budget as surplus before it trains; like a trial taken over, its
        slot trains untold until its first epoch ends, then leaves."""
        self.ended[proposal.number] = 0
        reason = "surplus: asked when the budget was already full (another worker counted at the same time)"
        if self.ctx.ledger.fail(proposal.trial, Outcome.SURPLUS, reason):
            self.ctx.emit(TrialEnded(proposal.number, "FAIL", reason=reason))

    def _tell_start(self, proposal: Proposal, slot: int, **extra: Any) -> None:
        trial = proposal.trial
        attributes = dict(
            array_id=self.array_id,
            slot=slot,
            architecture=shape_key(proposal),
            worker=self.ctx.worker,
            train_start=_now(),
            seed_init=proposal.seeds["init"],
            seed_data=proposal.seeds["data"],
            seed_dropout=proposal.seeds["dropout"],
            **extra,
        )
        for key, value in attributes.items():
            if key != WORKER_ATTR:  # written when the trial was asked (each attribute is a storage write)
                trial.set_user_attr(key, value)
        self.ctx.emit(TrialStarted(proposal.number, dict(trial.params), attributes))

    # -------------------------------------------------------------------- run
    def run(self) -> Generator[Request, Proposal | None, None]:
        """Train the array to its end; yields each request the search must answer (module docstring)."""
        account = self.ctx.account
        with account.phase("build"):
            trainer = self._resumed() if self.resume is not None else None
        if trainer is None:
            try:
                trainer = yield from self._started()
            except FusionError as error:  # the models cannot share this array after all
                yield from self._refused(list(self.by_number.values()), None, error)
                return
        if trainer is None:
            return
        try:
            for report in trainer.epochs(self.first.epochs, account):
                yield from self._on_epoch(report, trainer)
                trainer.leave_finished()
                if self.path is not None:
                    self._save(trainer)
        except FusionError as error:  # a check refused a slot's place in the array, or the model
            yield from self._refused(self._running(trainer), trainer, error)
        except HftaNasError:
            raise
        except (RuntimeError, torch.OutOfMemoryError, MemoryError) as error:
            yield from self._failed(trainer, error)
        with account.phase("checkpoints"):
            self._forget()  # the array ended: its trials are told (a kill or Ctrl-C never gets here)

    def _started(self) -> Generator[Request, Proposal | None, ArrayTrainer | None]:
        """A fresh array of the pack's proposals (those that fit in memory)."""
        proposals = yield from self._within_memory(list(self.pack.proposals))
        with self.ctx.account.phase("build"):
            return self._trainer_of(proposals)

    def _trainer_of(self, proposals: list[Proposal]) -> ArrayTrainer | None:
        self.by_number = {p.number: p for p in proposals}
        if not proposals:
            return None
        trainer = self._trainer(proposals)
        for slot, proposal in enumerate(proposals):
            self._start_slot(proposal, slot)
        self.ctx.emit(
            ArrayStarted(
                self.number,
                [p.number for p in proposals],
                self.array_size,
                self.pack.architectures,
                self.pack.useful_macs,
                self.pack.executed_macs,
                self.pack.seconds,
            )
        )
        return trainer

    def _running(self, trainer: ArrayTrainer) -> list[Proposal]:
        """The proposals of the array's slots whose trials are still running."""
        with self.ctx.account.phase("storage"):
            return [
                self.by_number[n]
                for n in trainer.slot_ids
                if n in self.by_number and self.ctx.ledger.is_running(self.by_number[n].trial)
            ]

    def _refused(
        self, running: list[Proposal], trainer: ArrayTrainer | None, error: FusionError
    ) -> Generator[Request, Proposal | None, None]:
        """The array's check refused a slot's place in it (`error.slot`), or the model (None): the refused
        proposals train again in arrays of their own, the others as usual. A proposal refused while it
        trained alone already is told FAIL with the reason: its model cannot train in any array."""
        if trainer is not None and error.slot is not None:
            refused = [p for p in running if trainer.position_of(p.number) == error.slot]
        else:
            refused = running
        reason = f"array {self.array_id} refused it: {error}"
        for proposal in [p for p in refused if p.apart is not None]:
            self._fail(proposal, f"refused even in an array of its own: {error}")
        again = [p for p in running if p.apart is None or p not in refused]
        with self.ctx.account.phase("storage"):
            for proposal in refused:
                if proposal.apart is None:
                    proposal.apart = reason
                    with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # taken over meanwhile
                        proposal.trial.set_user_attr("trained_apart", reason)
        log.warning("%s; %d of its trials train again, %d of them apart", reason, len(again), len(refused))
        self.ctx.emit(ArrayRefused(self.number, [p.number for p in refused], [p.number for p in again], str(error)))
        if again:
            yield TrainApart(again)

    def _failed(self, trainer: ArrayTrainer, error: BaseException) -> Generator[Request, Proposal | None, None]:
        running = self._running(trainer)
        with self.ctx.account.phase("storage"):
            if is_out_of_memory(error) and len(running) > 1:
                yield self._retry_smaller(running, error)
                return
            for proposal in running:
                self._fail(
                    proposal,
                    f"array {self.array_id} failed: {type(error).__name__}: {error}",
                    trainer.results[proposal.number].epochs,
                )
            self.ctx.emit(ArrayFailed(self.number, str(error)))

    # ------------------------------------------------------------ checkpoints
    def _save(self, trainer: ArrayTrainer) -> None:
        """A checkpoint after the first epoch, then whenever the time since the last one is at least
        1 / CHECKPOINT_SHARE times what the last one took: checkpoints cost at most ~2% of the array's
        time, and a kill loses at most ~50 checkpoint-writes' worth of training (redone bit-identically)."""
        with self.ctx.account.phase("checkpoints"):
            started = time.monotonic()
            share = CHECKPOINT_SHARE
            if (
                share is not None
                and self.saved_at is not None
                and (started - self.saved_at) * share < self.save_seconds
            ):
                return
            self._save_now(trainer)
            self.saved_at = time.monotonic()
            self.save_seconds = self.saved_at - started

    def _save_now(self, trainer: ArrayTrainer) -> None:
        state = {
            "trainer": trainer.state_dict(),
            "slots": self.records,
            "device": self.ctx.device.type,
            "dtype": str(self.ctx.dtype),
        }
        if save_checkpoint(self.path, state) and self.previous not in (None, self.path):
            remove_checkpoint(self.previous)
            self.previous = None

    def _forget(self) -> None:
        for path in (self.path, self.previous):
            if path is not None:
                remove_checkpoint(path)

    def _resumed(self) -> ArrayTrainer | None:
        """The claimed checkpoint's array, rebuilt with every number put back and its retried trials
        in the slots of the trials they retry; None (train afresh) when it cannot be rebuilt."""
        claim = self.resume
        renames = {old: p.number for old, p in claim.proposals.items()}
        state = renamed(claim.state["trainer"], renames)
        self.records = {renames.get(sid, sid): record for sid, record in claim.state["slots"].items()}
        claimed = {p.number: p for p in claim.proposals.values()}
        try:
            builders = {
                sid: claimed.get(sid) or self.rebuild(self.records[sid])
                for sid in {*state["initial_ids"], *state["slot_ids"]}
            }
            trainer = self._trainer([builders[sid] for sid in state["initial_ids"]], list(state["initial_ids"]))
            trainer.restore(state, build=lambda sid: (builders[sid].build(), slot_options(builders[sid], trainer)))
            trainer.array.verify(trainer.data.x_train[:2])  # padded slots against their own models, here
        except Exception as error:  # noqa: BLE001 - the user's build on stored params, a changed model, ...
            log.warning(
                "could not continue the checkpoint %s (%s: %s); its trials train from the start",
                claim.path,
                type(error).__name__,
                error,
            )
            if not is_out_of_memory(error):  # out of memory may pass; anything else will not
                remove_checkpoint(claim.path)
            self.previous, self.records = None, {}
            return None
        self.by_number = claimed
        shells = [builders[sid].shell for sid in state["initial_ids"]]
        executed = len(claimed) * envelope_macs(shells, example_input(self.first))
        self.pack = Pack(list(claimed.values()), sum(p.useful_macs for p in claimed.values()), executed, 0.0)
        self.ctx.emit(
            ArrayStarted(
                self.number,
                list(claimed),
                self.array_size,
                self.pack.architectures,
                self.pack.useful_macs,
                self.pack.executed_macs,
                0.0,
            )
        )
        for number, proposal in claimed.items():
            self._start_slot(proposal, trainer.position_of(number), resumed_from_epoch=claim.epoch)
            for epoch, row in enumerate(trainer.results[number].history, start=1):  # the curve so far, told again
                self._report(
                    proposal, epoch, [row[m] if m in row else self.static[number][m] for m in self.ctx.metrics]
                )
        self.ctx.emit(ArrayResumed(self.number, list(claimed), claim.epoch))
        return trainer

    def _retry_smaller(self, running: list[Proposal], error: BaseException) -> Requeue:
        """Out of memory while training (CUDA): the running trials wait again, first in
        line, for arrays of half the size; epochs they report again repeat the same values."""
        half = max(1, (len(running) + 1) // 2)
        log.warning(
            "array of %d models out of memory while training (%s: %s); retrying them in arrays of %d",
            len(running),
            type(error).__name__,
            error,
            half,
        )
        self.ctx.emit(ArraySplit(len(running), half, str(error)))
        for proposal in running:
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # taken over meanwhile
                proposal.trial.set_user_attr("out_of_memory", f"{type(error).__name__}: {error}")
        return Requeue(running, half)

    # ------------------------------------------------------------- per epoch
    def _on_epoch(self, report: EpochReport, trainer: ArrayTrainer) -> Generator[Request, Proposal | None, None]:
        with self.ctx.account.phase("storage"):  # a refill's ask and build are charged to theirs
            yield from self._tell_epoch(report, trainer)

    def _tell_epoch(self, report: EpochReport, trainer: ArrayTrainer) -> Generator[Request, Proposal | None, None]:
        ctx = self.ctx
        for number, metrics in report.metrics.items():
            if number in self.ended:  # its trial ended after the checkpoint: it trains on untold, then leaves
                if trainer.results[number].epochs >= self.ended[number] and trainer.results[number].status == "running":
                    trainer.stop([number], reason="its trial ended before the stop")
                continue
            try:
                yield from self._end_epoch_of(number, metrics, report, trainer)
            except optuna.exceptions.UpdateFinishedTrialError:
                # This worker was paused (SIGSTOP, a suspended laptop) past the heartbeat grace: another
                # worker failed the trial as stale and retries it. The slot stops; nothing is told twice.
                ctx.emit(
                    TrialEnded(
                        number, "FAIL", reason="taken over: another worker retried it while this worker was paused"
                    )
                )
                if trainer.results[number].status == "running":
                    trainer.stop([number], reason="taken over")
        running = len(report.metrics) - len(report.failed)
        ctx.occupancy.append(len(report.metrics) / self.array_size)
        ctx.samples += len(report.metrics) * len(self.first.data.y_train)
        elapsed = max(time.monotonic() - ctx.started, 1e-9)
        ctx.emit(
            EpochEnded(
                self.number,
                report.epoch,
                running,
                self.array_size,
                ctx.occupancy[-1],
                float(np.mean(ctx.occupancy)),
                ctx.samples / elapsed,
            )
        )

    def _end_epoch_of(
        self, number: int, metrics: dict[str, float], report: EpochReport, trainer: ArrayTrainer
    ) -> Generator[Request, Proposal | None, None]:
        """Record one slot's epoch; tell its trial how it ended when it did (pruned, failed, completed)."""
        ctx, proposal, result = self.ctx, self.by_number[number], trainer.results[number]
        if number in report.failed:
            self._fail(proposal, report.failed[number], result.epochs)
            yield from self._refill_or_stop(trainer, proposal, "failed")
            return
        values = [metrics[m] if m in metrics else self.static[number][m] for m in ctx.metrics]
        self._report(proposal, result.epochs, values)
        ctx.emit(TrialEpochEnded(number, result.epochs, {**metrics, **dict(zip(ctx.metrics, values))}))
        if result.status == "completed":
            # what a sampler's constraints_func reads when the trial is told (Optuna calls it in tell)
            final = {
                "params": count_parameters(proposal.shell),
                **self.static[number],
                **metrics,
                **dict(zip(ctx.metrics, values)),
            }
            final = {name: float(value) for name, value in final.items()}
            named = ctx.constraints(final) if ctx.constraints else {}
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                proposal.trial.set_user_attr("final_metrics", final)
                for name, value in named.items():
                    proposal.trial.set_constraint(name, float(value))  # before tell: the sampler reads it there
            feasible = all(float(value) <= 0 for value in named.values())
            self._complete(proposal, values, trainer, result.epochs, feasible)
            if result.epochs < proposal.candidate.epochs:  # stopped early: its slot is free for another trial
                yield from self._refill_or_stop(trainer, proposal, "early stopped")
        elif len(ctx.metrics) == 1 and should_prune(proposal.trial):
            self._ended(proposal, result.epochs)
            ctx.ledger.prune(proposal.trial)
            ctx.emit(TrialEnded(number, "PRUNED"))
            yield from self._refill_or_stop(trainer, proposal, "pruned")

    def _report(self, proposal: Proposal, epoch: int, values: list[float]) -> None:
        if epoch in proposal.reported:
            return
        proposal.reported.add(epoch)
        if len(values) == 1:
            proposal.trial.report(values[0], epoch)
            return
        curve = proposal.trial.user_attrs.get("learning_curve", {"epoch": [], **{m: [] for m in self.ctx.metrics}})
        curve["epoch"].append(epoch)
        for metric, value in zip(self.ctx.metrics, values):
            curve[metric].append(value)
        proposal.trial.set_user_attr("learning_curve", curve)

    def _ended(self, proposal: Proposal, epochs: int | None) -> None:
        """The attributes a trial gets when its slot stops training (once, not every epoch: each is a storage write)."""
        trial = proposal.trial
        if epochs is not None:
            trial.set_user_attr("epochs_run", epochs)
        if proposal.number in self.started:
            trial.set_user_attr("train_seconds", round(time.monotonic() - self.started[proposal.number], 3))
        trial.set_user_attr("train_end", _now())

    def _complete(
        self, proposal: Proposal, values: list[float], trainer: ArrayTrainer, epochs: int, feasible: bool = True
    ) -> None:
        if not all(math.isfinite(v) for v in values):
            self._fail(proposal, f"non-finite metric values {values}", epochs)
            return
        self._ended(proposal, epochs)
        self.ctx.ledger.complete(proposal.trial, values)
        self.ctx.emit(TrialEnded(proposal.number, "COMPLETE", list(values), feasible=feasible))
        slot = trainer.position_of(proposal.number)
        self.ctx.export.offer(proposal, values, trainer.array.slot_state_dict(slot), self.ctx.study_name)

    def _fail(self, proposal: Proposal, reason: str, epochs: int | None = None) -> None:
        self._ended(proposal, epochs)
        if self.ctx.ledger.fail(proposal.trial, Outcome.FAILED, reason):
            self.ctx.emit(TrialEnded(proposal.number, "FAIL", reason=reason))

    def _refill_or_stop(
        self, trainer: ArrayTrainer, ended: Proposal, why: str
    ) -> Generator[Request, Proposal | None, None]:
        """Refill the slot of a pruned or failed trial while other slots train on, else drop it."""
        others = any(trainer.results[s].status == "running" for s in trainer.slot_ids if s != ended.number)
        key = ended.candidate.shared_settings()
        fits = lambda p: p.apart is None and p.candidate.shared_settings() == key and trainer.array.fits(p.shell)
        new = (yield FreedSlot(ended, fits, why)) if others else None
        if new is None:
            trainer.stop([ended.number], reason=why)
            return
        slot = trainer.position_of(ended.number)
        with self.ctx.account.phase("build"):
            trainer.replace(ended.number, new.number, new.build(), **slot_options(new, trainer))
        self.by_number[new.number] = new
        self._start_slot(new, slot, refilled_after=ended.number)
        self.ctx.emit(SlotRefilled(self.number, slot, ended.number, new.number, why))


# ------------------------------------------------------------------ settings
def array_trainer(
    proposals: list[Proposal],
    device: torch.device,
    dtype: torch.dtype,
    evaluate_test: bool,
    slot_ids: list[int] | None = None,
) -> ArrayTrainer:
    """The trainer of an array of `proposals` (fusable, with the settings an array shares): each slot its
    model built from its init seed, its hyper-parameters, schedule, data and dropout seeds."""
    first = proposals[0].candidate
    array = ModelArray(
        [p.build() for p in proposals],
        dropout_seeds=[p.seeds["dropout"] for p in proposals],
        device=device,
        dtype=dtype,
    )
    candidates = [p.candidate for p in proposals]
    optimizer = OPTIMIZERS[first.optimizer](array, **per_slot_hparams(candidates))
    return ArrayTrainer(
        array,
        optimizer,
        first.data.to(device, dtype),
        schedule=per_slot_schedule(optimizer, candidates),
        data_seeds=[p.seeds["data"] for p in proposals],
        slot_ids=slot_ids or [p.number for p in proposals],
        evaluate_test=evaluate_test,
        **first.training_settings().trainer_kwargs(),
    )


def slot_options(proposal: Proposal, trainer: ArrayTrainer) -> dict[str, Any]:
    """`ArrayTrainer.replace`'s arguments for a proposal refilling a slot."""
    schedule = schedule_of(proposal.candidate) if trainer.schedule is not None else None
    return dict(
        data_seed=proposal.seeds["data"],
        dropout_seed=proposal.seeds["dropout"],
        hparams=proposal.candidate.slot_hparams(),
        schedule_params=schedule,
    )


def renamed(state: dict[str, Any], renames: dict[int, int]) -> dict[str, Any]:
    """A trainer checkpoint with slot ids renamed (the trials a retry took over)."""
    new = lambda sid: renames.get(sid, sid)
    return {
        **state,
        "initial_ids": [new(s) for s in state["initial_ids"]],
        "slot_ids": [new(s) for s in state["slot_ids"]],
        "results": {new(sid): {**result, "slot_id": new(sid)} for sid, result in state["results"].items()},
    }


def per_slot_hparams(candidates: list[Any]) -> dict[str, Any]:
    """Per-slot lists of every hyper-parameter any slot sets (the optimizer's defaults fill
    the rest), and the flags the array shares."""
    return OPTIMIZERS[candidates[0].optimizer].slot_arguments(
        [c.slot_hparams() for c in candidates], candidates[0].flags()
    )


def schedule_of(candidate: Any) -> dict[str, Any]:
    return dict(candidate.schedule or {"kind": "constant"})


def per_slot_schedule(optimizer: Any, candidates: list[Any]) -> LRSchedule | None:
    """One LRSchedule with each slot's kind and arguments; None when no slot schedules."""
    if not any(c.schedule for c in candidates):
        return None
    schedules = [schedule_of(c) for c in candidates]
    names = sorted({k for s in schedules for k in s if k != "kind"})
    defaults = inspect.signature(LRSchedule).parameters
    args = {name: [s.get(name, defaults[name].default) for s in schedules] for name in names}
    return LRSchedule(optimizer, [s["kind"] for s in schedules], **args)


def static_metrics(
    proposal: Proposal, metrics: list[str], device: torch.device, dtype: torch.dtype
) -> dict[str, float]:
    """Metric values that do not depend on training: the candidate's own, the parameter
    count and the latency (median of one-sample forwards, ms)."""
    values = {name: float(v) for name, v in proposal.candidate.metrics.items()}
    if "params" in metrics:
        values.setdefault("params", float(count_parameters(proposal.shell)))  # shapes suffice: the meta-device model
    if "latency_ms" in metrics and "latency_ms" not in values:
        model = proposal.build().to(device=device, dtype=dtype).eval()
        values["latency_ms"] = _latency_ms(model, proposal.candidate.data.x_val[:1].to(device, dtype))
    return values


def _latency_ms(model: torch.nn.Module, x: torch.Tensor, repeats: int = 20) -> float:
    with torch.no_grad():
        for _ in range(3):
            model(x)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - start)
    return float(np.median(times) * 1000)
