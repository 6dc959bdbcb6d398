"""hfta-nas: train many candidate models at once as one horizontally fused array."""

from hfta_nas import data, models, optim
from hfta_nas._allocator import keep_freed_memory
from hfta_nas._array import FusionSignature, ModelArray, check_fusable
from hfta_nas._probe import PaddingCost, padding_cost
from hfta_nas._run import TrainRun, train
from hfta_nas._objectives import (
    CLASSIFICATION_LOSSES,
    LOSSES,
    REGRESSION_LOSSES,
    Objective,
    higher_is_better,
    loss_kind,
    trained_metric_names,
)
from hfta_nas._trainer import ArrayTrainer, EarlyStopping, EpochReport, SlotResult
from hfta_nas.errors import FusionError, FusionFallbackWarning, HftaNasError
from hfta_nas.search import Candidate, SearchSummary, optimize, plan

__all__ = [
    "ArrayTrainer",
    "Candidate",
    "EarlyStopping",
    "CLASSIFICATION_LOSSES",
    "LOSSES",
    "REGRESSION_LOSSES",
    "Objective",
    "EpochReport",
    "FusionError",
    "FusionFallbackWarning",
    "FusionSignature",
    "HftaNasError",
    "ModelArray",
    "PaddingCost",
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
    "plan",
    "train",
    "trained_metric_names",
]
__version__ = "0.1.0"
