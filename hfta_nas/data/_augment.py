"""Data augmentation on the device, per slot, seeded from each slot's data seed.

Every slot draws its random choices (crop offsets, flips, mixup / cutmix
partners and strengths, noise) from generators of its own, seeded from its
data seed, so a slot's augmented batches depend on its seed alone: not on the
array's size or its neighbours, and `--vary data` varies them with the order.
With one order shared by all slots the batch is augmented once, for all.

The operations follow the usual recipes: `shift` pads by that many samples
(zeros) and crops back at a random offset (torchvision's RandomCrop with
padding); `flip` mirrors the last axis with probability 1/2; `noise` adds
Gaussian noise of that standard deviation; `mixup` and `cutmix` (Beta(alpha,
alpha) strengths, partners from a permutation of the batch; cutmix's strength
corrected to the pasted area) return the partners' targets and the strength,
and the loss is mixed as lam * loss(y) + (1 - lam) * loss(y_partner). With
both, each batch takes one of them with probability 1/2. Shift, flip and
cutmix need 1-D ([C, L]) or 2-D ([C, H, W]) samples.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from hfta_nas.errors import HftaNasError

_STREAM = 0xA06  # the augmentation's seed stream, apart from the data order's
STRENGTHS = ("noise", "mixup", "cutmix")  # what a slot may have of its own (population-based training explores it)


@dataclass(frozen=True)
class Augmentation:
    """Which augmentations to apply (all off by default)."""

    shift: int = 0
    flip: bool = False
    noise: float = 0.0
    mixup: float = 0.0
    cutmix: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.shift, bool) or not isinstance(self.shift, int) or self.shift < 0:
            raise HftaNasError(f"augmentation shift must be an integer >= 0 (samples of padding), got {self.shift!r}.")
        if not isinstance(self.flip, bool):
            raise HftaNasError(f"augmentation flip must be true or false, got {self.flip!r}.")
        for name in STRENGTHS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise HftaNasError(f"augmentation {name} must be a finite number >= 0, got {value!r}.")

    @property
    def active(self) -> bool:
        return bool(self.shift or self.flip or self.noise or self.mixup or self.cutmix)

    @property
    def spatial(self) -> bool:
        return bool(self.shift or self.flip or self.cutmix)


@dataclass
class Augmented:
    """An augmented batch: inputs, and for mixup / cutmix the partners' targets and the strength ([B])."""

    x: torch.Tensor
    y_partner: torch.Tensor | None = None
    strength: torch.Tensor | None = None


