"""`--dry-run`: the arrays a search would train, without training and without writing.

The plan runs the search's own rounds (`next_pool`, then the packing policy)
against an in-memory copy of the study: the same finished trials, the same
queued ones, a copy of the seeded sampler. Its first round is exactly what the
real run trains first. Later rounds are what the sampler proposes when no
result comes back in between; the real run feeds each array's results to the
sampler, so from the second round on its proposals (and refills, which a plan
cannot know) may differ. The step cost is measured as the real run measures it.
"""

from __future__ import annotations

import copy
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna

from hfta_nas.data import Dataset
from hfta_nas.envelope._probe import padding_fraction
from hfta_nas.search._candidate import Candidate
from hfta_nas.search._credentials import hide_passwords
from hfta_nas.search._optimize import _Search, optimize
from hfta_nas.search._storage import in_memory_study

# With a timeout-only budget the plan cannot know how many arrays will run.
UNBOUNDED_PLAN_ARRAYS = 3
MOST_PLANNED_ARRAYS = 50  # a dry run of a million trials shows the start of its plan, in seconds


@dataclass
class PlannedArray:
    """One array of the plan."""

    array: int
    array_size: int
    trials: list[dict[str, Any]]  # number, params, seeds, useful multiply-adds per sample
    architectures: int
    useful_macs: int
    executed_macs: int
    estimated_s: float

    @property
    def waste(self) -> float:
        return padding_fraction(self.useful_macs, self.executed_macs)


@dataclass
class SearchPlan:
    """What `hfta-nas search --dry-run` prints (and `--json` dumps)."""

    study_name: str
    storage: str
    n_trials: int | None
    done: int  # finished trials already in the study (they count against n_trials)
    array_size: int | str
    pool_size: int
    step_costs: dict[str, dict[str, float]] = field(default_factory=dict)
    arrays: list[PlannedArray] = field(default_factory=list)
    note: str = ""

    @property
    def mean_occupancy(self) -> float:
        """Planned slots / array size, averaged over the planned arrays."""
        if not self.arrays:
            return 0.0
        return sum(len(a.trials) / a.array_size for a in self.arrays) / len(self.arrays)

    @property
    def estimated_s(self) -> float:
        return sum(a.estimated_s for a in self.arrays)


def plan(
    study: optuna.Study,
    build: Callable[[optuna.Trial], Candidate],
    data: Dataset | None = None,
    *,
    storage: str | None = None,
    max_arrays: int | None = None,
    **options: Any,
) -> SearchPlan:
    """The arrays `optimize(study, build, data, **options)` would train, by the same policy,
    without training; `study` is not changed (the plan asks in a copy)."""
    copied = in_memory_study(
        study.study_name,
        list(study.directions),
        copy.deepcopy(study.sampler),
        copy.deepcopy(study.pruner),
        copy_of=study,
    )  # its sampler's state too: the real run starts from it
    search = _Search(copied, build, data, **{**_OPTION_DEFAULTS, **options})
    search.started = time.monotonic()
    if max_arrays is None:  # a timeout has no end to plan to, and a huge budget would take as long to plan
        max_arrays = UNBOUNDED_PLAN_ARRAYS if search.n_trials is None else MOST_PLANNED_ARRAYS
    result = SearchPlan(
        study.study_name,
        hide_passwords(storage) if storage else search.location,
        search.n_trials,
        search.ledger.counted(True),
        search.array_size,
        search.pool_size,
    )
    optimizers: set[str] = set()
    while max_arrays is None or len(result.arrays) < max_arrays:
        pool = search.next_pool()
        if not pool:
            break
        for planned in search.next_arrays(pool):
            optimizers |= {str(p.candidate.optimizer) for p in planned.proposals}
            result.arrays.append(
                PlannedArray(
                    len(result.arrays) + 1,
                    planned.array_size or search.max_slots(planned.proposals),
                    [
                        {
                            "number": p.number,
                            "params": dict(p.trial.params),
                            "seeds": dict(p.seeds),
                            "useful_macs": p.useful_macs,
                        }
                        for p in planned.proposals
                    ],
                    planned.architectures,
                    planned.useful_macs,
                    planned.executed_macs,
                    planned.seconds,
                )
            )
    result.step_costs = {key: cost.as_dict() for key, cost in search.costs.items()}
    notes = []
    if search.n_trials is None:
        notes.append(
            f"the budget is a timeout: the first {len(result.arrays)} arrays are shown; "
            "later arrays follow the sampler's proposals as results come in"
        )
    planned = sum(len(a.trials) for a in result.arrays)
    if search.n_trials is not None and len(result.arrays) >= max_arrays and planned < search.n_trials - result.done:
        notes.append(
            f"the first {len(result.arrays)} arrays ({planned} of the {search.n_trials - result.done} trials "
            "left) are shown; the rest are packed by the same policy as results come in"
        )
    if len(optimizers) > 1:
        notes.append(
            f"the trials use {len(optimizers)} optimizers ({', '.join(sorted(optimizers))}): trials of different "
            "optimizers never share an array (an array steps all its slots with one optimizer), so they fuse "
            "less; a study per optimizer, searching its own settings, fuses more"
        )
    result.note = "\n".join(notes)
    return result


# optimize's own defaults, read from its signature so the plan cannot drift from the run
_OPTION_DEFAULTS: dict[str, Any] = {
    name: p.default for name, p in inspect.signature(optimize).parameters.items() if p.kind is p.KEYWORD_ONLY
}
