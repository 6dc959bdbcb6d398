"""The pieces of the plain PyTorch loop that depend on a space's settings, written as a user
of torch writes them: the learning-rate schedule (torch.optim.lr_scheduler), the loss
(torch.nn.functional) and the validation metric. benchmarks/stability.py's `plain_run` and
benchmarks/_ray_pbt.py build their loops from these; a setting they do not cover raises
SystemExit naming it, so a benchmark lists the space as skipped instead of comparing unlike
loops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

# The losses the plain loop writes with torch.nn.functional; others (a user's function, masked
# targets) are the engine's own and have no plain counterpart here.
PLAIN_LOSSES = ("cross_entropy", "mse", "mae", "huber")
CLASSIFICATION_METRICS = ("acc", "loss")
REGRESSION_METRICS = ("rmse", "mae", "r2", "loss")


def plain_schedule(optimizer: torch.optim.Optimizer, schedule: dict[str, Any] | None) -> Any:
    """torch's scheduler for an engine schedule (stepped once per epoch), or None.

    The engine's closed forms equal these (hfta_nas/optim/_schedule.py): an optional
    LinearLR warm-up of `warmup_steps`, then StepLR / ExponentialLR / CosineAnnealingLR
    through SequentialLR."""
    if schedule is None or schedule["kind"] == "constant" and not schedule.get("warmup_steps"):
        return None
    schedulers = torch.optim.lr_scheduler
    kind = schedule["kind"]
    if kind == "step":
        main = schedulers.StepLR(optimizer, step_size=int(schedule["step_size"]), gamma=schedule["gamma"])
    elif kind == "exponential":
        main = schedulers.ExponentialLR(optimizer, gamma=schedule["gamma"])
    elif kind == "cosine":
        main = schedulers.CosineAnnealingLR(optimizer, T_max=schedule["t_max"], eta_min=schedule["eta_min"])
    elif kind == "constant":
        main = schedulers.ConstantLR(optimizer, factor=1.0)
    else:
        raise SystemExit(f"the plain loop has no torch scheduler for the {kind!r} schedule")
    warmup = int(schedule.get("warmup_steps") or 0)
    if not warmup:
        return main
    ramp = schedulers.LinearLR(optimizer, start_factor=schedule["warmup_start_factor"], total_iters=warmup)
    return schedulers.SequentialLR(optimizer, [ramp, main], milestones=[warmup])


def plain_loss(loss: dict[str, Any] | None) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """loss(output, target) with the mean reduction, as the config's loss trains one model."""
    spec = dict(loss or {"name": "cross_entropy"})
    name = spec.pop("name")
    if name not in PLAIN_LOSSES or spec.get("masked") or spec.get("task"):
        raise SystemExit(f"the plain loop writes the {', '.join(PLAIN_LOSSES)} losses only, not {loss}")
    if name == "cross_entropy":
        weights = spec.get("class_weights")
        smoothing = spec.get("label_smoothing") or 0.0

        def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            weight = None if weights is None else torch.as_tensor(weights, dtype=output.dtype, device=output.device)
            return F.cross_entropy(output, target, weight=weight, label_smoothing=smoothing)

        return cross_entropy
    if name == "huber":
        delta = spec.get("delta", 1.0)
        return lambda output, target: F.huber_loss(_one_per_target(output, target), target, delta=delta)
    function = F.mse_loss if name == "mse" else F.l1_loss
    return lambda output, target: function(_one_per_target(output, target), target)


def _one_per_target(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A model with one output unit against a vector of targets: [N, 1] -> [N]."""
    return output.squeeze(-1) if output.dim() == target.dim() + 1 and output.shape[-1] == 1 else output


def check_metric(metric: str, regression: bool) -> None:
    """SystemExit unless the plain loop evaluates `metric` (<split>_<kind>) for this task."""
    split, _, kind = metric.partition("_")
    known = REGRESSION_METRICS if regression else CLASSIFICATION_METRICS
    if split not in ("train", "val", "test") or kind not in known:
        task = "a regression" if regression else "a classification"
        names = ", ".join(f"val_{k}" for k in known)
        raise SystemExit(f"the plain loop evaluates {names} (any split) for {task}, not {metric!r}")


@torch.no_grad()
def plain_metric(model: torch.nn.Module, data: Any, metric: str, loss: dict[str, Any] | None) -> float:
    """`metric` (<split>_<kind>) of `model` on one split of `data`, in one pass, as a user evaluates it."""
    split, _, kind = metric.partition("_")
    x, y = getattr(data, f"x_{split}"), getattr(data, f"y_{split}")
    model.eval()
    output = model(x)
    if kind == "loss":
        return plain_loss(loss)(output, y).item()
    if kind == "acc":
        return (output.argmax(-1) == y).double().mean().item()
    error = (_one_per_target(output, y) - y).double()
    if kind == "rmse":
        return error.square().mean().sqrt().item()
    if kind == "mae":
        return error.abs().mean().item()
    targets = y.double().reshape(len(y), -1)
    residual = error.reshape(len(y), -1).square().sum(0)
    total = (targets - targets.mean(0)).square().sum(0)
    return (1 - residual / total).mean().item()  # R^2 averaged over targets, as sklearn's r2_score


class PlainEarlyStopping:
    """The patience counter a user writes: stop once `metric` has not improved by more than
    `min_delta` for `patience` epochs in a row (higher is better for accuracy and R^2)."""

    def __init__(self, metric: str, patience: int, min_delta: float = 0.0, mode: str | None = None) -> None:
        self.metric, self.patience, self.min_delta = metric, patience, min_delta
        self.maximize = mode == "max" if mode is not None else metric.endswith(("_acc", "_r2"))
        self.best: float | None = None
        self.since_best = 0

    def stalled(self, seen: dict[str, float], model: torch.nn.Module, data: Any, loss: dict[str, Any] | None) -> bool:
        """Record this epoch (its value from `seen`, else evaluated); True when the loop should stop."""
        value = seen[self.metric] if self.metric in seen else plain_metric(model, data, self.metric, loss)
        if self.best is None or (
            value > self.best + self.min_delta if self.maximize else value < self.best - self.min_delta
        ):
            self.best, self.since_best = value, 0
        else:
            self.since_best += 1
        return self.since_best >= self.patience


def refuse_unlike(config: Any) -> None:
    """SystemExit naming the first training setting the plain loop does not write, so that no
    benchmark compares a loop that silently trains otherwise."""
    unlike = {
        "accumulate": config.accumulate != 1,
        "augment": bool(config.augment),
        "precision": config.precision != "float32",
        "hparam_schedule": bool(config.hparam_schedule),
    }
    for setting, present in unlike.items():
        if present:
            raise SystemExit(f"the plain loop does not reproduce training.{setting} (the space sets it)")
