"""Optuna searches whose trials train as fused arrays.

    study = optuna.create_study(direction="maximize")
    summary = hfta_nas.optimize(study, build, data, n_trials=32, array_size=8)

`build(trial)` suggests values as in any Optuna objective and returns a
`Candidate`; the search packs candidates into arrays by their measured cost
(`_packing`), trains them (`_array_job`), and tells every trial.
"""

from hfta_nas.search._candidate import Candidate, trial_seeds
from hfta_nas.search._cost import StepCost, StepCurve, cost_from_dict
from hfta_nas.search._events import (
    ArrayEnded,
    ArrayFailed,
    ArrayRefused,
    ArrayResumed,
    ArraySizeChosen,
    ArraySplit,
    ArrayStarted,
    EpochEnded,
    PBTExploited,
    PBTStarted,
    SearchStarted,
    SlotRefilled,
    TrialEnded,
    TrialEpochEnded,
    TrialRetried,
    TrialStarted,
    TrialWaits,
)
from hfta_nas.search._ledger import Outcome, counts, outcome_of
from hfta_nas.search._optimize import SearchSummary, check_options, optimize
from hfta_nas.search._orphaned import stop_when_orphaned
from hfta_nas.search._patience import PatientStorage, StorageUnreachable, patient
from hfta_nas.search._pbt import PBTSummary, pbt
from hfta_nas.search._pbt_explore import bounds_problem as explore_bounds_problem
from hfta_nas.search._pbt_settings import Explore, PBTSettings
from hfta_nas.search._plan import PlannedArray, SearchPlan, plan
from hfta_nas.search._storage import (
    DEFAULT_STORAGE,
    artifact_folder,
    check_directions,
    check_patience,
    checkpoint_folder,
    copy_of_stored_study,
    counted_trials,
    dashboard_command,
    missing_storage_file,
    open_storage,
    serve_proxy,
    study_lock,
)
from hfta_nas.search._study_texts import attach_study_file, set_study_text, study_text
from hfta_nas.search._trial_seeded import TrialSeededSampler, trial_sampler_seed
from hfta_nas.search._workers import run_workers, study_report, visible_gpus

__all__ = [
    "DEFAULT_STORAGE",
    "ArrayEnded",
    "ArrayFailed",
    "ArrayRefused",
    "ArrayResumed",
    "ArraySizeChosen",
    "ArraySplit",
    "ArrayStarted",
    "Candidate",
    "EpochEnded",
    "Explore",
    "Outcome",
    "PBTExploited",
    "PBTSettings",
    "PBTStarted",
    "PBTSummary",
    "PatientStorage",
    "PlannedArray",
    "SearchPlan",
    "SearchStarted",
    "SearchSummary",
    "SlotRefilled",
    "StepCost",
    "StepCurve",
    "StorageUnreachable",
    "cost_from_dict",
    "TrialEnded",
    "TrialEpochEnded",
    "TrialRetried",
    "TrialSeededSampler",
    "TrialStarted",
    "TrialWaits",
    "artifact_folder",
    "attach_study_file",
    "check_directions",
    "checkpoint_folder",
    "counted_trials",
    "missing_storage_file",
    "check_options",
    "check_patience",
    "copy_of_stored_study",
    "counts",
    "dashboard_command",
    "explore_bounds_problem",
    "open_storage",
    "optimize",
    "outcome_of",
    "patient",
    "pbt",
    "plan",
    "run_workers",
    "serve_proxy",
    "set_study_text",
    "stop_when_orphaned",
    "study_lock",
    "study_report",
    "study_text",
    "trial_sampler_seed",
    "trial_seeds",
    "visible_gpus",
]
