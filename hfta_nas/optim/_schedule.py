"""Per-slot learning-rate schedules, equal per slot to torch.optim.lr_scheduler.

lr_b(t) = the schedule of slot b at its own position t_b (a replaced slot
restarts at 0). Each slot can use a different kind, so one array can compare
schedules. Closed forms are used (not torch's step-by-step products); they
agree with torch's chained form to rounding.

kinds and their torch equivalents, after an optional linear warm-up of
`warmup_steps` (LinearLR(start_factor=warmup_start_factor, total_iters=W)
followed by the main schedule through SequentialLR(milestones=[W])):

- "constant":     ConstantLR(factor=1) / no scheduler
- "step":         StepLR(step_size, gamma)
- "exponential":  ExponentialLR(gamma)
- "cosine":       CosineAnnealingLR(T_max=t_max, eta_min)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from hfta_nas.errors import HftaNasError
from hfta_nas.optim._optimizer import ArrayOptimizer, per_slot_tensor

KINDS = ("constant", "step", "exponential", "cosine")


class LRSchedule:
    """Sets `optimizer.hparams["lr"]` from each slot's base lr and position.

    Call `step()` once per epoch (or per optimizer step; the unit is yours, as
    with torch schedulers). Every numeric argument is a float or one per slot.
    """

    def __init__(
        self,
        optimizer: ArrayOptimizer,
        kind: str | Sequence[str] = "constant",
        *,
        step_size: Any = 1,
        gamma: Any = 0.1,
        t_max: Any = 1,
        eta_min: Any = 0.0,
        warmup_steps: Any = 0,
        warmup_start_factor: Any = 1.0 / 3.0,
    ) -> None:
        self.optimizer = optimizer
        count = len(optimizer.hparams["lr"])
        device = optimizer.hparams["lr"].device
        kinds = [kind] * count if isinstance(kind, str) else list(kind)
        if len(kinds) != count:
            raise HftaNasError(f"schedule kind has {len(kinds)} entries but the array has {count} slots.")
        self.kind = torch.tensor([_kind_index(k) for k in kinds], device=device)
        self.params = {
            name: per_slot_tensor(value, count, name, device)
            for name, value in dict(
                step_size=step_size,
                gamma=gamma,
                t_max=t_max,
                eta_min=eta_min,
                warmup_steps=warmup_steps,
                warmup_start_factor=warmup_start_factor,
            ).items()
        }
        self._validate()
        self.base_lr = optimizer.hparams["lr"].clone()
        self.position = torch.zeros(count, dtype=torch.float64, device=device)
        optimizer.follow(self)
        self._apply()

    def _validate(self) -> None:
        p = self.params
        checks = {
            "step_size": (p["step_size"] >= 1) & (p["step_size"] == p["step_size"].round()),
            "gamma": p["gamma"] > 0,
            "t_max": p["t_max"] > 0,
            "eta_min": p["eta_min"] >= 0,
            "warmup_steps": (p["warmup_steps"] >= 0) & (p["warmup_steps"] == p["warmup_steps"].round()),
            "warmup_start_factor": (p["warmup_start_factor"] > 0) & (p["warmup_start_factor"] <= 1),
        }
        expected = {
            "step_size": "a positive integer",
            "gamma": "> 0",
            "t_max": "> 0",
            "eta_min": ">= 0",
            "warmup_steps": "a non-negative integer",
            "warmup_start_factor": "in (0, 1]",
        }
        for name, ok in checks.items():
            if not ok.all():
                raise HftaNasError(f"schedule '{name}' must be {expected[name]}, got {self.params[name].tolist()}.")

    def lr_at(self, position: torch.Tensor) -> torch.Tensor:
        """[B] learning rates of every slot at the given [B] positions."""
        p = self.params
        warmup = p["warmup_steps"]
        main = (position - warmup).clamp(min=0)
        base = self.base_lr
        by_kind = torch.stack(
            [
                base,
                base * p["gamma"] ** torch.floor(main / p["step_size"]),
                base * p["gamma"] ** main,
                p["eta_min"] + (base - p["eta_min"]) * (1 + torch.cos(math.pi * main / p["t_max"])) / 2,
            ]
        )
        scheduled = by_kind.gather(0, self.kind.unsqueeze(0)).squeeze(0)
        warming = position < warmup
        fraction = torch.where(warming, position / warmup.clamp(min=1), torch.ones_like(position))
        warm_factor = p["warmup_start_factor"] + (1 - p["warmup_start_factor"]) * fraction
        return torch.where(warming, base * warm_factor, scheduled)

    def _apply(self) -> None:
        self.optimizer.hparams["lr"] = self.lr_at(self.position)

    def step(self) -> None:
        """Advance every active slot by one position and set its lr."""
        self.position += self.optimizer.active.to(self.position.dtype)
        self._apply()

    def get_last_lr(self) -> list[float]:
        return self.optimizer.hparams["lr"].tolist()

    # -------------------------------------------------- following the optimizer
    def set_params(self, slot: int, *, kind: str | None = None, **values: float) -> None:
        """Give one slot new schedule parameters (used when a slot is refilled)."""
        if kind is not None:
            self.kind[slot] = _kind_index(kind)
        for name, value in values.items():
            if name not in self.params:
                raise HftaNasError(f"schedule has no parameter '{name}'; it has {sorted(self.params)}.")
            updated = self.params[name].clone()
            updated[slot] = float(value)
            self.params[name] = updated
        self._validate()
        self._apply()

    def keep_slots(self, keep: Sequence[int]) -> None:
        index = torch.tensor(list(keep), device=self.position.device)
        self.kind = self.kind.index_select(0, index)
        self.params = {k: v.index_select(0, index) for k, v in self.params.items()}
        self.base_lr = self.base_lr.index_select(0, index)
        self.position = self.position.index_select(0, index)

    def reset_slot(self, slot: int) -> None:
        self.position[slot] = 0
        self._apply()

    def copy_slot(self, source: int, target: int) -> None:
        """Slot `target` takes slot `source`'s kind, parameters, base lr and position."""
        for values in (self.kind, *self.params.values(), self.base_lr, self.position):
            values[target] = values[source]
        self._apply()

    def hparams_changed(self, slot: int, names: set[str]) -> None:
        if "lr" in names:
            self.base_lr[slot] = self.optimizer.hparams["lr"][slot]
            self._apply()

    def state_dict(self) -> dict[str, Any]:
        """Copies on the CPU (a checkpoint must not take device memory)."""
        cpu = lambda t: t.detach().to("cpu", copy=True)
        return {
            "kind": cpu(self.kind),
            "params": {k: cpu(v) for k, v in self.params.items()},
            "base_lr": cpu(self.base_lr),
            "position": cpu(self.position),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Back onto the device of the optimizer's tensors, wherever the state was saved."""
        device = self.optimizer.hparams["lr"].device
        self.kind = state["kind"].to(device, copy=True)
        self.params = {k: v.to(device, copy=True) for k, v in state["params"].items()}
        self.base_lr = state["base_lr"].to(device, copy=True)
        self.position = state["position"].to(device, copy=True)
        self._apply()


def _kind_index(kind: str) -> int:
    if kind not in KINDS:
        raise HftaNasError(f"unknown schedule '{kind}'; expected one of {list(KINDS)}.")
    return KINDS.index(kind)
