"""What a search's `build(trial)` returns, and what the search keeps per asked trial.

A `Candidate` is one model to train and how to train it. The user's
`build(trial)` calls `trial.suggest_*` as in any Optuna objective and returns
one; the search builds every candidate's model on the meta device (shapes only,
no memory, no random numbers) to pack candidates into arrays, then builds the
real models with each trial's own seeds to train them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
import torch
from torch import nn

from hfta_nas._limits import MAX_BATCH_SIZE, MAX_EPOCHS
from hfta_nas.data import Augmentation, Dataset
from hfta_nas.errors import HftaNasError
from hfta_nas.optim import OPTIMIZERS, SCHEDULE_KINDS
from hfta_nas.training._objectives import REGRESSION_LOSSES, Objective
from hfta_nas.training._trainer import EarlyStopping, TrainingSettings


@dataclass
class Candidate:
    """One model to train and its training settings.

    - model: a function of no arguments that returns a fresh `nn.Module`
      (`lambda: MyNet(width)`, `functools.partial(MyNet, width)`); the search
      calls it under each trial's init seed.
    - optimizer, hparams: an optimizer of `hfta_nas.optim.OPTIMIZERS` and its
      hyper-parameters (lr, weight_decay, momentum, beta1, beta2, ... differ per
      slot; flags such as nesterov or amsgrad are shared by an array).
    - schedule: None, or `{"kind": "cosine", ...}` (`hfta_nas.optim.LRSchedule` arguments).
    - epochs, batch_size: shared by an array.
    - accumulate: micro-batches per optimizer step; early_stopping: an
      `hfta_nas.EarlyStopping` each slot follows (a stopped slot completes and is
      refilled); augmentation: an `hfta_nas.data.Augmentation` of each slot's
      batches from its data seed; precision: float32, bf16 or fp16 (autocast; fp16
      with per-slot loss scaling); all four shared by an array. Per-slot gradient clipping is an
      optimizer hyper-parameter (`clip_norm`, `clip_value`).
    - data: the `Dataset` to train on (default: the one given to `optimize`).
    - loss: an `hfta_nas.Objective` (a built-in loss with its options and user
      metrics), or `loss(output, y, reduction="none")` per-sample losses, as
      `F.cross_entropy` (the default) takes them.
    - metrics: values known without training (say a latency you measured) for
      objectives of those names; `params` (the parameter count) is always known.
    - config: what the best trial's export writes as `best_config.yaml`: an
      object with `to_yaml(**origin)`, a mapping, or None (weights only).
    """

    model: Callable[[], nn.Module]
    optimizer: str = "adam"
    hparams: Mapping[str, Any] = field(default_factory=dict)
    schedule: Mapping[str, Any] | None = None
    epochs: int = 5
    batch_size: int = 100
    data: Dataset | None = None
    loss: Objective | Callable[..., torch.Tensor] | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    config: Any = None
    accumulate: int = 1
    early_stopping: EarlyStopping | None = None
    augmentation: Augmentation | None = None
    precision: str = "float32"

    def checked(self, default_data: Dataset | None) -> Candidate:
        """This candidate with its data filled in; HftaNasError naming the first bad field."""
        if isinstance(self.model, nn.Module) or not callable(self.model):
            raise HftaNasError(
                "Candidate.model must be a function that returns a new model "
                f"(e.g. lambda: MyNet(...)), got {type(self.model).__name__}."
            )
        if self.optimizer not in OPTIMIZERS:
            raise HftaNasError(f"Candidate.optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}.")
        known = {*OPTIMIZERS[self.optimizer].defaults, *OPTIMIZERS[self.optimizer].flags}
        if "beta1" in known:
            known.add("betas")
        unknown = sorted(set(self.hparams) - known)
        if unknown:
            raise HftaNasError(
                f"optimizer '{self.optimizer}' has no hyper-parameter {unknown[0]!r}; "
                f"it has {', '.join(sorted(known))}."
            )
        for name, value, most in (
            ("epochs", self.epochs, MAX_EPOCHS),
            ("batch_size", self.batch_size, MAX_BATCH_SIZE),
            ("accumulate", self.accumulate, None),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise HftaNasError(f"Candidate.{name} must be a positive integer, got {value!r}.")
            if most is not None and value > most:
                raise HftaNasError(f"Candidate.{name} must be at most {most:,}, got {value!r}.")
        if self.schedule is not None and self.schedule.get("kind") not in SCHEDULE_KINDS:
            raise HftaNasError(
                f"Candidate.schedule needs a 'kind' in {', '.join(SCHEDULE_KINDS)}, got {dict(self.schedule)!r}."
            )
        if self.early_stopping is not None and not isinstance(self.early_stopping, EarlyStopping):
            raise HftaNasError(
                f"Candidate.early_stopping must be an hfta_nas.EarlyStopping, got {self.early_stopping!r}."
            )
        data = self.data if self.data is not None else default_data
        if not isinstance(data, Dataset):
            raise HftaNasError("no data: give optimize(..., data=Dataset) or Candidate(data=Dataset).")
        for name, value in self.metrics.items():
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise HftaNasError(f"Candidate.metrics[{name!r}] must be a finite number, got {value!r}.")
        return Candidate(
            self.model,
            self.optimizer,
            dict(self.hparams),
            dict(self.schedule) if self.schedule else None,
            self.epochs,
            self.batch_size,
            data,
            self.loss,
            dict(self.metrics),
            self.config,
            self.accumulate,
            self.early_stopping,
            self.augmentation,
            self.precision,
        )

    def training_settings(self) -> TrainingSettings:
        """The settings an array of this candidate trains with (shared by the array)."""
        return TrainingSettings(
            self.batch_size, self.accumulate, self.early_stopping, self.loss, self.augmentation, self.precision
        )

    def flags(self) -> dict[str, bool]:
        """The optimizer options one array shares (nesterov, amsgrad, ...), defaults filled in."""
        return {
            name: bool(self.hparams.get(name, default)) for name, default in OPTIMIZERS[self.optimizer].flags.items()
        }

    def slot_hparams(self) -> dict[str, float]:
        """The hyper-parameters an array keeps per slot; `betas` as beta1 / beta2."""
        hparams = {k: v for k, v in self.hparams.items() if k not in OPTIMIZERS[self.optimizer].flags}
        if "betas" in hparams:
            hparams["beta1"], hparams["beta2"] = hparams.pop("betas")
        return hparams

    def shared_settings(self) -> tuple:
        """What every slot of one array has in common besides fusable models: data,
        batch size, epochs, optimizer class and flags, loss, whether it schedules."""
        loss = self.loss.describe() if isinstance(self.loss, Objective) else self.loss  # an Objective holds lists
        return (id(self.data), *self.stable_settings()[1:], loss)

    def stable_settings(self) -> tuple:
        """`shared_settings` by name instead of object identity (the same in every run)."""
        return (
            getattr(self.data, "name", None),
            self.batch_size,
            self.epochs,
            self.optimizer,
            tuple(sorted(self.flags().items())),
            self.schedule is not None,
            self.loss_name(),
            self.accumulate,
            repr(self.early_stopping),
            repr(self.augmentation),
            self.precision,
        )

    def loss_name(self) -> Any:
        """The loss by name (an Objective's description, a function's qualified name; None: the default)."""
        if isinstance(self.loss, Objective):
            return self.loss.describe()
        return getattr(self.loss, "__qualname__", repr(self.loss)) if self.loss is not None else None


def built(build: Callable[[optuna.Trial], Any], trial: optuna.Trial) -> Any:
    """`build(trial)`, its errors as one HftaNasError line."""
    try:
        return build(trial)
    except HftaNasError:
        raise
    except SystemExit as exit_:  # user code must not end the process without the trials told
        raise HftaNasError(f"build(trial) called sys.exit({exit_.code!r})") from None
    except Exception as error:  # noqa: BLE001 - the user's build function
        raise HftaNasError(f"build(trial) raised {type(error).__name__}: {error}") from error


def as_candidate(candidate: Any) -> Candidate:
    """`candidate` if it is one, else the HftaNasError a build returning something else gets."""
    if not isinstance(candidate, Candidate):
        raise HftaNasError(f"build(trial) must return a hfta_nas.Candidate, got {type(candidate).__name__}.")
    return candidate


def check_split_has_data(candidate: Candidate, metric: str) -> None:
    """HftaNasError when a trained metric of the validation or test split has no samples to be measured on."""
    split = metric.split("_", 1)[0]
    if split in ("val", "test") and len(getattr(candidate.data, f"y_{split}")) == 0:
        name = {"val": "validation", "test": "test"}[split]
        raise HftaNasError(
            f"metric '{metric}' needs {name} data, but the data has no {name} samples "
            f"(a {split}_fraction of 0?); give the split samples or choose another metric."
        )


def trial_seeds(base_seed: int, trial_number: int) -> dict[str, int]:
    """Independent init / data / dropout seeds for a trial, from the search's seed."""
    states = np.random.SeedSequence([base_seed, trial_number]).spawn(3)
    return {
        source: int(s.generate_state(1, dtype=np.uint32)[0]) for source, s in zip(("init", "data", "dropout"), states)
    }


