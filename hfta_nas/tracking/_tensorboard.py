"""TensorBoard: a folder per study, a subfolder per trial (or seed) with one scalar curve
per metric, and the run's parameters, attributes and final values in the HParams tab."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hfta_nas.tracking._base import Tracker, TrackingError, flat, folder_name, writable_folder


class TensorBoardTracker(Tracker):
    """Event files under `folder`/<study>/<run> (`tensorboard --logdir folder`)."""

    name = "tensorboard"

    def __init__(self, folder: str | Path = "runs/tensorboard") -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise TrackingError("TensorBoard is not installed: pip install 'hfta-nas[tensorboard]'.") from None
        self.writer_class = SummaryWriter
        self.folder = writable_folder(folder, f"tensorboard:{folder}")

    def start(self, group: str, name: str, params: Mapping[str, Any], attributes: Mapping[str, Any]) -> Any:
        writer = self.writer_class(str(self.folder / folder_name(group) / folder_name(name)))
        writer.hparams = {**flat(params), **flat(attributes)}  # written at the end, with the final values
        return writer

    def log(self, run: Any, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            run.add_scalar(key, value, step)

    def end(self, run: Any, final: Mapping[str, float], state: str, reason: str) -> None:
        from torch.utils.tensorboard.summary import hparams

        ended = {"state": state, **({"reason": reason} if reason else {})}
        # into the run's own folder (SummaryWriter.add_hparams would open a subfolder per call)
        for summary in hparams({**run.hparams, **ended}, dict(final)):
            run.file_writer.add_summary(summary)
        for key, value in final.items():
            run.add_scalar(key, value, 0)
        run.close()
