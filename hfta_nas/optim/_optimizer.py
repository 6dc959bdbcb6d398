"""The base of the array optimizers: per-slot hyper-parameters as [B] tensors.

`torch.optim` cannot give each slot its own lr (a tensor lr must have one
element), so the array has its own optimizers. Each works on the array's
single [B, P] parameter tensor: every hyper-parameter is a [B] tensor viewed
as [B, 1] and broadcast over a slot's row (contract 5), and one update is a
few element-wise ops whatever the number of layers or slots.

The formulas follow torch.optim's single-tensor implementations line by line,
so slot b ends where `torch.optim` would have taken the same model (tests
check every optimizer to 1e-10 in float64).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from hfta_nas.array._model_array import ModelArray
from hfta_nas.errors import HftaNasError

PerSlot = float | Sequence[float] | torch.Tensor


def per_slot_tensor(value: Any, count: int, name: str, device: torch.device) -> torch.Tensor:
    """A float64 [count] tensor from a float (shared) or a length-count sequence/tensor."""
    if isinstance(value, bool):
        raise HftaNasError(f"hyper-parameter '{name}' must be a number or {count} numbers, got {value!r}.")
    try:
        tensor = torch.as_tensor(value, dtype=torch.float64).detach().to(device)
    except (TypeError, ValueError, RuntimeError) as error:
        raise HftaNasError(f"hyper-parameter '{name}' must be a number or {count} numbers, got {value!r}.") from error
    if tensor.dim() == 0:
        return tensor.expand(count).clone()
    if tensor.shape != (count,):
        raise HftaNasError(f"hyper-parameter '{name}' has {tensor.numel()} values but the array has {count} slots.")
    return tensor.clone()


def clip_slot_gradients(grad: torch.Tensor, clip_value: torch.Tensor | None, clip_norm: torch.Tensor | None) -> None:
    """Clip each slot's row of `grad` ([B, P]) in place: to [-clip_value, clip_value], then to an
    L2 norm of at most clip_norm ([B] each; inf leaves a slot alone).

    torch.nn.utils.clip_grad_norm_ on one model scales its gradients by
    min(1, max_norm / (total_norm + 1e-6)), total_norm over all its parameters: a
    slot's row holds exactly its model's gradients (padding is zero), so the row's
    norm is that total norm. No host synchronisation: slots that do not clip are
    multiplied by exactly 1. None skips that clipping for every slot.
    """
    if clip_value is not None:
        bound = clip_value.to(grad.dtype).unsqueeze(1)
        torch.minimum(torch.maximum(grad, -bound), bound, out=grad)
    if clip_norm is not None:
        norms = torch.linalg.vector_norm(grad, dim=1)
        scale = (clip_norm.to(grad.dtype) / (norms + 1e-6)).clamp(max=1.0)
        grad.mul_(scale.unsqueeze(1))


class ArrayOptimizer:
    """Shared machinery: hyper-parameters, state, freezing and slot surgery.

    Subclasses set `defaults` (name -> default, as in torch.optim), validate
    values in `_validate` and implement `_update(param, grad, hp, state)` on the
    [B, P] tensors, where `hp[name]` is a [B, 1] tensor in the parameter dtype.
    """

    defaults: dict[str, float] = {}
    flags: dict[str, bool] = {}
    # Every optimizer also clips each slot's gradient before its update, as
    # torch.nn.utils.clip_grad_value_ and then clip_grad_norm_ on that slot's
    # model alone would; inf (the default) does not clip.
    clipping: dict[str, float] = {"clip_value": math.inf, "clip_norm": math.inf}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.defaults = {**{k: v for k, v in cls.defaults.items() if k not in cls.clipping}, **cls.clipping}

    def __init__(self, array: ModelArray, **kwargs: Any) -> None:
        if not isinstance(array, ModelArray):
            raise HftaNasError(f"{type(self).__name__} optimizes a ModelArray, got {type(array).__name__}.")
        self.array = array
        count = len(array)
        self.options = {name: bool(kwargs.pop(name, default)) for name, default in self.flags.items()}
        unknown = set(kwargs) - set(self.defaults) - {"betas"}
        if unknown:
            raise HftaNasError(
                f"{type(self).__name__} got unknown arguments {sorted(unknown)}; it takes "
                f"{sorted([*self.defaults, *self.flags])}."
            )
        if "betas" in kwargs:  # torch.optim spelling: betas=(beta1, beta2), each may be per slot
            betas = kwargs.pop("betas")
            if not isinstance(betas, (tuple, list)) or len(betas) != 2:
                raise HftaNasError(f"betas must be a pair (beta1, beta2), got {betas!r}.")
            kwargs["beta1"], kwargs["beta2"] = betas
        self.hparams = {
            name: per_slot_tensor(kwargs.get(name, default), count, name, array.device)
            for name, default in self.defaults.items()
        }
        self._validate_all()
        self.state: dict[str, torch.Tensor] = {}
        self.steps = torch.zeros(count, dtype=torch.float64, device=array.device)
        self.active = torch.ones(count, dtype=torch.bool, device=array.device)
        self._any_frozen = False
        self._followers: list[Any] = []
        array.attach(self)

    # ---------------------------------------------------------- hyper-parameters
    def _validate_all(self) -> None:
        for name, values in self.hparams.items():
            self._validate(name, values)

    @classmethod
    def slot_arguments(cls, per_slot: Sequence[Mapping[str, Any]], flags: Mapping[str, bool]) -> dict[str, Any]:
        """This optimizer's keyword arguments for slots with hyper-parameters of their own: one value per
        slot of every name any slot sets (the default where a slot does not; torch's `betas` pair as
        beta1 and beta2), and the flags (nesterov, amsgrad, ...) the array shares."""
        split = []
        for hparams in per_slot:
            hparams = dict(hparams)
            if "betas" in hparams:
                hparams["beta1"], hparams["beta2"] = hparams.pop("betas")
            split.append(hparams)
        names = sorted({name for hparams in split for name in hparams})
        return {**{name: [h.get(name, cls.defaults.get(name)) for h in split] for name in names}, **flags}

    def _validate(self, name: str, values: torch.Tensor) -> None:
        if name in self.clipping:
            if torch.isnan(values).any() or (values <= 0).any():
                raise HftaNasError(
                    f"{type(self).__name__}: '{name}' must be > 0 (inf: no clipping), got {values.tolist()}."
                )
            return
        if not torch.isfinite(values).all() or (values < 0).any():
            raise HftaNasError(f"{type(self).__name__}: '{name}' must be finite and >= 0, got {values.tolist()}.")

    def set_hparams(self, slot: int, **values: float) -> None:
        """Give one slot new hyper-parameters (used when a slot is refilled)."""
        slot = self.array._check_slot(slot)
        if "betas" in values:
            values["beta1"], values["beta2"] = values.pop("betas")
        for name, value in values.items():
            if name not in self.hparams:
                raise HftaNasError(
                    f"{type(self).__name__} has no hyper-parameter '{name}'; it has {sorted(self.hparams)}."
                )
            updated = self.hparams[name].clone()
            updated[slot] = float(value)
            self._validate(name, updated)
            self.hparams[name] = updated
        for follower in self._followers:
            follower.hparams_changed(slot, set(values))

    def follow(self, follower: Any) -> None:
        """Register a schedule that must hear about surgery and new hyper-parameters."""
        self._followers.append(follower)

    # ------------------------------------------------------------------ stepping
    def zero_grad(self) -> None:
        self.array.zero_grad()

    def freeze_slot(self, slot: int) -> None:
        """Stop updating one slot (e.g. it diverged); the others are untouched."""
        slot = self.array._check_slot(slot)
        self.active[slot] = False
        self._any_frozen = True
        for value in self.state.values():
            value[slot] = 0

    @torch.no_grad()
    def step(self) -> None:
        param = self.array.flat
        grad = self.array.gradient()
        clip_slot_gradients(grad, *self._clipping_in_use())
        if self._fused_applies(param):
            self.steps += self.active.to(self.steps.dtype)
            self._fused_step(param, grad)
            return
        if self._any_frozen:
            # A frozen slot may hold NaN: zero its gradient and lr so it stays put.
            grad = torch.where(self.active.unsqueeze(1), grad, torch.zeros((), dtype=grad.dtype, device=grad.device))
        self.steps += self.active.to(self.steps.dtype)
        # Per-slot scalars stay float64 until they meet the parameters, as
        # torch.optim computes them in Python floats.
        hp = {name: value.unsqueeze(1) for name, value in self.hparams.items()}
        if self._any_frozen:
            hp["lr"] = hp["lr"] * self.active.to(torch.float64).unsqueeze(1)
        self._update(param, grad, hp)

    def _clipping_in_use(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(clip_value, clip_norm), each None when no slot clips: read on the host only when the
        values change (hyper-parameter tensors are replaced, never edited in place), so a CUDA step
        does not wait for the device."""
        current = (self.hparams["clip_value"], self.hparams["clip_norm"])
        seen = getattr(self, "_clipping_of", (None, None))  # held, so a new tensor cannot reuse their ids
        if seen[0] is not current[0] or seen[1] is not current[1]:
            self._clipping_of = current
            self._clipping = tuple(t if bool(torch.isfinite(t).any()) else None for t in current)
        return self._clipping  # type: ignore[return-value]

    # ------------------------------------------------------- the fused CPU path
    # On CPU, torch's fused optimizer kernels (torch._fused_adam_ & co.) make one
    # vectorised pass over each tensor, 3-4x faster than the ~10 element-wise
    # passes of `_update`. They take scalar hyper-parameters, so slots are
    # grouped by equal (hyper-parameters, step): one call per group, each on the
    # group's contiguous row blocks of `flat` (no copy). Reading the [B] values
    # to the host is free on CPU; on CUDA it would synchronise every step, so
    # CUDA keeps `_update` (a few kernels, no host round trip).
    fused_kernel_dtypes = (torch.float32, torch.float64)

    def _fused_supported(self) -> bool:
        """Whether this optimizer (with its options) has a fused kernel; subclasses say."""
        return False

    def _fused_applies(self, param: torch.Tensor) -> bool:
        return param.device.type == "cpu" and param.dtype in self.fused_kernel_dtypes and self._fused_supported()

    def _fused_step(self, param: torch.Tensor, grad: torch.Tensor) -> None:
        names = [name for name in self.hparams if name not in self.clipping]  # applied before, to all slots
        columns = [self.hparams[name] for name in names] + [self.steps, self.active.to(torch.float64)]
        rows = torch.stack(columns, dim=1).tolist()
        groups: dict[tuple[float, ...], list[tuple[int, int]]] = {}
        start = 0
        for end in range(1, len(rows) + 1):
            if end == len(rows) or rows[end] != rows[start]:
                if rows[start][-1]:  # frozen slots are skipped: parameters and state stay put
                    groups.setdefault(tuple(rows[start][:-1]), []).append((start, end))
                start = end
        for key, runs in groups.items():
            hp = dict(zip(names, key[:-1]))
            self._fused_update(runs, param, grad, hp, key[-1])

    def _fused_update(
        self, runs: list[tuple[int, int]], param: torch.Tensor, grad: torch.Tensor, hp: dict[str, float], step: float
    ) -> None:
        """Update the row blocks `param[a:b]` for (a, b) in `runs`, which share `hp` and `step`."""
        raise NotImplementedError

    def _state(self, name: str, like: torch.Tensor, fill: float | torch.Tensor = 0.0) -> torch.Tensor:
        """Lazily created [B, P] state, as torch.optim creates it on the first step."""
        if name not in self.state:
            self.state[name] = torch.zeros_like(like, memory_format=torch.contiguous_format) + fill
        return self.state[name]

    def _update(self, param: torch.Tensor, grad: torch.Tensor, hp: dict[str, torch.Tensor]) -> None:
        raise NotImplementedError

    def _first_step(self) -> torch.Tensor:
        """[B, 1] bool: slots taking their first step since (re)start."""
        return (self.steps == 1).unsqueeze(1)

    def _step_count(self) -> torch.Tensor:
        """[B, 1] float64 step number of each slot (at least 1, so a frozen
        slot that never stepped does not divide by zero)."""
        return self.steps.clamp(min=1).unsqueeze(1)

    # ------------------------------------------------------------- slot surgery
    def keep_slots(self, keep: Sequence[int]) -> None:
        index = torch.tensor(list(keep), device=self.steps.device)
        self.hparams = {name: value.index_select(0, index) for name, value in self.hparams.items()}
        self.state = {name: value.index_select(0, index) for name, value in self.state.items()}
        self.steps = self.steps.index_select(0, index)
        self.active = self.active.index_select(0, index)
        self._any_frozen = bool((~self.active).any())
        for follower in self._followers:
            follower.keep_slots(keep)

    def relayout(self, convert: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """The array changed the layout of its rows (an envelope dropped its padding): every [B, P]
        state tensor goes to the new layout by `convert`; per-slot values stay."""
        self.state = {name: convert(value) for name, value in self.state.items()}

    def reset_slot(self, slot: int) -> None:
        """Fresh optimizer state for a replaced slot, as a new torch.optim would have."""
        for name, value in self.state.items():
            value[slot] = self._initial_state(name, slot)
        self.steps[slot] = 0
        self.active[slot] = True
        self._any_frozen = bool((~self.active).any())
        for follower in self._followers:
            follower.reset_slot(slot)

    def copy_slot(self, source: int, target: int) -> None:
        """Slot `target` takes slot `source`'s hyper-parameters, state and step count (and, in every
        follower, its schedule position and loss scale): it steps on as the source would."""
        for name, values in self.hparams.items():  # replaced, never edited in place (`_clipping_in_use`)
            self.hparams[name] = values.clone()
            self.hparams[name][target] = values[source]
        for values in (*self.state.values(), self.steps, self.active):
            values[target] = values[source]
        self._any_frozen = bool((~self.active).any())
        for follower in self._followers:
            follower.copy_slot(source, target)

    def _initial_state(self, name: str, slot: int) -> float | torch.Tensor:
        """The value a fresh torch.optim state tensor starts from (zero for most)."""
        return 0.0

    def state_dict(self) -> dict[str, Any]:
        """Copies on the CPU (a checkpoint must not take device memory); `load_state_dict` moves them back."""
        cpu = lambda t: t.detach().to("cpu", copy=True)
        return {
            "hparams": {k: cpu(v) for k, v in self.hparams.items()},
            "state": {k: cpu(v) for k, v in self.state.items()},
            "steps": cpu(self.steps),
            "active": cpu(self.active),
            "options": dict(self.options),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.hparams = {k: v.clone().to(self.steps.device) for k, v in state["hparams"].items()}
        self.state = {k: v.clone().to(self.array.flat.device) for k, v in state["state"].items()}
        self.steps = state["steps"].clone().to(self.steps.device)
        self.active = state["active"].clone().to(self.steps.device)
        self._any_frozen = bool((~self.active).any())

    def __repr__(self) -> str:
        shown = {k: (v[0].item() if bool((v == v[0]).all()) else v.tolist()) for k, v in self.hparams.items()}
        return f"{type(self).__name__}(slots={len(self.steps)}, {shown}, {self.options})"
