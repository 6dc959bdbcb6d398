"""`--dry-run`: the arrays a search would train, without training and without writing.

The plan runs the search's own fill policy (`Search._next_group`) against an
in-memory copy of the study: the same finished trials, the same queued and
interrupted ones, the same seeded sampler. Its first array is exactly the one
the real run trains first. Later arrays are what the policy makes of the
sampler's proposals when no result comes back in between; the real run feeds
each array's results to the sampler, so from the second array on its
proposals (and pruning refills, which a plan cannot know) may differ.
Nothing reaches the real storage: no study is created, no trial is asked there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import InMemoryStorage, JournalStorage
from optuna.storages.journal import JournalFileBackend

from hfta_nas.errors import HftaNasError
from hfta_nas.search._storage import DEFAULT_STORAGE, _URL_SCHEMES

# With a timeout-only budget the plan cannot know how many arrays will run.
UNBOUNDED_PLAN_ARRAYS = 3


@dataclass
class PlannedArray:
    """One array of the plan: its shape signature, size and candidates."""

    array: int
    signature: str
    size: int  # the array size (array.size, or what 'auto' chose)
    architecture: dict[str, Any]  # the searched params that fix the shape
    trials: list[dict[str, Any]]  # number, params, seeds, how (asked freely / filled)


@dataclass
class SearchPlan:
    """What `hfta-nas search --dry-run` prints (and `--json` dumps)."""

    study_name: str
    storage: str
    n_trials: int | None
    done: int  # finished trials already in the study (they count against n_trials)
    array_size: int | str
    pool_size: int
    arrays: list[PlannedArray] = field(default_factory=list)
    note: str = ""

    @property
    def mean_occupancy(self) -> float:
        """Planned slots / array size, averaged over the planned arrays (before any pruning)."""
        if not self.arrays:
            return 0.0
        return sum(len(a.trials) / a.size for a in self.arrays) / len(self.arrays)

    @property
    def signatures(self) -> int:
        return len({a.signature for a in self.arrays})


def _existing(location: str) -> optuna.storages.BaseStorage | None:
    """The real storage opened for reading, or None when there is nothing to read yet."""
    if location.startswith(_URL_SCHEMES):
        if location.startswith("sqlite:///") and not Path(location[len("sqlite:///"):]).exists():
            return None  # opening it would create the database file
        try:
            return optuna.storages.get_storage(location)
        except Exception as error:  # SQLAlchemy/driver errors vary by backend
            raise HftaNasError(f"cannot open storage '{location}': {type(error).__name__}: {error}") from error
    path = Path(location)
    if not path.is_file():
        return None
    try:
        return JournalStorage(JournalFileBackend(str(path)))
    except OSError as error:
        raise HftaNasError(f"cannot read journal file '{location}': {error}") from error


def in_memory_copy(storage: str | None, study_name: str) -> tuple[InMemoryStorage, str]:
    """(an in-memory storage holding a copy of the study's trials, the real location)."""
    location = storage or DEFAULT_STORAGE
    memory = InMemoryStorage()
    real = _existing(location)
    if real is not None and study_name in {s.study_name for s in optuna.get_all_study_summaries(real, include_best_trial=False)}:
        source = optuna.load_study(study_name=study_name, storage=real)
        copy = optuna.create_study(storage=memory, study_name=study_name, directions=source.directions)
        copy.add_trials(source.get_trials(deepcopy=False))
    return memory, location


def make_plan(search: Any, max_arrays: int | None = None) -> SearchPlan:
    """Run the fill policy of a dry-run `Search` until the budget is asked (or `max_arrays`)."""
    search._started = time.monotonic()
    search._retry_interrupted_trials()
    search._finished_at_start = search._finished()
    if max_arrays is None and search.n_trials is None:
        max_arrays = UNBOUNDED_PLAN_ARRAYS
    plan = SearchPlan(search.study_name, search.dashboard_location, search.n_trials, search._finished_at_start,
                      search.array_size, search.pool_size or search._size_for(max(search._remaining(), 1)))
    while max_arrays is None or len(plan.arrays) < max_arrays:
        group = search._next_group()
        if not group:
            break
        plan.arrays.append(PlannedArray(
            len(plan.arrays) + 1, group[0].signature, search._target, search._architecture(group[0]),
            [{"number": c.trial.number, "params": dict(c.trial.params), "seeds": dict(c.seeds),
              "how": "filled" if c.filled else "asked"} for c in group],
        ))
    waiting = sum(len(g) for g in search._pending.values())
    if search.n_trials is None:
        plan.note = (f"the budget is a timeout: the first {len(plan.arrays)} arrays are shown; "
                     "later arrays follow the sampler's proposals as results come in")
    elif waiting:
        plan.note = f"{waiting} more asked candidates wait for arrays beyond the {len(plan.arrays)} shown"
    return plan
