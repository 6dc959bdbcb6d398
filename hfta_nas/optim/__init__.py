"""Array optimizers and schedules: torch.optim semantics, hyper-parameters per slot."""

from hfta_nas.optim._algorithms import SGD, Adagrad, Adam, AdamW, RMSprop
from hfta_nas.optim._hparam_schedule import hparam_schedule_problems, optimizer_values
from hfta_nas.optim._optimizer import ArrayOptimizer
from hfta_nas.optim._scaler import SlotGradScaler
from hfta_nas.optim._schedule import KINDS as SCHEDULE_KINDS
from hfta_nas.optim._schedule import LRSchedule

OPTIMIZERS = {"sgd": SGD, "adam": Adam, "adamw": AdamW, "rmsprop": RMSprop, "adagrad": Adagrad}

__all__ = [
    "OPTIMIZERS",
    "SCHEDULE_KINDS",
    "SGD",
    "Adagrad",
    "Adam",
    "AdamW",
    "ArrayOptimizer",
    "LRSchedule",
    "RMSprop",
    "SlotGradScaler",
    "hparam_schedule_problems",
    "optimizer_values",
]
