"""`ArrayTrainer`: the training loop of a ModelArray, read top to bottom.

One epoch: each slot walks the training set in its own order (its data seed)
or all share one order; every step gathers the batch as [B, N, ...], runs the
fused forward, sums the slots' own mean losses (so each slot gets exactly the
gradient it would get alone, contract 6) and takes one array optimizer step.
Metrics accumulate on the device; the host synchronises once per epoch, when
it evaluates every slot, checks for divergence and calls the caller back.

Slots are addressed by stable ids (their position at start, or the id given
when a slot is refilled), so results survive drops and replacements.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from hfta_nas._time_account import NoAccount, TimeAccount
from hfta_nas.array._model_array import ModelArray
from hfta_nas.data import Augmentation, Dataset, EpochOrder, SlotAugmenter, SlotSplits, gather
from hfta_nas.errors import HftaNasError
from hfta_nas.optim import ArrayOptimizer, LRSchedule, SlotGradScaler
from hfta_nas.training._objectives import Objective, as_objective, higher_is_better

PRECISIONS = ("float32", "bf16", "fp16")


@dataclass
class SlotResult:
    """Everything the trainer knows about one slot when it ends (or now)."""

    slot_id: Any
    status: str = "running"  # running -> completed | stopped | failed
    reason: str = ""
    epochs: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    best: float | None = None  # early stopping: the best value of its metric so far
    since_best: int = 0  # early stopping: epochs since that value

    @property
    def final(self) -> dict[str, float]:
        return self.history[-1] if self.history else {}


@dataclass(frozen=True)
class EarlyStopping:
    """Stop a slot (it completes, its epoch count short) when `metric` has not improved by
    more than `min_delta` for `patience` epochs; `mode` "min" or "max" (default: "max" for
    accuracy and R^2, else "min"). Each slot on its own, as a Keras or Lightning
    EarlyStopping callback on that model alone would."""

    metric: str = "val_loss"
    patience: int = 3
    min_delta: float = 0.0
    mode: str | None = None  # default: max for accuracy and R^2 (`hfta_nas.higher_is_better`), else min

    def __post_init__(self) -> None:
        if not isinstance(self.patience, int) or isinstance(self.patience, bool) or self.patience < 1:
            raise HftaNasError(f"early stopping patience must be an integer >= 1, got {self.patience!r}.")
        if not (isinstance(self.min_delta, (int, float)) and math.isfinite(self.min_delta) and self.min_delta >= 0):
            raise HftaNasError(f"early stopping min_delta must be a finite number >= 0, got {self.min_delta!r}.")
        if self.mode not in (None, "min", "max"):
            raise HftaNasError(f"early stopping mode must be 'min' or 'max', got {self.mode!r}.")

    @property
    def maximize(self) -> bool:
        return self.mode == "max" if self.mode is not None else higher_is_better(self.metric)

    def update(self, result: SlotResult, value: float) -> bool:
        """Record this epoch's value in `result`; True when the slot should stop."""
        better = result.best is None or (
            value > result.best + self.min_delta if self.maximize else value < result.best - self.min_delta
        )
        if better:
            result.best, result.since_best = value, 0
        else:
            result.since_best += 1
        return result.since_best >= self.patience


@dataclass
class EpochReport:
    """Per-slot metrics of one epoch, handed to the caller's callback."""

    epoch: int
    metrics: dict[Any, dict[str, float]]  # slot id -> {"train_loss", "val_loss", "val_acc", ...}
    failed: dict[Any, str]  # slot ids that diverged this epoch -> reason
    seconds: float


def _add(sums: dict[str, torch.Tensor], more: dict[str, torch.Tensor]) -> None:
    for key, value in more.items():
        sums[key] = sums[key] + value if key in sums else value


@dataclass(frozen=True)
class TrainingSettings:
    """How every slot of one array trains, beyond its optimizer and schedule: what `hfta_nas.train`
    and a search's candidates both hand to `ArrayTrainer` (one spelling of these options)."""

    batch_size: int = 100
    accumulate: int = 1
    early_stopping: EarlyStopping | None = None
    loss: Objective | Callable[..., torch.Tensor] | str | None = None  # None: cross-entropy
    augmentation: Augmentation | None = None
    precision: str = "float32"

    def trainer_kwargs(self) -> dict[str, Any]:
        """These settings as `ArrayTrainer` keyword arguments."""
        return {
            "batch_size": self.batch_size,
            "accumulate": self.accumulate,
            "early_stopping": self.early_stopping,
            "loss_fn": self.loss if self.loss is not None else F.cross_entropy,
            "augmentation": self.augmentation,
            "precision": self.precision,
        }


