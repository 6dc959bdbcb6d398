"""Weights & Biases: a run per trial (or seed) in `project`, `group=` the study; its
parameters and attributes in the run's config, curves in its history, final values in its
summary. WANDB_MODE=offline writes the runs to disk only (`wandb sync` uploads them later)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hfta_nas.tracking._base import Tracker, TrackingError, flat, writable_folder

EXIT_CODE = {"COMPLETE": 0, "PRUNED": 0, "FAIL": 1, "INTERRUPTED": 255}


class WandbTracker(Tracker):
    """Runs in W&B project `project` (`entity/project` for a team's); `folder`: where the run
    files go [default: WANDB_DIR, else the current folder]; `mode`: online, offline [default:
    WANDB_MODE, else W&B's own]."""

    name = "wandb"

    def __init__(self, project: str = "hfta-nas", folder: str | Path | None = None, mode: str | None = None) -> None:
        try:
            import wandb
        except ImportError:
            raise TrackingError("W&B is not installed: pip install 'hfta-nas[wandb]'.") from None
        self.wandb = wandb
        self.entity, _, self.project = project.rpartition("/")
        if not self.project:
            raise TrackingError(f"wandb:{project}: expected a project name, or entity/project.")
        self.folder = writable_folder(folder or os.environ.get("WANDB_DIR") or ".", f"wandb:{project}")
        self.mode = mode
        online = (mode or os.environ.get("WANDB_MODE") or "online") in ("online", "run")
        if online and not wandb.login(prompt=False, verify=False):  # else each run would ask in the terminal
            raise TrackingError(
                f"wandb:{project}: not logged in to W&B: run `wandb login`, set WANDB_API_KEY, or log offline "
                "(WANDB_MODE=offline; `wandb sync` uploads the runs later)."
            )
        # each trial's run is its own (several train at once); no console capture (it would take
        # the search's progress display), no system metrics per run (a thread each)
        self.settings = wandb.Settings(console="off", x_disable_stats=True, save_code=False, silent=True)

    def start(self, group: str, name: str, params: Mapping[str, Any], attributes: Mapping[str, Any]) -> Any:
        return self.wandb.init(
            project=self.project,
            entity=self.entity or None,
            group=group,
            name=name,
            config={**flat(params), **flat(attributes)},
            dir=str(self.folder),
            mode=self.mode,
            reinit="create_new",
            settings=self.settings,
        )

    def log(self, run: Any, step: int, metrics: Mapping[str, float]) -> None:
        run.log(dict(metrics), step=step)

    def end(self, run: Any, final: Mapping[str, float], state: str, reason: str) -> None:
        run.summary.update({**final, "state": state, **({"reason": reason} if reason else {})})
        run.finish(exit_code=EXIT_CODE[state])