@dataclass
class Proposal:
    """One asked trial: its candidate, seeds, and its model on the meta device."""

    trial: optuna.Trial
    candidate: Candidate
    seeds: dict[str, int]
    shell: nn.Module  # the model on the meta device: shapes for packing, no memory
    useful_macs: int  # multiply-adds per sample of one forward of its own model
    reported: set[int] = field(default_factory=set)  # epochs reported (a retry after out-of-memory repeats them)
    apart: str | None = None  # why it trains in an array of its own (its array's check refused its place)

    @property
    def number(self) -> int:
        return self.trial.number

    def build(self) -> nn.Module:
        """The real model, initialised from the trial's init seed (the global RNG is left as it was);
        HftaNasError when it is not the model its meta-device build promised."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seeds["init"])
            model = self.candidate.model()
        built, promised = tensor_shapes(model), tensor_shapes(self.shell)
        if built != promised:
            difference = next(
                (f"{a} vs {b}" for a, b in zip(built, promised) if a != b), f"{len(built)} vs {len(promised)} tensors"
            )
            raise HftaNasError(
                f"the model factory built different models on different calls (one per seed): {difference}; "
                "a candidate's model function must build the same architecture every time"
            )
        return model

    @property
    def steps(self) -> int:
        """Training steps of this candidate: epochs x batches per epoch."""
        data = self.candidate.data
        return self.candidate.epochs * math.ceil(len(data.y_train) / self.candidate.batch_size)


def tensor_shapes(model: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter and buffer."""
    return [(n, tuple(t.shape)) for n, t in [*model.named_parameters(), *model.named_buffers()]]


