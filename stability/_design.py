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
- "grid" (with --decompose grid): k init seeds crossed with k data seeds
  (k x k models, k the nearest integer to sqrt(S), at least 2), dropout
  varied per cell when it is in `vary`; a two-way ANOVA splits the variance
  into init, data and their interaction with the residual.

Every design draws from streams of its own (the design is part of the
SeedSequence entropy), so no model is trained twice across designs and the
designs' variance estimates are independent, as the interval on their sum
assumes. The "all" design keeps the streams of earlier versions, so a stored
main study stays reusable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hfta_nas.errors import HftaNasError

from ._result import DEFAULT_VARY, SOURCES

# the position names each design's streams: append, never reorder (stored studies are found by their seeds)
DESIGNS = ("all", "only_init", "only_data", "only_dropout", "grid", "only_split")
DECOMPOSITIONS = ("sources", "grid")  # --decompose (one source at a time) and --decompose grid


def source_seed(base_seed: int, source: str, index: int, design: str = "all") -> int:
    """Seed number `index` of `source`'s stream in `design` (a 31-bit integer, valid for torch.manual_seed)."""
    entropy = [base_seed, SOURCES.index(source), index]
    if design != "all":
        entropy.append(DESIGNS.index(design))
    state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint32)
    return int(state[0] >> 1)


def grid_size(n_seeds: int) -> int:
    """Levels per factor of the init x data grid for a study of `n_seeds` seeds."""
    return max(2, round(math.sqrt(n_seeds)))


@dataclass(frozen=True)
class SeedPlan:
    """One model to train: where it sits in the design and the seed of every source."""

    design: str
    seed_index: int
    seeds: dict[str, int]  # source -> seed


def parse_vary(text: str | Sequence[str]) -> tuple[str, ...]:
    """'init,data' -> ('init', 'data'); 'all' -> init, data and dropout (the split only when named);
    errors name the valid ones."""
    names = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    if names == ["all"]:  # every source a study varied before the split was one: stored studies stay reusable
        return DEFAULT_VARY
    unknown = [n for n in names if n not in SOURCES]
    if unknown or not names:
        raise HftaNasError(f"--vary takes a comma-separated subset of {', '.join(SOURCES)} (or 'all'), got {text!r}.")
    return tuple(s for s in SOURCES if s in names)


def check_design(n_seeds: int, *, vary: Sequence[str], decompose: bool | str | None) -> str | None:
    """HftaNasError for a design `plan` cannot make (checked before anything is stored); else
    the decomposition, parsed."""
    if not isinstance(n_seeds, int) or isinstance(n_seeds, bool) or n_seeds < 1:
        raise HftaNasError(f"the number of seeds must be a positive integer, got {n_seeds!r}.")
    decompose = parse_decompose(decompose)
    if decompose is not None and n_seeds < 2:
        raise HftaNasError(
            f"--decompose splits the seeds' variance by its sources, and a variance needs two seeds; "
            f"give --seeds 2 or more (got {n_seeds})."
        )
    if decompose == "sources" and len(vary) < 2:
        raise HftaNasError(
            "--decompose attributes variance to several sources; vary at least two (e.g. --vary init,data)."
        )
    if decompose == "grid" and not {"init", "data"} <= set(vary):
        raise HftaNasError("--decompose grid crosses init seeds with data seeds; vary both (e.g. --vary init,data).")
    return decompose


def plan(
    n_seeds: int, *, vary: Sequence[str] = DEFAULT_VARY, decompose: bool | str | None = None, base_seed: int = 0
) -> list[SeedPlan]:
    """The models of one configuration's study, main design first; `decompose`: None (or False),
    "sources" (or True: one design per varied source) or "grid" (init x data)."""
    decompose = check_design(n_seeds, vary=vary, decompose=decompose)
    plans = [SeedPlan("all", i, _seeds(base_seed, "all", vary, i)) for i in range(n_seeds)]
    if decompose == "sources":
        plans += [
            SeedPlan(f"only_{s}", i, _seeds(base_seed, f"only_{s}", (s,), i)) for s in vary for i in range(n_seeds)
        ]
    elif decompose == "grid":
        k = grid_size(n_seeds)
        plans += [
            SeedPlan(
                "grid",
                i * k + j,
                {
                    "init": source_seed(base_seed, "init", i, "grid"),
                    "data": source_seed(base_seed, "data", j, "grid"),
                    "dropout": source_seed(base_seed, "dropout", i * k + j if "dropout" in vary else 0, "grid"),
                },
            )
            for i in range(k)
            for j in range(k)
        ]
    return plans


def _seeds(base_seed: int, design: str, varied: Sequence[str], index: int) -> dict[str, int]:
    """Seed `index` of every source in `design`: the varied ones move, the others keep their first seed;
    the split has a seed only where it varies (elsewhere the data's own split is used)."""
    return {
        s: source_seed(base_seed, s, index if s in varied else 0, design)
        for s in SOURCES
        if s != "split" or s in varied
    }


def parse_decompose(value: bool | str | None) -> str | None:
    """None / False: no decomposition; True or "sources": one source at a time; "grid": init x data."""
    if value in (None, False, ""):
        return None
    if value is True:
        return "sources"
    if value not in DECOMPOSITIONS:
        raise HftaNasError(f"--decompose takes {' or '.join(DECOMPOSITIONS)} (or nothing: sources), got {value!r}.")
    return str(value)
