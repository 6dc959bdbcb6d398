"""Arrays a stopped run left mid-training, continued from their last epoch.

Every array of a search saves a checkpoint at the end of its first epoch and
then at epoch ends as its time budget for checkpoints allows (`_array_job`:
at most ~2% of its time), holding the trainer's state, and per slot the trial
it trains: the trial whose seeds it uses, its `origin`, and its parameters. When the worker is killed or stopped, the
trials it held are failed as interrupted and queued again with the same
parameters and seeds (`_recovery`). A run whose pool holds the retries of every
slot still training in a checkpoint `claim`s it: the array is rebuilt, every
number put back, the epochs already trained are reported again to the retried
trials, and training continues. The trials end exactly as they would have
without the stop. A checkpoint whose trials will never train again (finished,
or failed for good) is removed by `prune`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from hfta_nas.search._candidate import Proposal
from hfta_nas.search._ledger import RETRY_OF
from hfta_nas.training._checkpoint import load, remove, remove_empty_folders

STRAY_SECONDS = 3600  # a temporary checkpoint file this old was left by a killed write


@dataclass
class Claim:
    """A checkpoint this run continues: the file, what it holds, for each slot id still training in
    it the proposal (a retry of that slot's trial) that takes the slot over, and the slots whose
    trials ended after the checkpoint was saved (told before the stop, not retried): they train on
    untold, as they did, until the epoch they ended at (slot id -> epoch), so the others' numbers
    stay those of the run that was stopped."""

    path: Path
    state: dict[str, Any]
    proposals: dict[int, Proposal]
    ended: dict[int, int]

    @property
    def epoch(self) -> int:
        return self.state["trainer"]["epoch"]


def origin_of(trial: optuna.Trial | optuna.trial.FrozenTrial) -> int:
    """The trial whose seeds this one trains with (itself, or the first trial it retries)."""
    return trial.user_attrs.get(RETRY_OF, trial.number)


def slot_record(proposal: Proposal) -> dict[str, Any]:
    """What a checkpoint keeps about the trial in a slot, to know its retry again."""
    return {"origin": origin_of(proposal.trial), "params": dict(proposal.trial.params)}


def _training(state: dict[str, Any]) -> list[int]:
    trainer = state["trainer"]
    return [sid for sid in trainer["slot_ids"] if trainer["results"][sid]["status"] == "running"]


def claim(
    folder: Path | None, pool: list[Proposal], device: str, dtype: str, ended_trials: Callable[[], dict[int, int]]
) -> tuple[list[Claim], list[Proposal]]:
    """The checkpoints (saved on this kind of device, in this dtype) whose training slots each have
    their retry in `pool` or belong to a trial in `ended_trials()` (trial number -> the epochs it
    trained: it finished for good after the checkpoint), at least one retried; and the rest of the
    pool. Nothing is read when the pool holds no retry (the usual round)."""
    # only retries take a slot over: a fresh trial with the same number and parameters (the same search
    # started again on another storage) is a different trial, however alike
    free = {origin_of(p.trial): p for p in pool if RETRY_OF in p.trial.user_attrs}
    if folder is None or not free or not folder.is_dir():
        return [], pool
    ended = ended_trials()
    claims = []
    for path in sorted(folder.glob("*.pt")):
        state = load(path, remove_unreadable=False)  # another worker's file: not ours to delete
        if state is None or "slots" not in state or (state.get("device"), state.get("dtype")) != (device, dtype):
            continue
        slots, training = state["slots"], _training(state)
        taking = {sid: free.get(slots[sid]["origin"]) for sid in training if sid not in ended}
        if not taking or any(p is None or p.trial.params != slots[sid]["params"] for sid, p in taking.items()):
            continue
        for proposal in taking.values():
            del free[origin_of(proposal.trial)]
        claims.append(Claim(path, state, taking, {sid: ended[sid] for sid in training if sid in ended}))
    taken = {id(p) for c in claims for p in c.proposals.values()}
    return claims, [p for p in pool if id(p) not in taken]


def prune(folder: Path | None, study: optuna.Study) -> None:
    """Remove the checkpoints no retry can claim any more: none of their training slots' trials
    waits or runs (a running one may be another worker's live array)."""
    if folder is None or not folder.is_dir():
        return
    alive = {origin_of(t) for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))}
    for path in folder.glob("*.pt"):
        state = load(path, remove_unreadable=False)
        if state is None:  # unreadable or of another version: removed once nobody can be writing it
            if _older_than(path, STRAY_SECONDS):
                remove(path)
        elif not {state.get("slots", {}).get(s, {}).get("origin") for s in _training(state)} & alive:
            remove(path)
    for stray in folder.glob(".*.tmp"):
        if _older_than(stray, STRAY_SECONDS):
            remove(stray)
    remove_empty_folders(folder)


def _older_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime > seconds
    except OSError:  # another worker renamed or removed it meanwhile
        return False
