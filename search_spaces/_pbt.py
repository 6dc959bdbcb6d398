"""A space file with a `pbt:` block runs population-based training (`hfta_nas.pbt`) instead of a
search: the same study, data and candidates, the block's settings as `pbt`'s arguments."""

from __future__ import annotations

from typing import Any

from hfta_nas import Explore

from ._pbt_checks import explorable, explore_bounds
from ._space import SearchSpace


def pbt_options(space: SearchSpace) -> dict[str, Any]:
    """`hfta_nas.pbt`'s keyword arguments from the space's pbt block (checked when the file was read)."""
    spec = space.pbt
    if spec is None:
        raise ValueError(f"{space.source} has no pbt block")
    names, explore = explorable(space._file()), {}
    for key, how in spec.explore.items():
        low, high, log = explore_bounds(how, space.params.get(key))
        explore[names[key]] = Explore(low, high, log, tuple(how.factors))
    return {
        "population": spec.population,
        "interval": spec.interval,
        "metric": spec.metric,
        "quantile": spec.quantile,
        "resample_probability": spec.resample_probability,
        "explore": explore,
        "seed": space.seed if space.seed is not None else 0,
    }


def pbt_notes(space: SearchSpace) -> list[str]:
    """What a pbt block leaves unused in the file, said once before the run."""
    if space.pbt is None:
        return []
    notes = [
        f"pbt: {space.pbt.population} members train as one array for {space.training.epochs} epochs; "
        "budget and array settings are not used"
    ]
    if space.pruner.name not in (None, "none"):
        notes.append(f"pbt: the pruner '{space.pruner.name}' does not apply: members are never pruned")
    return notes
