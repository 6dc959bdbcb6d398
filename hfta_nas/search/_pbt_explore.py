"""What population-based training may explore: the values a slot keeps for itself
(`hfta_nas.training._slot_values`); anything else changes shapes or what the array shares, so an
exploit could not copy weights across, and is refused, named."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hfta_nas.errors import HftaNasError
from hfta_nas.optim._hparam_schedule import POSITIVE
from hfta_nas.search._candidate import check_split_has_data
from hfta_nas.search._pbt_settings import Explore
from hfta_nas.training._objectives import as_objective
from hfta_nas.training._slot_values import DROPOUT, slot_value_names


def check_explored(explore: Mapping[str, Explore], candidate: Any) -> None:
    """HftaNasError naming the first explored name that members of `candidate`'s kind cannot change."""
    names = slot_value_names(candidate.optimizer, candidate.augmentation)
    for name, how in explore.items():
        if name not in names:
            raise HftaNasError(
                f"pbt cannot explore '{name}': explore changes what a slot keeps for itself ({', '.join(names)}; "
                "an augmentation only when it is on); hyper-parameters that change the model's shapes cannot be "
                "explored (an exploit copies weights of one shape)."
            )
        problem = bounds_problem(name, how.low, how.high)
        if problem:
            raise HftaNasError(f"pbt cannot explore '{name}': {problem}.")


def bounds_problem(name: str, low: float, high: float) -> str | None:
    """Why [low, high] cannot hold values of `name` (None when it can): a dropout rate is in [0, 1),
    a mixup / cutmix alpha above 0."""
    if name == DROPOUT and not (low >= 0 and high < 1):
        return f"a dropout rate is in [0, 1), got min {low} and max {high}"
    if name in POSITIVE and low <= 0:
        return f"a Beta alpha is above 0, got min {low}"
    return None


def check_ranked_metric(candidate: Any, metric: str) -> None:
    """HftaNasError unless `metric` is measured every epoch for `candidate` (it ranks the members), with data."""
    objective = as_objective(candidate.loss)
    measured = [name for split in ("train", "val", "test") for name in objective.metric_names(split)]
    if metric not in measured:
        raise HftaNasError(
            f"pbt ranks members by a metric measured every epoch; '{metric}' is not one (measured: "
            f"{', '.join(measured)})."
        )
    check_split_has_data(candidate, metric)
