"""PBT in the chaos rounds: its space, its clean reference and what a finished run must hold.

A PBT run stopped after its first checkpoint is continued by the same command, bit-identically
(docs/pbt.md), so a stopped-and-continued population must end exactly as a clean run of the same
space: the same members, values, schedules and lineages, and the same best weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import torch
import yaml
from optuna.trial import TrialState

from hfta_nas.search import open_storage

POPULATION, INTERVAL = 4, 2


def pbt_space_text(name: str, epochs: int) -> str:
    """A population of 4 MLPs on digits that exploits every 2 epochs (every epoch when there are only 2)."""
    return yaml.safe_dump(
        {
            "study": {"name": name, "metrics": ["val_acc"]},
            "pbt": {
                "population": POPULATION,
                "interval": min(INTERVAL, max(1, epochs - 1)),
                "explore": {"training.optimizer.lr": {"factors": [0.8, 1.25]}},
            },
            "data": {"dataset": "digits", "batch_size": 64},
            "training": {"epochs": epochs, "optimizer": {"name": "adam", "lr": 1e-3}},
            "model": {"family": "mlp", "config": {"depth": 1, "width": 16}},
            "seed": 11,
            "params": {"training.optimizer.lr": {"distribution": "log_uniform", "min": 1e-3, "max": 3e-2}},
        }
    )


def members(url: str, name: str) -> dict[int, dict[str, Any]]:
    """Each trial of a PBT study by number: its state, value, schedule and lineage."""
    trials = optuna.load_study(study_name=name, storage=open_storage(url)[0]).get_trials(deepcopy=False)
    return {
        t.number: {
            "state": t.state.name,
            "value": t.value,
            "schedule": t.user_attrs.get("pbt_schedule"),
            "lineage": t.user_attrs.get("pbt_lineage"),
        }
        for t in trials
    }


def pbt_reference(url: str, name: str, out: Path) -> dict[str, Any]:
    """What a clean run ended with: its members and its exported best weights."""
    return {"members": members(url, name), "weights": torch.load(out / "best_weights.pt", weights_only=True)}


def pbt_problems(url: str, name: str, out: Path, reference: dict[str, Any]) -> tuple[list[str], int]:
    """What breaks a finished PBT run's invariants, and how many members equal the clean run's."""
    found = members(url, name)
    problems = [f"member {n} left {m['state']}" for n, m in found.items() if m["state"] != TrialState.COMPLETE.name]
    if sorted(found) != sorted(reference["members"]):
        problems.append(f"members {sorted(found)}, a clean run has {sorted(reference['members'])}")
    equal = 0
    for number, member in found.items():
        expected = reference["members"].get(number)
        if expected is None:
            continue
        if member != expected:
            problems.append(f"member {number}: {member} where a clean run gave {expected}")
        else:
            equal += 1
    problems += _export_problems(out, reference["weights"])
    return problems, equal


def _export_problems(out: Path, weights: dict[str, torch.Tensor]) -> list[str]:
    try:
        exported = torch.load(out / "best_weights.pt", weights_only=True)
    except (OSError, RuntimeError) as error:
        return [f"no readable best_weights.pt: {error}"]
    if exported.keys() != weights.keys() or not all(torch.equal(exported[k], weights[k]) for k in weights):
        return ["best_weights.pt differs from a clean run's"]
    return []
