"""Runs where researchers look: MLflow, TensorBoard and W&B, one run per trial (or seed),
grouped by study. Each backend's library is an optional extra (`pip install
'hfta-nas[mlflow]'`, `[tensorboard]`, `[wandb]`), imported only when its tracker is made.

    with SearchTracking("mlflow:sqlite:///mlflow.db") as tracking:
        hfta_nas.optimize(study, build, data, on_event=tracking)
"""

from hfta_nas.tracking._base import STATES, Tracker, TrackingError
from hfta_nas.tracking._mlflow import MLflowTracker
from hfta_nas.tracking._runs import Runs
from hfta_nas.tracking._search import SearchTracking
from hfta_nas.tracking._spec import BACKENDS, tracker_from, trackers_from
from hfta_nas.tracking._tensorboard import TensorBoardTracker
from hfta_nas.tracking._wandb import WandbTracker

__all__ = [
    "BACKENDS",
    "STATES",
    "MLflowTracker",
    "Runs",
    "SearchTracking",
    "TensorBoardTracker",
    "Tracker",
    "TrackingError",
    "WandbTracker",
    "tracker_from",
    "trackers_from",
]
