"""A PBT run's checkpoint: what it holds, and whether a later call on the study may continue it.

The checkpoint (one per study, beside the storage) is written after every epoch: the trainer's
state, the records with their random generator, each member's trial id, and the run's identity
(its settings, seed, device and dtype). A later call continues it when its identity is the
same and every member's trial is as the checkpoint could have left it:

- a member running at the checkpoint is RUNNING, or FAIL (it diverged in an epoch after the
  checkpoint, and diverges again when that epoch is re-trained), or COMPLETE when the
  checkpoint was written after the last epoch (the run stopped while telling its members);
- a member that had failed is FAIL.

The same study with other settings is refused in one line (its stopped run stays as it is);
trials in any other state (deleted, told by hand) mean the checkpoint is of another run.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import optuna
from optuna.trial import TrialState

from hfta_nas.errors import HftaNasError
from hfta_nas.search._optuna_private import storage_of
from hfta_nas.search._pbt_settings import PBTSettings


def run_identity(settings: PBTSettings, seed: int, device: str, dtype: str) -> dict[str, Any]:
    """What must be the same for a later call to continue a run."""
    fields = asdict(settings)
    fields["explore"] = {name: asdict(how) for name, how in sorted(settings.explore.items())}
    return {"settings": fields, "seed": seed, "device": device, "dtype": dtype}


def check_same_run(state: dict[str, Any], identity: dict[str, Any], study_name: str) -> None:
    """HftaNasError (one line) when the study's stopped run had other settings, seed, device or dtype."""
    saved = state["identity"]
    if saved != identity:
        differ = sorted(k for k in (*saved["settings"], "seed", "device", "dtype") if _of(saved, k) != _of(identity, k))
        raise HftaNasError(
            f"study '{study_name}' has a PBT run stopped after epoch {state['trainer']['epoch']} with other "
            f"{', '.join(differ)}; run it with its own settings to continue it, or give another study name."
        )


def _of(identity: dict[str, Any], key: str) -> Any:
    return identity.get(key, identity["settings"].get(key))


def members_as_left(state: dict[str, Any], study: optuna.Study) -> bool:
    """Whether every member's trial is in a state the checkpoint could have left it in (module docstring)."""
    storage, results = storage_of(study), state["trainer"]["results"]
    last = all(r["status"] != "running" for r in results.values())  # written after the last epoch
    for number, trial_id in state["trials"].items():
        try:
            now = storage.get_trial(trial_id).state
        except KeyError:  # the study was deleted (and made again) since
            return False
        if results[number]["status"] == "failed":
            allowed = {TrialState.FAIL}
        else:
            allowed = {TrialState.RUNNING, TrialState.FAIL, *([TrialState.COMPLETE] if last else [])}
        if now not in allowed:
            return False
    return True
