"""hfta-nas: train many candidate models at once as one horizontally fused array."""

from hfta_nas import optim
from hfta_nas._array import FusionSignature, ModelArray, check_fusable
from hfta_nas._trainer import ArrayTrainer, EpochReport, SlotResult
from hfta_nas.errors import FusionError, FusionFallbackWarning, HftaNasError

__all__ = [
    "ArrayTrainer",
    "EpochReport",
    "FusionError",
    "FusionFallbackWarning",
    "FusionSignature",
    "HftaNasError",
    "ModelArray",
    "SlotResult",
    "check_fusable",
    "optim",
]
__version__ = "0.1.0"
