"""A per-epoch progress bar (rich) that ArrayTrainer's callback can drive."""

from __future__ import annotations

from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class EpochProgress:
    """Context manager; pass `update` as `on_epoch` to show epochs and the best val accuracy."""

    def __init__(self, epochs: int, *, enabled: bool = True, description: str = "training") -> None:
        self.enabled = enabled
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
            disable=not enabled,
            transient=False,
        )
        self._task = self._progress.add_task(description, total=epochs, status="")
        # The bar starts with the first epoch's report: an error while the array is built (a bad model
        # or setting) is then the command's only line, not a half-drawn bar above it.
        self._started = False

    def __enter__(self) -> EpochProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._started:
            self._progress.stop()

    def update(self, report: Any, trainer: Any = None) -> None:
        accuracies = [m["val_acc"] for m in report.metrics.values() if "val_acc" in m]
        status = f"best val acc {max(accuracies):.3f}" if accuracies else ""
        if report.failed:
            status += f", {len(report.failed)} failed"
        if not self._started:
            self._progress.start()
            self._started = True
        self._progress.update(self._task, completed=report.epoch, status=status)
