"""Loss scaling for float16 training, one scale per slot.

torch's GradScaler keeps one scale for all the parameters it sees and skips the
optimizer step when any gradient overflows: in an array one slot's overflow
would skip every slot's step and halve every slot's scale, so a slot would
train differently beside a neighbour than alone. `SlotGradScaler` keeps torch's
rule per slot: slot b's loss is multiplied by its own scale, its gradient row
unscaled by it; a slot whose row is not finite skips its step (its parameters,
optimizer state and step count stay exactly as they were; state created by this
step starts as a fresh optimizer's, as torch has none before a slot's first real
step) and halves its scale;
the others step; a slot's scale doubles after `growth_interval` steps without
overflow. Slot b so follows `torch.amp.GradScaler` on its model alone.

    scaler = SlotGradScaler(optimizer)
    losses = per-slot losses                    # [B]
    optimizer.zero_grad()
    scaler.scale(losses).sum().backward()
    scaler.step()                               # unscale, skip overflowed slots, step the others
    scaler.update()
"""

from __future__ import annotations

from typing import Any

import torch

from hfta_nas.errors import HftaNasError
from hfta_nas.optim._optimizer import ArrayOptimizer


class SlotGradScaler:
    """Per-slot dynamic loss scaling (see the module docstring); arguments as torch.amp.GradScaler's."""

    def __init__(
        self,
        optimizer: ArrayOptimizer,
        *,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ) -> None:
        if not (growth_factor > 1 and 0 < backoff_factor < 1 and init_scale > 0 and growth_interval >= 1):
            raise HftaNasError(
                "SlotGradScaler needs init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 "
                "and growth_interval >= 1."
            )
        self.optimizer = optimizer
        count, device = len(optimizer.array), optimizer.array.device
        self.scales = torch.full((count,), float(init_scale), dtype=torch.float32, device=device)
        self.growth_tracker = torch.zeros(count, dtype=torch.int32, device=device)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.init_scale = float(init_scale)
        self.found_inf: torch.Tensor | None = None
        optimizer.follow(self)  # drops and refills of slots reach the scales

    def scale(self, losses: torch.Tensor) -> torch.Tensor:
        """Each slot's loss times its scale ([B])."""
        return losses * self.scales.to(losses.dtype)

    @torch.no_grad()
    def step(self) -> None:
        """Unscale every slot's gradient, then step the slots whose gradient is finite."""
        grad = self.optimizer.array.gradient()
        inverse = self.scales.double().reciprocal().float()  # as torch computes the inverse scale
        grad.mul_(inverse.to(grad.dtype).unsqueeze(1))
        self.found_inf = ~torch.isfinite(grad).all(dim=1)
        skipped = self.found_inf.nonzero().flatten().tolist()  # one host read a step, as torch's GradScaler
        if not skipped:
            self.optimizer.step()
            return
        if len(skipped) == len(self.scales):  # torch takes no step at all: neither does the array
            return
        grad[self.found_inf] = 0  # no NaN into the fused kernels; these slots are put back below
        saved = self._rows(skipped)
        self.optimizer.step()
        self._restore(skipped, saved)

    @torch.no_grad()
    def update(self) -> None:
        """torch's rule per slot: back off where a step overflowed, grow after growth_interval clean steps."""
        if self.found_inf is None:
            return
        grown = self.growth_tracker + 1
        grow = ~self.found_inf & (grown >= self.growth_interval)
        self.scales = torch.where(
            self.found_inf,
            self.scales * self.backoff_factor,
            torch.where(grow, self.scales * self.growth_factor, self.scales),
        )
        self.growth_tracker = torch.where(self.found_inf | grow, torch.zeros_like(grown), grown)
        self.found_inf = None

    # ---------------------------------------------------- skipped slots put back
    def _rows(self, slots: list[int]) -> dict[str, Any]:
        optimizer = self.optimizer
        return {
            "param": optimizer.array.flat.detach()[slots].clone(),
            "state": {name: value[slots].clone() for name, value in optimizer.state.items()},
            "steps": optimizer.steps[slots].clone(),
        }

    def _restore(self, slots: list[int], saved: dict[str, Any]) -> None:
        optimizer = self.optimizer
        optimizer.array.flat.detach()[slots] = saved["param"]
        for name, value in optimizer.state.items():
            if name in saved["state"]:
                value[slots] = saved["state"][name]
            else:
                # State is created lazily by the first step of any slot. A skipped slot has
                # taken no step, so it gets what a fresh torch optimizer creates on its first
                # real step (not what this step wrote from a zeroed gradient and weight decay).
                for slot in slots:
                    value[slot] = optimizer._initial_state(name, slot)
        optimizer.steps[slots] = saved["steps"]

    # ------------------------------------------------------------ slot surgery
    def keep_slots(self, keep: Any) -> None:
        index = torch.tensor(list(keep), device=self.scales.device)
        self.scales, self.growth_tracker = (
            self.scales.index_select(0, index),
            self.growth_tracker.index_select(0, index),
        )

    def reset_slot(self, slot: int) -> None:
        """A refilled slot starts with a fresh scaler, as a new GradScaler would."""
        self.scales[slot], self.growth_tracker[slot] = self.init_scale, 0

    def copy_slot(self, source: int, target: int) -> None:
        """Slot `target` takes slot `source`'s loss scale and growth count."""
        self.scales[target], self.growth_tracker[target] = self.scales[source], self.growth_tracker[source]

    def hparams_changed(self, slot: int, names: Any) -> None:
        """Hyper-parameters do not touch the scale."""

    def state_dict(self) -> dict[str, Any]:
        return {"scales": self.scales.cpu().clone(), "growth_tracker": self.growth_tracker.cpu().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scales = state["scales"].to(self.scales.device)
        self.growth_tracker = state["growth_tracker"].to(self.growth_tracker.device)
