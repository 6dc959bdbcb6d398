"""hfta-nas: train many candidate models at once as one horizontally fused array.

The search core (`hfta_nas.search`: `optimize`, `plan`, `pbt`, `Candidate`,
`Explore`, `SearchSummary`, `PBTSummary`) loads on first use (PEP 562), so engine-only use never imports
Optuna; `from hfta_nas import optimize` works as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hfta_nas import data, models, optim
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
from hfta_nas.train._allocator import keep_freed_memory
from hfta_nas.train._objectives import (
    CLASSIFICATION_LOSSES,
    LOSSES,
    REGRESSION_LOSSES,
    Objective,
    higher_is_better,
    loss_kind,
    trained_metric_names,
)
from hfta_nas.train._run import TrainRun, train
from hfta_nas.train._trainer import ArrayTrainer, EarlyStopping, EpochReport, SlotResult

if TYPE_CHECKING:  # loaded on first use, see __getattr__
    from hfta_nas import search as search  # re-exported on first use
    from hfta_nas.search import Candidate, Explore, PBTSummary, SearchSummary, optimize, pbt, plan

_SEARCH_NAMES = ("Candidate", "Explore", "PBTSummary", "SearchSummary", "optimize", "pbt", "plan")

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
    """`hfta_nas.search` and its names here, imported the first time one is asked for (it imports Optuna)."""
    if name == "search":
        return importlib.import_module("hfta_nas.search")
    if name in _SEARCH_NAMES:
        value = getattr(importlib.import_module("hfta_nas.search"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "search"})
