"""`SearchTracking`: a search's or a PBT run's events (`optimize(..., on_event=...)`,
`pbt(..., on_event=...)`) as tracker runs, one per trial (a PBT member), grouped by the study."""

from __future__ import annotations

from typing import Any

from hfta_nas.search import PBTExploited, PBTStarted, SearchStarted, TrialEnded, TrialEpochEnded, TrialStarted
from hfta_nas.tracking._base import Tracker
from hfta_nas.tracking._runs import Runs
from hfta_nas.tracking._spec import trackers_from


class SearchTracking:
    """Call it with each event of a search; close it (or use `with`) when the search ends.

        with SearchTracking("mlflow:sqlite:///mlflow.db", "tensorboard:runs/tb") as tracking:
            hfta_nas.optimize(study, build, data, on_event=tracking)

    A trial's run opens when it takes its slot (params; array, slot and seeds as attributes),
    gets a point per metric each epoch, and ends when the trial is told (final values, its
    state). A trial told without training (a refused model) gets a run that only ends. A PBT
    member's run also has a curve per explored hyper-parameter (`hp/<name>`: the value of each
    epoch) and, at each exploit that replaced it, `pbt/copied_from` (the member it copied) and
    `pbt/explored/<name>` (the value explore gave it) at that epoch."""

    def __init__(self, *trackers: str | Tracker) -> None:
        self.runs = Runs(trackers_from(trackers))
        self.study, self.metrics = "hfta-nas", ["value"]
        self.epochs: dict[int, int] = {}  # trial -> last epoch logged (a requeued array repeats epochs)
        self.ended: set[int] = set()

    def __call__(self, event: Any) -> None:
        if isinstance(event, (SearchStarted, PBTStarted)):
            self.study = event.study
            self.metrics = list(getattr(event, "metrics", None) or [event.metric])
        elif isinstance(event, TrialStarted) and event.trial not in self.epochs:  # not again when requeued
            self._start(event.trial, event.params, event.attributes)
        elif isinstance(event, TrialEpochEnded) and event.epoch > self.epochs.get(event.trial, 0):
            self.epochs[event.trial] = event.epoch
            self.runs.log(event.trial, event.epoch, event.metrics)
        elif isinstance(event, PBTExploited):
            explored = {f"pbt/explored/{name}": new for name, (_, new) in event.changes.items()}
            self.runs.log(event.target, event.epoch, {"pbt/copied_from": float(event.source), **explored})
        elif isinstance(event, TrialEnded) and event.trial not in self.ended:
            self.ended.add(event.trial)
            if event.trial not in self.epochs:
                self._start(event.trial, {}, {})
            final = {f"final/{metric}": value for metric, value in zip(self.metrics, event.values)}
            self.runs.end(event.trial, final, event.state, event.reason)

    def _start(self, trial: int, params: dict[str, Any], attributes: dict[str, Any]) -> None:
        self.epochs.setdefault(trial, 0)
        self.runs.start(
            trial, self.study, f"trial {trial}", params, {"study": self.study, "trial": trial, **attributes}
        )

    def close(self) -> None:
        """End the runs of trials the search left training (INTERRUPTED) and flush every tracker."""
        self.runs.close()

    def __enter__(self) -> SearchTracking:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
