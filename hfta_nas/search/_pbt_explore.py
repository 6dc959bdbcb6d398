"""What population-based training may explore: the values a slot keeps for itself
(`hfta_nas.train._slot_values`); anything else changes shapes or what the array shares, so an
exploit could not copy weights across, and is refused, named."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hfta_nas.errors import HftaNasError
from hfta_nas.search._pbt_settings import Explore
from hfta_nas.train._slot_values import DROPOUT, slot_value_names


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
        if name == DROPOUT and not (how.low >= 0 and how.high < 1):
            raise HftaNasError(f"pbt explores dropout rates in [0, 1); got low {how.low}, high {how.high}.")
