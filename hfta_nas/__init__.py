"""hfta-nas: train many candidate models at once as one horizontally fused array.

Every public name loads on first use (PEP 562): `import hfta_nas` costs nothing, so the
command line (`hfta_nas.cli`) starts without torch, and engine-only use never imports
Optuna (the search core, `hfta_nas.search`, is imported only when one of its names is
asked for). `from hfta_nas import ModelArray, optimize` works as an eager import would.

The repository keeps `stability/`, `search_spaces/` and `cli.py` beside this folder; the
wheel maps them into this package (`hfta_nas.stability`, `hfta_nas.search_spaces`,
`hfta_nas.cli`: no generic top-level names in site-packages). In a clone, the same names
resolve to the folders beside this one (see `_beside_in_a_clone`).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below, for readers and type checkers; at run time see __getattr__
    from hfta_nas import data, models, optim
    from hfta_nas import search as search  # re-exported on first use
    from hfta_nas._limits import (
        DEFAULT_STORAGE_PATIENCE_S,
        MAX_ARRAY_SIZE,
        MAX_BATCH_SIZE,
        MAX_EPOCHS,
        MAX_STORAGE_PATIENCE_S,
        MAX_TRIALS,
    )
    from hfta_nas._version import __version__ as __version__
    from hfta_nas.array._model_array import FusionSignature, ModelArray, check_fusable
    from hfta_nas.envelope._probe import PaddingCost, padding_cost
    from hfta_nas.errors import FusionError, FusionFallbackWarning, HftaNasError
    from hfta_nas.search import Candidate, Explore, PBTSummary, SearchSummary, optimize, pbt, plan
    from hfta_nas.training._allocator import keep_freed_memory
    from hfta_nas.training._objectives import (
        CLASSIFICATION_LOSSES,
        LOSSES,
        REGRESSION_LOSSES,
        Objective,
        higher_is_better,
        loss_kind,
        trained_metric_names,
    )
    from hfta_nas.training._run import TrainRun, train
    from hfta_nas.training._trainer import ArrayTrainer, EarlyStopping, EpochReport, SlotResult

# public name -> (module, its name there; None: the module itself)
_PUBLIC: dict[str, tuple[str, str | None]] = {}


def _register(module: str, *names: str) -> None:
    _PUBLIC.update({name: (module, name) for name in names})


_register("hfta_nas._limits", "DEFAULT_STORAGE_PATIENCE_S", "MAX_ARRAY_SIZE", "MAX_BATCH_SIZE", "MAX_EPOCHS")
_register("hfta_nas._limits", "MAX_STORAGE_PATIENCE_S", "MAX_TRIALS")
_register("hfta_nas._version", "__version__")
_register("hfta_nas.array._model_array", "FusionSignature", "ModelArray", "check_fusable")
_register("hfta_nas.envelope._probe", "PaddingCost", "padding_cost")
_register("hfta_nas.errors", "FusionError", "FusionFallbackWarning", "HftaNasError")
_register("hfta_nas.training._allocator", "keep_freed_memory")
_register("hfta_nas.training._objectives", "CLASSIFICATION_LOSSES", "LOSSES", "REGRESSION_LOSSES", "Objective")
_register("hfta_nas.training._objectives", "higher_is_better", "loss_kind", "trained_metric_names")
_register("hfta_nas.training._run", "TrainRun", "train")
_register("hfta_nas.training._trainer", "ArrayTrainer", "EarlyStopping", "EpochReport", "SlotResult")
_register("hfta_nas.search", "Candidate", "Explore", "PBTSummary", "SearchSummary", "optimize", "pbt", "plan")
_PUBLIC.update({name: (f"hfta_nas.{name}", None) for name in ("data", "models", "optim", "search")})

__all__ = [
    "ArrayTrainer",
    "Candidate",
    "EarlyStopping",
    "CLASSIFICATION_LOSSES",
    "DEFAULT_STORAGE_PATIENCE_S",
    "LOSSES",
    "MAX_ARRAY_SIZE",
    "MAX_BATCH_SIZE",
    "MAX_EPOCHS",
    "MAX_STORAGE_PATIENCE_S",
    "MAX_TRIALS",
    "REGRESSION_LOSSES",
    "Objective",
    "EpochReport",
    "Explore",
    "FusionError",
    "FusionFallbackWarning",
    "FusionSignature",
    "HftaNasError",
    "ModelArray",
    "PaddingCost",
    "PBTSummary",
    "SearchSummary",
    "SlotResult",
    "TrainRun",
    "check_fusable",
    "data",
    "higher_is_better",
    "keep_freed_memory",
    "loss_kind",
    "models",
    "optim",
    "optimize",
    "padding_cost",
    "pbt",
    "plan",
    "train",
    "trained_metric_names",
]


def __getattr__(name: str) -> Any:
    """A public name, imported the first time it is asked for and kept."""
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _PUBLIC[name]
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "search"})


def _beside_in_a_clone() -> None:
    """In a clone, `hfta_nas.stability`, `hfta_nas.search_spaces` and `hfta_nas.cli` are the
    folders and the file beside this package: search them there too. An installed wheel holds
    them inside this folder, and its path is left alone."""
    here = Path(__file__).resolve().parent
    if not (here / "stability").is_dir() and (here.parent / "stability" / "__init__.py").is_file():
        __path__.append(str(here.parent))  # noqa: F821 - a package's own __path__


_beside_in_a_clone()