class SlotAugmenter:
    """Applies an Augmentation to [B, N, ...] batches (or one shared [N, ...] batch), slot by slot."""

    def __init__(self, augmentation: Augmentation, seeds: Sequence[int], *, device: torch.device | str = "cpu") -> None:
        self.augmentation = augmentation
        self.device = torch.device(device)
        self.rngs = [self._rng(seed) for seed in seeds]
        self.noise = [self._noise_generator(seed) for seed in seeds]
        # each slot's noise std and mixup / cutmix alpha: the augmentation's, until `set_strength` changes one
        self.strengths = {name: [float(getattr(augmentation, name))] * len(seeds) for name in STRENGTHS}

    def _rng(self, seed: int) -> np.random.Generator:
        return np.random.default_rng([int(seed), _STREAM])

    def _noise_generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(
            int(np.random.SeedSequence([int(seed), _STREAM, 1]).generate_state(1)[0])
        )

    # -------------------------------------------------------------- applying
    def __call__(self, x: torch.Tensor, y: torch.Tensor, shared: bool = False) -> Augmented:
        if shared:  # one order for all slots: one augmented batch, seen by all
            out = self(x.unsqueeze(0), y.unsqueeze(0))
            partner = out.y_partner.squeeze(0) if out.y_partner is not None else None
            return Augmented(out.x.squeeze(0), partner, out.strength)
        aug = self.augmentation
        if aug.spatial and x.dim() not in (4, 5):
            raise HftaNasError(
                f"shift, flip and cutmix need 1-D [C, L] or 2-D [C, H, W] samples; these are "
                f"{list(x.shape[2:])} (use noise or mixup for other inputs)."
            )
        if aug.shift:
            x = self._shift(x, aug.shift)
        if aug.flip:
            flips = torch.as_tensor(np.stack([rng.random(x.shape[1]) < 0.5 for rng in self.rngs]), device=x.device)
            x = torch.where(flips.reshape(*flips.shape, *[1] * (x.dim() - 2)), x.flip(-1), x)
        if aug.noise:
            noise = torch.stack(
                [torch.randn(x.shape[1:], generator=g, device=x.device, dtype=x.dtype) for g in self.noise]
            )
            stds = self.strengths["noise"]
            if len(set(stds)) == 1:
                x = x + stds[0] * noise
            else:  # slots of their own std: each row times its own (the same product as a scalar's)
                x = x + torch.tensor(stds, dtype=x.dtype, device=x.device).reshape(-1, *[1] * (x.dim() - 1)) * noise
        use_mixup, use_cutmix = aug.mixup > 0, aug.cutmix > 0
        if not (use_mixup or use_cutmix):
            return Augmented(x)
        # with both, each slot's batch takes one of them, by a coin of its own
        choices = [(rng.random() < 0.5) if use_mixup and use_cutmix else use_mixup for rng in self.rngs]
        return self._mix(x, y, choices)

    def _shift(self, x: torch.Tensor, pad: int) -> torch.Tensor:
        spatial = x.shape[3:]
        padded = F.pad(x, [pad, pad] * len(spatial))
        offsets = torch.as_tensor(
            np.stack([rng.integers(0, 2 * pad + 1, size=(x.shape[1], len(spatial))) for rng in self.rngs]),
            device=x.device,
        )  # [B, N, d]
        for axis, size in enumerate(spatial):  # crop one axis at a time: gather its window
            dim = 3 + axis
            window = offsets[..., axis, None] + torch.arange(size, device=x.device)  # [B, N, size]
            shape = [*window.shape[:2], 1, *[1] * axis, size, *[1] * (len(spatial) - axis - 1)]
            index = window.reshape(shape).expand(*padded.shape[:dim], size, *padded.shape[dim + 1 :])
            padded = padded.gather(dim, index)
        return padded

    def _mix(self, x: torch.Tensor, y: torch.Tensor, mixup: list[bool]) -> Augmented:
        batch, n = x.shape[:2]
        partners, strengths, masks = [], [], []
        for slot, rng in enumerate(self.rngs):
            alpha = self.strengths["mixup" if mixup[slot] else "cutmix"][slot]
            lam = float(rng.beta(alpha, alpha))
            partners.append(torch.as_tensor(rng.permutation(n)))
            if mixup[slot]:
                strengths.append(lam)
                masks.append(None)
            else:
                mask, kept = self._box(x.shape[3:], lam, rng)
                strengths.append(kept)
                masks.append(mask)
        perm = torch.stack(partners).to(x.device)  # [B, N]
        other = x.gather(1, perm.reshape(batch, n, *[1] * (x.dim() - 2)).expand_as(x))
        y_partner = y.gather(1, perm.reshape(batch, n, *[1] * (y.dim() - 2)).expand_as(y))
        lam = torch.tensor(strengths, dtype=x.dtype, device=x.device)
        mixed = []
        for slot in range(batch):
            if masks[slot] is None:
                mixed.append(lam[slot] * x[slot] + (1 - lam[slot]) * other[slot])
            else:  # the box of the partner pasted in
                mixed.append(torch.where(masks[slot].to(x.device), other[slot], x[slot]))
        return Augmented(torch.stack(mixed), y_partner, lam.to(torch.float64))

    def _box(self, spatial: torch.Size, lam: float, rng: np.random.Generator) -> tuple[torch.Tensor, float]:
        """CutMix's box (a segment for 1-D samples) of about (1 - lam) of the area, and the share kept."""
        if not spatial:
            raise HftaNasError("cutmix needs 1-D [C, L] or 2-D [C, H, W] samples.")
        cut = math.sqrt(1 - lam) if len(spatial) == 2 else 1 - lam
        inside = torch.ones((), dtype=torch.bool)
        for axis, size in enumerate(spatial):
            length, centre = int(size * cut), int(rng.integers(0, size))
            low, high = max(centre - length // 2, 0), min(centre + length // 2 + length % 2, size)
            shape = [1] * len(spatial)
            shape[axis] = size
            positions = torch.arange(size).reshape(shape)
            inside = inside & (positions >= low) & (positions < high)
        area = float(inside.sum()) / math.prod(spatial)
        return inside.unsqueeze(0).unsqueeze(0), 1 - area  # broadcast over N and C

    # -------------------------------------------------------------- surgery
    def strength(self, slot: int, name: str) -> float:
        """Slot `slot`'s noise std, mixup or cutmix alpha."""
        return self.strengths[name][slot]

    def set_strength(self, slot: int, name: str, value: float) -> None:
        """Give one slot its own noise std, mixup or cutmix alpha; only augmentations that are on (the
        array's Augmentation sets them above 0) can change, and mixup / cutmix alphas stay above 0."""
        if name not in STRENGTHS:
            raise HftaNasError(f"an augmentation strength is one of {', '.join(STRENGTHS)}, got {name!r}.")
        if not getattr(self.augmentation, name):
            raise HftaNasError(f"augmentation {name} is off for this array; turn it on to give slots their own.")
        least_ok = value > 0 if name != "noise" else value >= 0
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not least_ok:
            raise HftaNasError(f"augmentation {name} must be a finite number {'>=' if name == 'noise' else '>'} 0.")
        self.strengths[name][slot] = float(value)

    def keep_slots(self, keep: Sequence[int]) -> None:
        self.rngs = [self.rngs[b] for b in keep]
        self.noise = [self.noise[b] for b in keep]
        self.strengths = {name: [values[b] for b in keep] for name, values in self.strengths.items()}

    def replace_slot(self, slot: int, seed: int) -> None:
        self.rngs[slot] = self._rng(seed)
        self.noise[slot] = self._noise_generator(seed)
        for name, values in self.strengths.items():
            values[slot] = float(getattr(self.augmentation, name))

    def copy_slot(self, source: int, target: int) -> None:
        """Slot `target` continues slot `source`'s random streams (it augments as the source would)."""
        self.rngs[target] = copy.deepcopy(self.rngs[source])
        self.noise[target] = torch.Generator(device=self.device).set_state(self.noise[source].get_state())
        for values in self.strengths.values():
            values[target] = values[source]

    def state_dict(self) -> dict[str, Any]:
        return {
            "rngs": [rng.bit_generator.state for rng in self.rngs],
            "noise": [g.get_state().to("cpu") for g in self.noise],
            "strengths": copy.deepcopy(self.strengths),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for rng, saved in zip(self.rngs, state["rngs"]):
            rng.bit_generator.state = saved
        for generator, saved in zip(self.noise, state["noise"]):
            generator.set_state(saved)
        if "strengths" in state:  # (checkpoints written before slots had strengths of their own have none)
            self.strengths = copy.deepcopy(state["strengths"])
