"""The Optuna search driver: candidates grouped by shape signature, trained as arrays."""

from hfta_nas.search._driver import Search, SearchSummary, trial_seeds
from hfta_nas.search._plan import PlannedArray, SearchPlan
from hfta_nas._files import atomic_write_text, save_weights
from hfta_nas.search._signature import shape_signature
from hfta_nas.search._storage import DEFAULT_STORAGE, dashboard_command, open_storage


def run_search(space, **options) -> SearchSummary:
    """Run a search space (see `Search` for the options) and return its summary."""
    return Search(space, **options).run()


def plan_search(space, max_arrays=None, **options) -> SearchPlan:
    """The arrays `run_search(space, **options)` would train, by its fill policy,
    without training and without writing to the storage (`--dry-run`)."""
    return Search(space, dry_run=True, **options).plan(max_arrays)


__all__ = [
    "DEFAULT_STORAGE",
    "PlannedArray",
    "Search",
    "SearchPlan",
    "SearchSummary",
    "atomic_write_text",
    "dashboard_command",
    "open_storage",
    "plan_search",
    "run_search",
    "save_weights",
    "shape_signature",
    "trial_seeds",
]
