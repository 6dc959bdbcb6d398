"""Pruning as `study.optimize` prunes: a trial is judged against the trials asked before it.

Optuna's pruners compare a trial with the study's completed trials. `study.optimize` trains one
trial at a time, so trial k is compared with trials 0..k-1, all ended, and a median pruner's
first `n_startup_trials` trials are never pruned. A search trains trials side by side and in
packs, so a trial asked early can still be training when trials asked after it complete, and
was pruned where plain Optuna's pruner would have been idle (on the shipped CNN and MLP spaces,
trials 0, 2 and 4 at their first epochs, which plain completed). Judging each trial against the
trials asked before it gives it plain Optuna's view.

The view is the study's `get_trials`: the median, percentile, successive-halving, threshold and
patient pruners read it. Hyperband builds its bracket studies from the storage and Wilcoxon
reads the study's best trial, so those two still see every trial.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hfta_nas.search._optuna_private import storage_of, trial_id


class AskedBefore:
    """`study` as a pruner sees it for trial `number`: `get_trials` (and `trials`) list only the
    trials numbered before it; every other attribute is the study's own."""

    def __init__(self, study: optuna.Study, number: int) -> None:
        self._study, self._number = study, number

    def get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        trials = self._study.get_trials(deepcopy=deepcopy, states=states)
        return [t for t in trials if t.number < self._number]

    @property
    def trials(self) -> list[FrozenTrial]:
        return self.get_trials()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)


def should_prune(trial: optuna.Trial) -> bool:
    """`trial.should_prune()`, with its study seen as `AskedBefore` the trial (single objective)."""
    study = trial.study
    frozen = storage_of(study).get_trial(trial_id(trial))
    return study.pruner.prune(AskedBefore(study, trial.number), frozen)  # type: ignore[arg-type]
