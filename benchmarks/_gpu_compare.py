"""What every GPU check records: a named comparison (max difference, tolerance, pass) or a failure.

A difference is measured as the tests measure it (tests/test_trainer.py's assert_equivalent): per
tensor, the largest |got - want| relative to the reference tensor's largest magnitude, the maximum
over every tensor of every slot. Tensors are compared in float64 on the CPU, wherever they live.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

# float noise: the tests' tolerances (tests/test_optim.py, test_trainer.py, test_envelope.py)
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


@dataclass
class Row:
    """One comparison (or one failure: max_diff None and an error)."""

    check: str
    name: str
    max_diff: float | None
    tolerance: float | None
    passed: bool
    detail: str = ""


def tensor_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| over the tensor, relative to max |want| (absolute where want is all zero)."""
    got, want = got.detach().to("cpu", torch.float64), want.detach().to("cpu", torch.float64)
    if got.shape != want.shape:
        return float("inf")
    if got.numel() == 0:
        return 0.0
    scale = want.abs().max().item()
    return (got - want).abs().max().item() / (scale if scale > 0 else 1.0)


def state_difference(got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor]) -> float:
    """The largest tensor_difference over a state_dict's entries (inf where the keys differ)."""
    if list(got) != list(want):
        return float("inf")
    return max((tensor_difference(got[key], want[key]) for key in want), default=0.0)


def slots_difference(array: Any, models: Iterable[torch.nn.Module]) -> float:
    """Every slot of `array` against its own plain model: parameters and buffers."""
    return max(state_difference(array.slot_state_dict(slot), model.state_dict()) for slot, model in enumerate(models))


@dataclass
class Recorder:
    """Collects the rows of every check; a check that raises is one failed row, and the run goes on."""

    rows: list[Row] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def compare(self, check: str, name: str, difference: float, tolerance: float, detail: str = "") -> None:
        self.rows.append(Row(check, name, difference, tolerance, bool(difference <= tolerance), detail))

    def condition(self, check: str, name: str, holds: bool, detail: str) -> None:
        """A property that is not a difference (exit 0, a split seen, a sane accuracy)."""
        self.rows.append(Row(check, name, None, None, bool(holds), detail))

    def note(self, check: str, name: str, detail: str) -> None:
        """A figure worth reading that no tolerance bounds (it never fails the check)."""
        self.rows.append(Row(check, name, None, None, True, f"note: {detail}"))

    def skip(self, check: str, name: str, why: str) -> None:
        self.rows.append(Row(check, name, None, None, True, f"skipped: {why}"))

    def run(self, check: str, function: Callable[..., None], *args: Any) -> None:
        started = time.perf_counter()
        try:
            function(self, *args)
        except Exception as error:  # a crash on CUDA is a finding, recorded with where it happened
            where = traceback.extract_tb(error.__traceback__)[-1]
            detail = f"{type(error).__name__}: {error} ({where.filename}:{where.lineno})"
            self.rows.append(Row(check, "raised", None, None, False, detail[:2000]))
        self.seconds[check] = round(time.perf_counter() - started, 2)

    def as_json(self) -> list[dict[str, Any]]:
        return [asdict(row) for row in self.rows]
