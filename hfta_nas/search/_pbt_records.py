"""What a PBT run remembers about its members, and the one choice it makes at random.

Per member (keyed by its trial number):

- `values`: the explored hyper-parameters its slot held in each epoch (its own history);
- `roots`: per epoch, the member whose initial weights its weights descend from (the
  plot colours lines by it);
- `schedule`: the hyper-parameters *its weights* trained with in each epoch. At an exploit
  the target takes the source's schedule so far, so the final best member's schedule is
  what re-running it from scratch replays (as PBT papers re-check found schedules);
- `lineage`: each exploit it underwent: the epoch, the trial and slot it copied.

Everything here is plain lists and dicts, saved in checkpoints and in trial attributes.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Exploit:
    """One exploit: `target` copied `source` after `epoch` epochs, then explored to `changes`."""

    epoch: int
    target: int
    source: int
    source_slot: int
    changes: dict[str, tuple[float, float]]  # hyper-parameter -> (copied value, explored value)


@dataclass
class Records:
    """The population's records (see the module docstring) and the run's random generator."""

    members: list[int]
    seed: int
    values: dict[int, dict[str, list[float]]] = field(default_factory=dict)
    roots: dict[int, list[int]] = field(default_factory=dict)
    schedule: dict[int, dict[str, list[float]]] = field(default_factory=dict)
    lineage: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    root_now: dict[int, int] = field(default_factory=dict)  # whose initial weights each member's descend from
    exploits: int = 0

    def __post_init__(self) -> None:
        # the run's only random source: which top member each bottom member copies, and explore's draws
        self.rng = np.random.default_rng([self.seed, 0x9B7])
        for number in self.members:
            self.values.setdefault(number, {})
            self.roots.setdefault(number, [])
            self.schedule.setdefault(number, {})
            self.lineage.setdefault(number, [])
            self.root_now.setdefault(number, number)

    def record_epoch(self, current: dict[int, dict[str, float]]) -> None:
        """The hyper-parameters each running member trained this epoch with."""
        for number, hparams in current.items():
            for name, value in hparams.items():
                self.values[number].setdefault(name, []).append(value)
                self.schedule[number].setdefault(name, []).append(value)
            self.roots[number].append(self.root_now[number])

    def pairs(self, ranked: list[int], movers: int) -> list[tuple[int, int]]:
        """(target, source) for each of the `movers` worst members of `ranked` (best first): a
        source drawn uniformly from the `movers` best."""
        top, bottom = ranked[:movers], ranked[-movers:]
        return [(target, top[int(self.rng.integers(len(top)))]) for target in bottom]

    def exploited(self, exploit: Exploit) -> None:
        """The target's weights are now the source's: it takes the source's schedule and root."""
        target, source = exploit.target, exploit.source
        self.schedule[target] = copy.deepcopy(self.schedule[source])
        self.root_now[target] = self.root_now[source]
        self.lineage[target].append(
            {
                "epoch": exploit.epoch,
                "from_trial": source,
                "from_slot": exploit.source_slot,
                "explored": {name: new for name, (_, new) in exploit.changes.items()},
            }
        )
        self.exploits += 1

    def state_dict(self) -> dict[str, Any]:
        """Every field, copied, and the random generator's state."""
        return {**dataclasses.asdict(self), "rng": copy.deepcopy(self.rng.bit_generator.state)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Records:
        records = cls(**copy.deepcopy({f.name: state[f.name] for f in dataclasses.fields(cls)}))
        records.rng.bit_generator.state = copy.deepcopy(state["rng"])
        return records