def meta_shell(candidate: Candidate) -> nn.Module:
    """The candidate's model on the meta device (a model that reads tensor values while
    it is built cannot be: it is built on the CPU, its random numbers not drawn globally)."""
    with torch.random.fork_rng(devices=[]):
        try:
            with torch.device("meta"):
                model = candidate.model()
        except SystemExit as exit_:
            raise HftaNasError(
                f"Candidate.model() called sys.exit({exit_.code!r}); a model function must "
                "return a model (or raise an error)"
            ) from None
        except Exception:  # noqa: BLE001 - `.item()` or `int(t)` in a user's constructor
            try:
                model = candidate.model()
            except Exception as error:  # noqa: BLE001 - the user's model function
                raise HftaNasError(f"Candidate.model() raised {type(error).__name__}: {error}") from error
    if not isinstance(model, nn.Module):
        raise HftaNasError(f"Candidate.model() returned a {type(model).__name__}, not a torch.nn.Module.")
    return model.to("meta")


def example_input(candidate: Candidate) -> torch.Tensor:
    """One sample of the candidate's data, on the meta device (shapes only)."""
    return torch.empty(1, *candidate.data.input_shape, device="meta")


def check_outputs(candidate: Candidate, shell: nn.Module, x: torch.Tensor) -> None:
    """The model returns one tensor of per-sample outputs, and with the default loss
    (cross-entropy) one logit per class of the data: else HftaNasError, before anything trains.
    A model that cannot run on the meta device is checked when its array is built."""
    try:
        with torch.no_grad():
            out = shell(x)
    except Exception:  # noqa: BLE001 - data-dependent code cannot run on the meta device
        return
    if not isinstance(out, torch.Tensor):
        raise HftaNasError(
            f"the model must return one tensor of outputs per sample, but it returned a {type(out).__name__}."
        )
    classes = candidate.data.num_classes
    built_in = candidate.loss.loss if isinstance(candidate.loss, Objective) else None
    if (candidate.loss is None or built_in == "cross_entropy") and (
        out.dim() < 2 or out.shape[0] != len(x) or out.shape[1] != classes
    ):
        raise HftaNasError(
            f"the model returns outputs of shape {list(out.shape)} for a batch of {len(x)}, but the "
            f"loss (cross-entropy) needs "
            f"[{len(x)}, {classes}, ...]: one logit per class of the data ({classes} classes) in dimension 1."
        )
    if built_in in REGRESSION_LOSSES and (out.dim() < 1 or out.shape[0] != len(x) or out[0].numel() != classes):
        raise HftaNasError(
            f"the model returns outputs of shape {list(out.shape)} for a batch of {len(x)}, but the "
            f"loss ({built_in}) needs [{len(x)}, {classes}]: one output per target of the data."
        )
