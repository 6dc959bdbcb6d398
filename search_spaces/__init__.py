"""Search spaces: the YAML file that says what to search, its validation, and its Optuna form.

```pycon
>>> from hfta_nas.search_spaces import load_space, SHIPPED_SPACES
>>> space = load_space(SHIPPED_SPACES["mnist1d_cnn"])
>>> study = optuna.create_study(sampler=space.make_sampler(), pruner=space.make_pruner(),
...                             directions=space.directions)
>>> trial = study.ask()
>>> config = space.resolve(space.suggest(trial))      # a ResolvedConfig: one candidate
>>> config.train_kwargs()["hparams"]["lr"]
```

Every problem with a file raises `SpaceError` (an `HftaNasError`) whose
message reads `file:line: dotted.key: what was expected (got ...)`.
The schema is documented key by key in search_spaces/README.md.
"""

from pathlib import Path

from ._errors import Problem, SpaceError
from ._pbt import pbt_notes, pbt_options
from ._resolved import ResolvedConfig, parse_config_overrides, read_text
from ._schema import (
    DISTRIBUTIONS,
    METRICS,
    PRUNERS,
    SAMPLERS,
    Categorical,
    Fixed,
    IntLogUniform,
    IntUniform,
    LogUniform,
    Uniform,
)
from ._search import (
    architecture_params,
    candidate_builder,
    open_space_study,
    plan_search,
    run_search,
    storage_patience_of,
    study_name_of,
)
from ._sources import check_sources
from ._space import SearchSpace, load_space, parse_space

SHIPPED_SPACES: dict[str, Path] = {path.stem: path for path in sorted(Path(__file__).parent.glob("*.yaml"))}
"""Name (file stem) -> path of every search space shipped in this folder."""

__all__ = [
    "DISTRIBUTIONS",
    "METRICS",
    "PRUNERS",
    "SAMPLERS",
    "SHIPPED_SPACES",
    "Categorical",
    "Fixed",
    "IntLogUniform",
    "IntUniform",
    "LogUniform",
    "Problem",
    "ResolvedConfig",
    "SearchSpace",
    "SpaceError",
    "Uniform",
    "architecture_params",
    "candidate_builder",
    "check_sources",
    "load_space",
    "open_space_study",
    "parse_config_overrides",
    "parse_space",
    "pbt_notes",
    "pbt_options",
    "plan_search",
    "read_text",
    "run_search",
    "storage_patience_of",
    "study_name_of",
]
