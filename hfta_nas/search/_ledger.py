"""The budget, counted in the storage across workers, and how each trial ended.

Every trial a search ends gets the user attribute `outcome` (an `Outcome`);
failed ones also get `fail_reason`, a sentence for people. The budget
(`n_trials`) counts the trials that hold or held a place in it: RUNNING ones
(asked, training or waiting for an array, by any worker) and ended ones, less
those whose outcome does not count (a retried interruption, surplus, a trial
never trained). Counting then asking must be atomic across workers: call
`remaining()` and ask under the study lock (`lock`).
"""

from __future__ import annotations

import contextlib
import copy
import enum
import sys
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hfta_nas.search._optuna_private import storage_of, trial_id

OUTCOME_ATTR = "outcome"
RETRY_OF = "retry_of"  # user attribute of a retried trial: the number of the trial whose seeds it takes
_ENDED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


class Outcome(str, enum.Enum):
    COMPLETE = "complete"
    PRUNED = "pruned"
    FAILED = "failed"  # trained and failed: diverged, its array failed, too big even alone
    INTERRUPTED = "interrupted"  # its worker stopped while it ran; failed, and retried as a new trial
    SURPLUS = "surplus"  # enqueued (a retry, a fill) or asked when the budget was already full; never trained
    NOT_TRAINED = "not_trained"  # asked, then the search stopped (an error, the timeout) before its array ran

    @property
    def counted(self) -> bool:
        return self not in (Outcome.INTERRUPTED, Outcome.SURPLUS, Outcome.NOT_TRAINED)


# Studies written before `outcome` existed said it in the first word of fail_reason.
_LEGACY_PREFIXES = {"interrupted:": Outcome.INTERRUPTED, "surplus:": Outcome.SURPLUS, "stopped:": Outcome.NOT_TRAINED}


def outcome_of(trial: optuna.trial.FrozenTrial) -> Outcome | None:
    """How a trial ended by the search's record (None: running, or not ended by a search)."""
    value = trial.user_attrs.get(OUTCOME_ATTR)
    if value is not None:
        return Outcome(value)
    reason = str(trial.user_attrs.get("fail_reason", ""))
    return next((o for prefix, o in _LEGACY_PREFIXES.items() if reason.startswith(prefix)), None)


def counts(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether the trial takes a place in the budget (WAITING ones do not yet)."""
    outcome = outcome_of(trial)
    return trial.state != TrialState.WAITING and (outcome is None or outcome.counted)


class Ledger:
    """The study's budget and the one place that tells trials how they ended."""

    def __init__(
        self,
        study: optuna.Study,
        n_trials: int | None,
        lock: Any = None,
        callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]] = (),
    ) -> None:
        self.study, self.n_trials = study, n_trials
        self.lock = lock or contextlib.nullcontext()
        self.callbacks = list(callbacks)

    def _told(self, trial: optuna.Trial) -> None:
        """Optuna's callbacks, as `study.optimize` calls them after each trial it ran: (study, a deep copy
        of the frozen trial), in order; an exception raised by one ends the search, as it ends optimize."""
        if self.callbacks:
            frozen = storage_of(self.study).get_trial(trial_id(trial))
            for callback in self.callbacks:
                callback(self.study, copy.deepcopy(frozen))

    def counted(self, ended_only: bool = False) -> int:
        states = _ENDED if ended_only else (TrialState.RUNNING, *_ENDED)
        return sum(counts(t) for t in self.study.get_trials(deepcopy=False, states=states))

    def remaining(self) -> int:
        """Places left in the budget, across workers (read under `lock` before asking)."""
        if self.n_trials is None:
            return sys.maxsize
        return self.n_trials - self.counted()

    def beyond_budget(self, trial: optuna.Trial) -> bool:
        """Whether `trial` would take a place past the budget: as many counted trials numbered
        before it as `n_trials`. Counting then asking under the study lock keeps this False, but a
        database that crashes drops its sessions' advisory locks: a worker that counted before the
        crash asks after it, while another worker took the freed lock and counted too. The later
        of two such trials sees the earlier one here, so one of them, never both, is refused (ties
        of number, which trials created at once may get, go by storage id)."""
        if self.n_trials is None:
            return False
        place = (trial.number, trial_id(trial))
        others = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING, *_ENDED))
        return sum(counts(t) for t in others if (t.number, trial_id(t)) < place) >= self.n_trials

    def is_running(self, trial: optuna.Trial) -> bool:
        return storage_of(self.study).get_trial(trial_id(trial)).state == TrialState.RUNNING

    def complete(self, trial: optuna.Trial, values: list[float]) -> None:
        trial.set_user_attr(OUTCOME_ATTR, Outcome.COMPLETE.value)
        self.study.tell(trial, values if len(values) > 1 else values[0])
        self._told(trial)

    def prune(self, trial: optuna.Trial) -> None:
        trial.set_user_attr(OUTCOME_ATTR, Outcome.PRUNED.value)
        self.study.tell(trial, state=TrialState.PRUNED)
        self._told(trial)

    def fail(self, trial: optuna.Trial, outcome: Outcome, reason: str) -> bool:
        """Tell FAIL with `outcome` and `reason`; False when the trial had ended meanwhile."""
        storage = storage_of(self.study)
        try:
            storage.set_trial_user_attr(trial_id(trial), OUTCOME_ATTR, outcome.value)
            storage.set_trial_user_attr(trial_id(trial), "fail_reason", reason)
            storage.set_trial_state_values(trial_id(trial), TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            return False
        if outcome is Outcome.FAILED:  # it ran and failed; bookkeeping (interrupted, never trained) is not a run
            self._told(trial)
        return True

    def discard_surplus(self) -> None:
        """With the budget full, enqueued trials nobody will ask (retries) are told FAIL
        as surplus, so the study ends with no WAITING trial."""
        with self.lock:
            if self.remaining() > 0:
                return
            for _ in self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                trial = self.study.ask()
                self.fail(
                    trial,
                    Outcome.SURPLUS,
                    "surplus: an enqueued trial (a retry) left over when the budget was full; never trained",
                )