class ArrayTrainer:
    """Trains an array with its optimizer (and schedule) on a Dataset.

    `accumulate`: k micro-batches of `batch_size` per optimizer step, each
    contributing loss / k (the last step of an epoch takes what is left), as a
    plain loop calling `(loss / k).backward()` and stepping every k batches.
    `early_stopping`: stop each slot on its own when its metric stalls (a stopped
    slot completes; a search refills it). `augmentation`: each slot's training
    batches augmented on the device from its own data seed (`hfta_nas.data.Augmentation`).
    `precision`: "float32", "bf16" (autocast; float32 weights and optimizer) or "fp16"
    (autocast with per-slot loss scaling: a slot whose gradient overflows skips only its step).

    `data_seeds`: one per slot (each slot its own shuffling, as a DataLoader
    with `generator=torch.Generator().manual_seed(seed)` would) or None with
    `shared_order_seed` for one order shared by all slots (cheaper: one batch
    is broadcast to every slot).

    `splits`: each slot's own train / validation rows of `data`'s train set
    (`hfta_nas.data.pooled` and `slot_splits`); slot b then trains on
    `data.x_train[splits.train[b]]` in its own order and is validated on
    `data.x_train[splits.val[b]]`. Needs per-slot orders; slots cannot be refilled.
    """

    def __init__(
        self,
        array: ModelArray,
        optimizer: ArrayOptimizer,
        data: Dataset,
        *,
        batch_size: int = 100,
        data_seeds: Sequence[int] | None = None,
        shared_order_seed: int | None = None,
        schedule: LRSchedule | None = None,
        schedule_interval: str = "epoch",
        eval_batch_size: int = 1000,
        evaluate_test: bool = True,
        slot_ids: Sequence[Any] | None = None,
        loss_fn: Objective | Callable[..., torch.Tensor] | str = F.cross_entropy,
        splits: SlotSplits | None = None,
        accumulate: int = 1,
        early_stopping: EarlyStopping | None = None,
        augmentation: Augmentation | None = None,
        precision: str = "float32",
    ) -> None:
        if optimizer.array is not array:
            raise HftaNasError("the optimizer was built for a different ModelArray.")
        if schedule is not None and schedule.optimizer is not optimizer:
            raise HftaNasError("the schedule was built for a different optimizer.")
        if schedule_interval not in ("epoch", "step"):
            raise HftaNasError(f"schedule_interval must be 'epoch' or 'step', got {schedule_interval!r}.")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise HftaNasError(f"batch_size must be a positive integer, got {batch_size!r}.")
        if not isinstance(accumulate, int) or isinstance(accumulate, bool) or accumulate < 1:
            raise HftaNasError(f"accumulate must be a positive integer (micro-batches per step), got {accumulate!r}.")
        if early_stopping is not None and not isinstance(early_stopping, EarlyStopping):
            raise HftaNasError(f"early_stopping must be an EarlyStopping, got {type(early_stopping).__name__}.")
        self.accumulate, self.early_stopping = accumulate, early_stopping
        if precision not in PRECISIONS:
            raise HftaNasError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}.")
        self.precision = precision
        # float16 overflows where float32 does not: each slot its own loss scale (SlotGradScaler)
        self.scaler = SlotGradScaler(optimizer) if precision == "fp16" else None
        if data_seeds is not None and shared_order_seed is not None:
            raise HftaNasError("give either data_seeds (one order per slot) or shared_order_seed, not both.")
        if data_seeds is None and shared_order_seed is None:
            data_seeds = list(range(len(array)))
        if splits is not None and (shared_order_seed is not None or splits.train.shape[0] != len(array)):
            raise HftaNasError("per-slot splits need one split and one data order per slot (not a shared order).")
        self.splits = splits
        self.array, self.optimizer, self.schedule, self.data = array, optimizer, schedule, data
        self.schedule_interval = schedule_interval
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.evaluate_test = evaluate_test
        self.objective = as_objective(loss_fn)
        self.shared_order = shared_order_seed is not None
        self.order = EpochOrder(
            splits.train.shape[1] if splits is not None else len(data.y_train),
            batch_size,
            None if self.shared_order else list(data_seeds),
            shared_seed=shared_order_seed,
            device=data.x_train.device,
        )
        self.augmenter = None
        if augmentation is not None and augmentation.active:
            seeds = [shared_order_seed] if self.shared_order else list(data_seeds)
            self.augmenter = SlotAugmenter(augmentation, seeds, device=data.x_train.device)
        self.slot_ids: list[Any] = list(slot_ids) if slot_ids is not None else list(range(len(array)))
        if len(self.slot_ids) != len(array):
            raise HftaNasError(f"slot_ids has {len(self.slot_ids)} entries but the array has {len(array)} slots.")
        self.results: dict[Any, SlotResult] = {sid: SlotResult(sid) for sid in self.slot_ids}
        self.epoch = 0
        # Which slot each current slot started as: a checkpoint names the array it came
        # from by `initial_ids`, and `restore` rebuilds refills and drops from `origins`.
        self.initial_ids = list(self.slot_ids)
        self.origins = list(range(len(self.slot_ids)))

    # ---------------------------------------------------------------- the loop
    def fit(
        self,
        epochs: int,
        on_epoch: Callable[[EpochReport, ArrayTrainer], Any] | None = None,
        checkpoint: Callable[[ArrayTrainer], Any] | None = None,
        account: TimeAccount | NoAccount | None = None,
    ) -> dict[Any, SlotResult]:
        """Train every slot for `epochs` epochs of its own.

        After each epoch, `on_epoch(report, trainer)` may stop slots
        (`trainer.stop`) or refill them (`trainer.replace`); a refilled slot
        trains its own `epochs` epochs, so the loop runs while any slot does.
        Slots that completed and were not refilled leave the array; failed
        slots stay frozen in place so the others' numbers do not change.
        `checkpoint(trainer)` is called at the end of every epoch, when
        `state_dict()` holds everything a re-run needs to `restore` from.
        A restored trainer continues from its epoch. `account` (a TimeAccount) is
        charged the epochs' training steps and evaluation.
        """
        for report in self.epochs(epochs, account):
            if on_epoch is not None:
                on_epoch(report, self)
            self.leave_finished()
            if checkpoint is not None:
                checkpoint(self)
        return self.results

    def epochs(self, epochs: int, account: TimeAccount | NoAccount | None = None) -> Iterator[EpochReport]:
        """`fit` as a loop the caller drives: each epoch's report is yielded, and until the caller
        asks for the next one it may stop, refill and checkpoint slots (`leave_finished` first)."""
        if not isinstance(epochs, int) or epochs < 0:
            raise HftaNasError(f"epochs must be a non-negative integer, got {epochs!r}.")
        account = account or NoAccount()
        while epochs > 0 and self._running():
            started = time.perf_counter()
            with account.phase("training"):
                metrics = self._train_one_epoch()
            with account.phase("evaluation"):
                metrics.update(self.evaluate())
                report = self._record_epoch(metrics, time.perf_counter() - started)
            for sid in self._running():
                if self.results[sid].epochs >= epochs:
                    self.results[sid].status = "completed"
            yield report
            self.leave_finished()

    def leave_finished(self) -> None:
        """Slots that completed or were stopped (and not refilled) leave the array while others run."""
        finished = [sid for sid in self.slot_ids if self.results[sid].status in ("completed", "stopped")]
        if finished and self._running():
            self.stop(finished)

    def _running(self) -> list[Any]:
        return [sid for sid in self.slot_ids if self.results[sid].status == "running"]

    def _train_one_epoch(self) -> dict[str, torch.Tensor]:
        self.array.train()
        x_all, y_all = self.data.x_train, self.data.y_train
        loss_sum = torch.zeros(len(self.array), dtype=torch.float64, device=x_all.device)
        loss_count = torch.zeros_like(loss_sum)
        sums: dict[str, torch.Tensor] = {}
        batches = list(self.order.next_epoch())
        for number, index in enumerate(batches):
            if self.splits is not None:  # positions in each slot's own train rows -> rows of the pool
                index = torch.gather(self.splits.train, 1, index)
            x, y = gather(x_all, index), gather(y_all, index)
            mixed = self.augmenter(x, y, shared=self.shared_order) if self.augmenter is not None else None
            if mixed is not None:
                x = mixed.x
            with self._autocast():
                logits = self.array(x, shared_input=self.shared_order)
                if self.shared_order:
                    y = y.expand(len(self.array), *y.shape)
                total, count = self.objective.slot_losses(logits, y)
                if mixed is not None and mixed.y_partner is not None:  # mixup / cutmix: the loss mixed as the inputs
                    partner = mixed.y_partner.expand_as(y) if self.shared_order else mixed.y_partner
                    total_partner, _ = self.objective.slot_losses(logits, partner)
                    strength = mixed.strength.to(total.dtype)
                    total = strength * total + (1 - strength) * total_partner
            losses = total / count
            if number % self.accumulate == 0:
                self.optimizer.zero_grad()
            scaled = self.scaler.scale(losses) if self.scaler is not None else losses
            (scaled.sum() / self.accumulate if self.accumulate > 1 else scaled.sum()).backward()
            if (number + 1) % self.accumulate == 0 or number + 1 == len(batches):
                if self.scaler is not None:
                    self.scaler.step()
                    self.scaler.update()
                else:
                    self.optimizer.step()
                if self.schedule is not None and self.schedule_interval == "step":
                    self.schedule.step()
            loss_sum += total.detach().to(torch.float64)
            loss_count += count.detach().to(torch.float64)
            _add(sums, self.objective.metric_sums(logits.detach(), y))
        if self.schedule is not None and self.schedule_interval == "epoch":
            self.schedule.step()
        return {"train_loss": loss_sum / loss_count, **self.objective.finish("train", sums)}

    def slot_losses(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """[B] each slot's own loss (its mean over its batch)."""
        total, count = self.objective.slot_losses(logits, y)
        return total / count

    @torch.no_grad()
    def evaluate(self) -> dict[str, torch.Tensor]:
        """Loss and metrics (accuracy; RMSE, MAE, R^2 for regression; the user's) of every slot on
        validation (and test) data: [B] tensors."""
        self.array.eval()
        parts = [("val", self.data.x_val, self.data.y_val, None)]
        if self.splits is not None:  # each slot its own validation rows of the pool
            parts = [("val", self.data.x_train, self.data.y_train, self.splits.val)]
        if self.evaluate_test:
            parts.append(("test", self.data.x_test, self.data.y_test, None))
        metrics = {}
        for name, x_all, y_all, rows in parts:
            count = len(y_all) if rows is None else rows.shape[1]
            if count == 0:
                continue
            loss_sum = torch.zeros(len(self.array), dtype=torch.float64, device=x_all.device)
            loss_count = torch.zeros_like(loss_sum)
            sums: dict[str, torch.Tensor] = {}
            for start in range(0, count, self.eval_batch_size):
                with self._autocast():
                    if rows is None:  # the same samples for every slot
                        x, y = x_all[start : start + self.eval_batch_size], y_all[start : start + self.eval_batch_size]
                        logits = self.array(x, shared_input=True)
                        y = y.expand(len(self.array), *y.shape)
                    else:
                        index = rows[:, start : start + self.eval_batch_size]
                        x, y = gather(x_all, index), gather(y_all, index)
                        logits = self.array(x)
                total, counted = self.objective.slot_losses(logits, y)
                loss_sum += total.to(torch.float64)
                loss_count += counted.to(torch.float64)
                _add(sums, self.objective.metric_sums(logits, y))
            metrics[f"{name}_loss"] = loss_sum / loss_count
            metrics.update(self.objective.finish(name, sums))
        return metrics

    def _record_epoch(self, metrics: dict[str, torch.Tensor], seconds: float) -> EpochReport:
        """The one host synchronisation per epoch: metrics, divergence checks, history."""
        self.epoch += 1
        weights_finite = torch.isfinite(self.array.flat.detach()).all(dim=1)
        host = {name: value.tolist() for name, value in metrics.items()}
        finite = weights_finite.tolist()
        per_slot, failed = {}, {}
        for position, sid in enumerate(self.slot_ids):
            result = self.results[sid]
            if result.status != "running":
                continue
            row = {name: values[position] for name, values in host.items()}
            row["epoch"] = self.epoch
            row["lr"] = float(self.optimizer.hparams["lr"][position])
            result.history.append(row)
            result.epochs += 1
            per_slot[sid] = row
            if not math.isfinite(row["train_loss"]) or not finite[position]:
                what = "loss" if not math.isfinite(row["train_loss"]) else "weights"
                reason = f"{what} became non-finite (NaN/inf) in epoch {self.epoch}"
                self._fail(position, reason)
                failed[sid] = reason
            elif self.early_stopping is not None and self._stalled(result, row):
                result.status = "completed"
                result.reason = (
                    f"early stopped: {self.early_stopping.metric} did not improve for "
                    f"{self.early_stopping.patience} epochs"
                )
        return EpochReport(self.epoch, per_slot, failed, seconds)

    def _autocast(self) -> Any:
        """Mixed precision's autocast on the data's device (nothing for float32)."""
        if self.precision == "float32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(device_type=self.data.x_train.device.type, dtype=dtype)

    def _stalled(self, result: SlotResult, row: dict[str, float]) -> bool:
        stopping = self.early_stopping
        if stopping.metric not in row:
            raise HftaNasError(
                f"early stopping watches '{stopping.metric}', which is not measured; measured: "
                f"{', '.join(k for k in row if k not in ('epoch', 'lr'))}."
            )
        return stopping.update(result, row[stopping.metric])

    def _fail(self, position: int, reason: str) -> None:
        # The slot stays in the array (frozen) so the others keep exactly the
        # same array size and numbers; callers may drop it with `stop`.
        result = self.results[self.slot_ids[position]]
        result.status, result.reason = "failed", reason
        self.optimizer.freeze_slot(position)

    # ------------------------------------------------------------- slot surgery
    def position_of(self, slot_id: Any) -> int:
        try:
            return self.slot_ids.index(slot_id)
        except ValueError:
            raise HftaNasError(f"no slot with id {slot_id!r} in this array (ids: {self.slot_ids}).") from None

    def stop(self, slot_ids: Iterable[Any], reason: str = "stopped by caller") -> None:
        """Remove slots from the array (pruned or failed); the rest train on unchanged."""
        slot_ids = list(slot_ids)
        positions = [self.position_of(sid) for sid in slot_ids]
        for sid in slot_ids:
            if self.results[sid].status == "running":
                self.results[sid].status, self.results[sid].reason = "stopped", reason
        if len(positions) == len(self.slot_ids):
            self.slot_ids, self.origins = [], []
            return
        keep = self.array.drop_slots(positions)
        if not self.shared_order:
            self.order.drop_slots(keep)
            if self.augmenter is not None:
                self.augmenter.keep_slots(keep)
        if self.splits is not None:
            self.splits = self.splits.keep(keep)
        self.slot_ids = [self.slot_ids[b] for b in keep]
        self.origins = [self.origins[b] for b in keep]

    def replace(
        self,
        old_id: Any,
        new_id: Any,
        model: nn.Module,
        *,
        data_seed: int | None = None,
        dropout_seed: int | None = None,
        hparams: dict[str, float] | None = None,
        schedule_params: dict[str, Any] | None = None,
    ) -> None:
        """Refill a slot with a fresh model and hyper-parameters: fresh optimizer
        state, schedule position 0 and its own data order from `data_seed`."""
        if new_id in self.results:
            raise HftaNasError(f"slot id {new_id!r} is already used in this array.")
        if self.splits is not None:
            raise HftaNasError("slots with their own train/validation splits cannot be refilled.")
        position = self.position_of(old_id)
        if self.results[old_id].status == "running":
            self.results[old_id].status, self.results[old_id].reason = "stopped", "replaced"
        self.array.replace_slot(position, model, dropout_seed=dropout_seed)
        if hparams:
            self.optimizer.set_hparams(position, **hparams)
        if schedule_params:
            if self.schedule is None:
                raise HftaNasError("schedule_params given but this trainer has no schedule.")
            self.schedule.set_params(position, **schedule_params)
        if not self.shared_order:
            self.order.replace_slot(position, data_seed if data_seed is not None else position)
            if self.augmenter is not None:
                self.augmenter.replace_slot(position, data_seed if data_seed is not None else position)
        self.slot_ids[position] = new_id
        self.results[new_id] = SlotResult(new_id)

    def copy_slot(self, source_id: Any, target_id: Any) -> None:
        """Population-based training's exploit: the slot `target_id` becomes a copy of `source_id`
        (weights, buffers, optimizer state and hyper-parameters, schedule position, loss scale, dropout
        counters, data order and augmentation streams), so from here it trains exactly as the source
        would. It keeps its own id and results; no other slot is touched."""
        if self.splits is not None:
            raise HftaNasError("slots with their own train/validation splits cannot be copied onto each other.")
        source, target = self.position_of(source_id), self.position_of(target_id)
        for sid in (source_id, target_id):
            if self.results[sid].status != "running":
                raise HftaNasError(f"slot {sid!r} is {self.results[sid].status}; only running slots are copied.")
        if source == target:
            return
        self.array.copy_slot(source, target)
        self.order.copy_slot(source, target)
        if self.augmenter is not None and not self.shared_order:
            self.augmenter.copy_slot(source, target)

    # ------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything that changes while the array trains, at an epoch's end: the slots (which
        array they came from, refills, drops), results, weights, buffers, dropout counters,
        optimizer and schedule state and where each data order stands."""
        state: dict[str, Any] = {
            "epoch": self.epoch,
            "initial_ids": list(self.initial_ids),
            "slot_ids": list(self.slot_ids),
            "origins": list(self.origins),
            "results": {sid: dataclasses.asdict(r) for sid, r in self.results.items()},  # copies the history
        }
        if self.slot_ids:
            state["array"] = self.array.numeric_state()
            state["optimizer"] = self.optimizer.state_dict()
            state["schedule"] = self.schedule.state_dict() if self.schedule is not None else None
            state["order"] = self.order.state_dict()
            state["augmenter"] = self.augmenter.state_dict() if self.augmenter is not None else None
            state["scaler"] = self.scaler.state_dict() if self.scaler is not None else None
        return state

    def restore(
        self, state: dict[str, Any], build: Callable[[Any], tuple[nn.Module, dict[str, Any]]] | None = None
    ) -> None:
        """Continue from `state_dict()` of a trainer built like this one (same initial slots, not
        yet trained): slots refilled since are refilled again with `build(slot_id)` -> (model,
        `replace` keyword arguments), slots that ended are dropped, then every number is put back,
        so the next epochs are bit-identical to those of the trainer that saved it."""
        if self.epoch != 0 or state["initial_ids"] != self.initial_ids:
            raise HftaNasError(
                f"the checkpoint is of another array (slots {state['initial_ids']}, this one {self.initial_ids})."
            )
        for sid, origin in zip(state["slot_ids"], state["origins"]):
            if sid != self.initial_ids[origin]:
                if build is None:
                    raise HftaNasError(f"slot {origin} was refilled with {sid!r}, but no build function was given.")
                model, options = build(sid)
                self.replace(self.initial_ids[origin], sid, model, **options)
        ended = [sid for sid in self.slot_ids if sid not in state["slot_ids"]]
        if ended:
            self.stop(ended, reason="ended before the checkpoint")
        if self.slot_ids != state["slot_ids"]:
            raise HftaNasError(
                f"the checkpoint's slots {state['slot_ids']} could not be rebuilt (got {self.slot_ids})."
            )
        if self.slot_ids:
            self.array.load_numeric_state(state["array"])
            self.optimizer.load_state_dict(state["optimizer"])
            if self.schedule is not None:
                self.schedule.load_state_dict(state["schedule"])
            self.order.load_state_dict(state["order"])
            if self.augmenter is not None and state.get("augmenter") is not None:
                self.augmenter.load_state_dict(state["augmenter"])
            if self.scaler is not None and state.get("scaler") is not None:
                self.scaler.load_state_dict(state["scaler"])
        self.results = {sid: SlotResult(**r) for sid, r in state["results"].items()}
        self.epoch = state["epoch"]
