"""What the slots of an array minimise and what is measured of them: the loss and the metrics.

Every quantity is computed per slot from the [B, N, ...] outputs and targets of
one step, as sums with their counts, so that a slot's loss of a batch, and its
metrics over a split, are exactly those of its model trained and evaluated
alone (the per-batch mean loss of plain PyTorch; masked or class-weighted
means divide by what is present, or by the weights, as torch does).

Classification (`cross_entropy`, optionally with `label_smoothing` and
`class_weights`; `masked`: targets of -100 are missing, torch's ignore_index)
reports `<split>_loss` and `<split>_acc`. Regression (`mse`, `mae`, `huber`
with `delta`; `masked`: NaN targets are missing) reports `<split>_loss`,
`<split>_rmse`, `<split>_mae` and `<split>_r2` (R^2 averaged over targets, as
sklearn's r2_score). A user loss is `f(output, target, reduction="none")`
returning per-sample losses, as torch's functional losses do; a user metric
`f(output, target)` returns per-sample values, averaged over the split.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn import functional as F

from hfta_nas.errors import HftaNasError

CLASSIFICATION_LOSSES = ("cross_entropy",)
REGRESSION_LOSSES = ("mse", "mae", "huber")
LOSSES = CLASSIFICATION_LOSSES + REGRESSION_LOSSES
IGNORE_INDEX = -100


def loss_kind(loss: str | Callable[..., torch.Tensor], task: str | None = None) -> str:
    """classification or regression: what a loss (a name, or a function of the given `task`) trains."""
    if isinstance(loss, str) and loss in REGRESSION_LOSSES:
        return "regression"
    if isinstance(loss, str) and loss in CLASSIFICATION_LOSSES:
        return "classification"
    return task or "classification"


def trained_metric_names(kind: str, user: Sequence[str], split: str) -> list[str]:
    """The metrics training records for a split: its loss, accuracy (classification) or RMSE, MAE
    and R^2 (regression), and the user metrics."""
    built_in = ["acc"] if kind == "classification" else ["rmse", "mae", "r2"]
    return [f"{split}_{name}" for name in ("loss", *built_in, *user)]


def higher_is_better(metric: str) -> bool:
    """Accuracy and R^2 are better higher; losses, errors, sizes and latencies lower."""
    return metric.endswith(("_acc", "_r2"))


@dataclass(frozen=True)
class Objective:
    """The loss (a name in LOSSES or a callable) with its options, and user metrics by name."""

    loss: str | Callable[..., torch.Tensor] = "cross_entropy"
    label_smoothing: float = 0.0
    class_weights: Sequence[float] | None = None
    delta: float = 1.0
    masked: bool = False
    task: str | None = None  # for a user loss: "classification" (accuracy) or "regression"; else from the name
    metrics: Mapping[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.loss, str) and self.loss not in LOSSES:
            raise HftaNasError(f"unknown loss '{self.loss}'; expected one of {', '.join(LOSSES)}, or a function.")
        if not isinstance(self.loss, str) and not callable(self.loss):
            raise HftaNasError(f"loss must be a name or a function, got {type(self.loss).__name__}.")
        if not 0 <= self.label_smoothing < 1:
            raise HftaNasError(f"label_smoothing must be in [0, 1), got {self.label_smoothing!r}.")
        if not (math.isfinite(self.delta) and self.delta > 0):
            raise HftaNasError(f"huber delta must be a finite number > 0, got {self.delta!r}.")
        if self.task not in (None, "classification", "regression"):
            raise HftaNasError(f"task must be 'classification' or 'regression', got {self.task!r}.")
        if self.class_weights is not None and (
            not len(self.class_weights) or any(not (math.isfinite(w) and w >= 0) for w in self.class_weights)
        ):
            raise HftaNasError(f"class_weights must be finite numbers >= 0, got {list(self.class_weights)!r}.")

    def describe(self) -> str:
        """The same text in every run (functions by their qualified names): for settings keys."""
        name = lambda f: f if isinstance(f, str) else f"{f.__module__}:{f.__qualname__}"
        return repr(
            (
                name(self.loss),
                self.label_smoothing,
                self.class_weights and tuple(self.class_weights),
                self.delta,
                self.masked,
                self.task,
                sorted((k, name(f)) for k, f in self.metrics.items()),
            )
        )

    @property
    def kind(self) -> str:
        return loss_kind(self.loss, self.task)

    def metric_names(self, split: str) -> list[str]:
        return trained_metric_names(self.kind, list(self.metrics), split)

    # ----------------------------------------------------------------- the loss
    def slot_losses(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """([B] summed loss, [B] what the mean divides by) of each slot's batch; sum / count is the
        loss torch computes for that slot's model alone with the mean reduction."""
        batch, n = target.shape[:2]
        if callable(self.loss):
            flat = self.loss(
                output.reshape(batch * n, *output.shape[2:]),
                target.reshape(batch * n, *target.shape[2:]),
                reduction="none",
            ).reshape(batch, n, -1)
            count = torch.full((batch,), flat[0].numel(), dtype=flat.dtype, device=flat.device)
            return flat.sum(dim=(1, 2)), count
        if self.kind == "classification":
            return self._cross_entropy(output, target)
        output = _match(output, target)
        present = ~torch.isnan(target) if self.masked else None
        clean = torch.nan_to_num(target) if present is not None else target  # NaN would poison the gradient
        if self.loss == "mse":
            each = (output - clean) ** 2
        elif self.loss == "mae":
            each = (output - clean).abs()
        else:
            each = F.huber_loss(output, clean, reduction="none", delta=self.delta)
        if present is not None:
            each = torch.where(present, each, torch.zeros((), dtype=each.dtype, device=each.device))
            return each.reshape(batch, -1).sum(1), present.reshape(batch, -1).sum(1).to(each.dtype)
        return each.reshape(batch, -1).sum(1), torch.full(
            (batch,), each[0].numel(), dtype=each.dtype, device=each.device
        )

    def _cross_entropy(self, logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, n = target.shape[:2]
        weight = None
        if self.class_weights is not None:
            weight = torch.as_tensor(self.class_weights, dtype=logits.dtype, device=logits.device)
        each = F.cross_entropy(
            logits.reshape(batch * n, *logits.shape[2:]),
            target.reshape(batch * n, *target.shape[2:]),
            weight=weight,
            label_smoothing=self.label_smoothing,
            reduction="none",
            ignore_index=IGNORE_INDEX,
        ).reshape(batch, -1)
        present = (target != IGNORE_INDEX).reshape(batch, -1)
        if weight is None:
            return each.sum(1), present.sum(1).to(each.dtype)
        # torch's weighted mean divides by the weights of the targets present
        safe = torch.where(
            present, target.reshape(batch, -1), torch.zeros((), dtype=target.dtype, device=target.device)
        )
        return each.sum(1), torch.where(
            present, weight[safe], torch.zeros((), dtype=weight.dtype, device=weight.device)
        ).sum(1)

    # ---------------------------------------------------------------- metrics
    def metric_sums(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """[B] (or [B, K]) float64 sums of one batch that `finish` turns into metrics."""
        batch = target.shape[0]
        sums: dict[str, torch.Tensor] = {}
        if self.kind == "classification":
            present = target != IGNORE_INDEX
            correct = (output.argmax(-1) == target) & present
            sums["correct"] = correct.reshape(batch, -1).sum(1).to(torch.float64)
            sums["labelled"] = present.reshape(batch, -1).sum(1).to(torch.float64)
        else:
            out = _match(output, target).detach().to(torch.float64)
            y = target.to(torch.float64)
            out, y = out.reshape(batch, y.shape[1], -1), y.reshape(batch, y.shape[1], -1)  # [B, N, K]
            present = ~torch.isnan(y)
            zero = torch.zeros((), dtype=torch.float64, device=y.device)
            error = torch.where(present, out - torch.nan_to_num(y), zero)
            y0 = torch.where(present, y, zero)
            sums["sse"], sums["sae"] = (error**2).sum(dim=(1, 2)), error.abs().sum(dim=(1, 2))
            sums["count"] = present.sum(dim=(1, 2)).to(torch.float64)
            sums["per_target_count"] = present.sum(1).to(torch.float64)  # [B, K]
            sums["per_target_sse"] = (error**2).sum(1)
            sums["sum_y"], sums["sum_y2"] = y0.sum(1), (y0**2).sum(1)
        for name, function in self.metrics.items():
            values = function(output.reshape(-1, *output.shape[2:]), target.reshape(-1, *target.shape[2:]))
            sums[f"user:{name}"] = values.detach().reshape(batch, -1).to(torch.float64).sum(1)
            sums[f"user_count:{name}"] = torch.full(
                (batch,), values.reshape(batch, -1).shape[1], dtype=torch.float64, device=values.device
            )
        return sums

    def finish(self, split: str, sums: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The split's metrics ([B] each) from the summed `metric_sums` of its batches."""
        metrics = {}
        if self.kind == "classification":
            metrics[f"{split}_acc"] = sums["correct"] / sums["labelled"]
        else:
            metrics[f"{split}_rmse"] = (sums["sse"] / sums["count"]).sqrt()
            metrics[f"{split}_mae"] = sums["sae"] / sums["count"]
            n = sums["per_target_count"]
            total = sums["sum_y2"] - sums["sum_y"] ** 2 / n
            metrics[f"{split}_r2"] = (1 - sums["per_target_sse"] / total).mean(1)
        for name in self.metrics:
            metrics[f"{split}_{name}"] = sums[f"user:{name}"] / sums[f"user_count:{name}"]
        return metrics


def _match(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A regression output of one value per sample ([B, N, 1]) against targets [B, N]."""
    if output.dim() == target.dim() + 1 and output.shape[-1] == 1:
        return output.squeeze(-1)
    if output.shape != target.shape:
        raise HftaNasError(
            f"the model's output has shape {list(output.shape[1:])} per slot but the targets "
            f"{list(target.shape[1:])}: a regression model needs one output per target."
        )
    return output


def as_objective(loss: Any) -> Objective:
    """An Objective from an Objective, a loss name, or a loss function (torch's functional style)."""
    if isinstance(loss, Objective):
        return loss
    if loss is None or loss is F.cross_entropy:
        return Objective()
    return Objective(loss=loss)
