"""The best trial's weights and config, written as soon as a trial beats every other.

Several workers export into the same folder: a trial is written only when it
is the best in the storage at that moment (other workers' trials included),
and each file is replaced atomically.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import torch
import yaml
from optuna.trial import TrialState

from hfta_nas._files import atomic_write_text, save_weights
from hfta_nas.search._candidate import Proposal


class BestExport:
    """Writes `best_weights.pt` and `best_config.yaml` of the best trial by the first metric."""

    def __init__(self, study: optuna.Study, out_dir: Path | None, metrics: list[str], directions: list[str]) -> None:
        self.study, self.out_dir, self.metrics = study, out_dir, metrics
        self.maximize = directions[0] == "maximize"
        self.best = self.stored_best()
        self.files: dict[str, str] = {}

    def stored_best(self) -> float | None:
        done = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if not done:
            return None
        return (max if self.maximize else min)(t.values[0] for t in done)

    def _improves(self, value: float) -> bool:
        if self.best is not None and not (value > self.best if self.maximize else value < self.best):
            return False
        stored = self.stored_best()  # this trial included: it improves when it is the best there
        return stored is None or value == stored

    def offer(self, proposal: Proposal, values: list[float], weights: Mapping[str, torch.Tensor], study_name: str) -> None:
        """Export the trial just told COMPLETE if it is the best so far."""
        if self.out_dir is None or not self._improves(values[0]):
            return
        self.best = values[0]
        self.out_dir.mkdir(parents=True, exist_ok=True)
        weights_path = self.out_dir / "best_weights.pt"
        save_weights(dict(weights), weights_path)
        self.files = {"weights": str(weights_path)}
        origin: dict[str, Any] = {"seeds": proposal.seeds, "trial": proposal.number, "study": study_name,
                                  "values": dict(zip(self.metrics, values))}
        config = proposal.candidate.config
        text = None
        if hasattr(config, "to_yaml"):
            text = config.to_yaml(**origin)
        elif isinstance(config, Mapping):
            text = yaml.safe_dump({**dict(config), "origin": origin}, sort_keys=False)
        if text is not None:
            config_path = self.out_dir / "best_config.yaml"
            atomic_write_text(config_path, text)
            self.files["config"] = str(config_path)
