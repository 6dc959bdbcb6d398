"""The Optuna search driver: candidates grouped by shape signature, trained as arrays."""

from hfta_nas.search._driver import Search, SearchSummary, trial_seeds
from hfta_nas._files import atomic_write_text, save_weights
from hfta_nas.search._signature import shape_signature
from hfta_nas.search._storage import DEFAULT_STORAGE, dashboard_command, open_storage


def run_search(space, **options) -> SearchSummary:
    """Run a search space (see `Search` for the options) and return its summary."""
    return Search(space, **options).run()


__all__ = [
    "DEFAULT_STORAGE",
    "Search",
    "SearchSummary",
    "atomic_write_text",
    "dashboard_command",
    "open_storage",
    "run_search",
    "save_weights",
    "shape_signature",
    "trial_seeds",
]
