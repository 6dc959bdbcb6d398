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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.storages import InMemoryStorage

from hfta_nas.data import Dataset
from hfta_nas.search._candidate import Candidate
from hfta_nas.search._optimize import _Search

# With a timeout-only budget the plan cannot know how many arrays will run.
UNBOUNDED_PLAN_ARRAYS = 3


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
        return 1.0 - self.useful_macs / self.executed_macs if self.executed_macs else 0.0


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


def in_memory_copy(study: optuna.Study) -> optuna.Study:
    """A copy of `study` (trials, attributes, a copy of its sampler and pruner) in memory."""
    memory = optuna.create_study(storage=InMemoryStorage(), study_name=study.study_name, directions=study.directions,
                                 sampler=copy.deepcopy(study.sampler), pruner=copy.deepcopy(study.pruner))
    for key, value in study.user_attrs.items():
        memory.set_user_attr(key, value)
    memory.add_trials(study.get_trials(deepcopy=False))
    if study.metric_names:
        memory._storage.set_study_metric_names(memory._study_id, study.metric_names)
    return memory


def plan(study: optuna.Study, build: Callable[[optuna.Trial], Candidate], data: Dataset | None = None, *,
         storage: str | None = None, max_arrays: int | None = None, **options: Any) -> SearchPlan:
    """The arrays `optimize(study, build, data, **options)` would train, by the same policy,
    without training; `study` is not changed (the plan asks in a copy)."""
    search = _Search(in_memory_copy(study), build, data, **{**_OPTION_DEFAULTS, **options})
    search.started = time.monotonic()
    if max_arrays is None and search.n_trials is None:
        max_arrays = UNBOUNDED_PLAN_ARRAYS
    result = SearchPlan(study.study_name, storage or search.location, search.n_trials, search.ledger.counted(True),
                        search.array_size, search.pool_size)
    while max_arrays is None or len(result.arrays) < max_arrays:
        pool = search.next_pool()
        if not pool:
            break
        for planned in search.pack(pool):
            result.arrays.append(PlannedArray(
                len(result.arrays) + 1, search.max_slots(planned.proposals),
                [{"number": p.number, "params": dict(p.trial.params), "seeds": dict(p.seeds), "useful_macs": p.useful_macs}
                 for p in planned.proposals],
                planned.architectures, planned.useful_macs, planned.executed_macs, planned.seconds))
    result.step_costs = {key: cost.as_dict() for key, cost in search.costs.items()}
    if search.n_trials is None:
        result.note = (f"the budget is a timeout: the first {len(result.arrays)} arrays are shown; "
                       "later arrays follow the sampler's proposals as results come in")
    return result


_OPTION_DEFAULTS: dict[str, Any] = dict(n_trials=None, timeout=None, array_size=8, metrics=None, seed=0, device="cpu",
                                        dtype="float32", out_dir=None, on_event=None, max_waste=None, replicate=None,
                                        step_cost=None)
