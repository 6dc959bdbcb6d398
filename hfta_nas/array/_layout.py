"""Where each named parameter sits in a slot's row of the array's flat [B, P] tensor.

Parameters are laid out one after another in `named_parameters()` order (tied
weights once, under their first name); every tensor of [B, P] rows, the
parameters themselves, their gradients, the envelope's padding mask, is read
per parameter through the same views.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class FlatLayout:
    """entries: (name, offset, shape) per parameter; aliases: every parameter name
    (tied ones included) to its canonical name, the one that has an entry."""

    entries: tuple[tuple[str, int, torch.Size], ...]
    aliases: dict[str, str]

    @classmethod
    def of(cls, model: nn.Module) -> FlatLayout:
        entries, offset = [], 0
        for name, param in model.named_parameters():
            entries.append((name, offset, param.shape))
            offset += param.numel()
        canonical: dict[int, str] = {}
        aliases = {
            name: canonical.setdefault(id(param), name)
            for name, param in model.named_parameters(remove_duplicate=False)
        }
        return cls(tuple(entries), aliases)

    @property
    def size(self) -> int:
        """P: the numbers in one slot's row."""
        return sum(shape.numel() for _, _, shape in self.entries)

    def views(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each parameter's [B, *shape] view of a [B, P] tensor."""
        batch = rows.shape[0]
        return {
            name: rows[:, offset : offset + shape.numel()].view(batch, *shape) for name, offset, shape in self.entries
        }

    def flatten(self, model: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """One model's parameters as a row [P]."""
        params = dict(model.named_parameters())
        return torch.cat([params[name].detach().reshape(-1).to(dtype) for name, _, _ in self.entries])
