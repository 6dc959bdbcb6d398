"""Which seeds each trained model gets: the design of a stability study.

Every source of randomness (init, data order, dropout) has its own seed
stream, derived from the study's base seed with NumPy's SeedSequence, so
seed i of one source says nothing about seed i of another. A source that
is not varied keeps the stream's first seed in every slot.

Designs (the `design` column of seeds.csv):
- "all": the sources in `vary` change together across the S seeds; this
  is the study's main result.
- "only_<source>" (with --decompose): only that source changes, the others
  stay at their first seed. The variance of each such design is that
  source's share of the total (Bouthillier et al. 2021 vary one source at
  a time the same way); the "all" design gives the total to compare with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hfta_nas.errors import HftaNasError
from stability._result import SOURCES


def source_seed(base_seed: int, source: str, index: int) -> int:
    """Seed number `index` of `source`'s stream (a 31-bit integer, valid for torch.manual_seed)."""
    state = np.random.SeedSequence([base_seed, SOURCES.index(source), index]).generate_state(1, dtype=np.uint32)
    return int(state[0] >> 1)


@dataclass(frozen=True)
class SeedPlan:
    """One model to train: where it sits in the design and the seed of every source."""

    design: str
    seed_index: int
    seeds: dict[str, int]  # source -> seed


def parse_vary(text: str | Sequence[str]) -> tuple[str, ...]:
    """'init,data' -> ('init', 'data'); 'all' -> every source; errors name the valid ones."""
    names = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    if names == ["all"]:
        return SOURCES
    unknown = [n for n in names if n not in SOURCES]
    if unknown or not names:
        raise HftaNasError(f"--vary takes a comma-separated subset of {', '.join(SOURCES)} (or 'all'), got {text!r}.")
    return tuple(s for s in SOURCES if s in names)


def plan(n_seeds: int, *, vary: Sequence[str] = SOURCES, decompose: bool = False, base_seed: int = 0) -> list[SeedPlan]:
    """The models of one configuration's study, main design first."""
    if not isinstance(n_seeds, int) or isinstance(n_seeds, bool) or n_seeds < 1:
        raise HftaNasError(f"the number of seeds must be a positive integer, got {n_seeds!r}.")
    designs = [("all", tuple(vary))]
    if decompose:
        if len(vary) < 2:
            raise HftaNasError("--decompose attributes variance to several sources; vary at least two (--vary init,data,...).")
        designs += [(f"only_{source}", (source,)) for source in vary]
    return [
        SeedPlan(design, index, {s: source_seed(base_seed, s, index if s in varied else 0) for s in SOURCES})
        for design, varied in designs
        for index in range(n_seeds)
    ]
