"""`tracker_from("mlflow:sqlite:///mlflow.db")`: a tracker from the CLI's `--log BACKEND[:WHERE]`."""

from __future__ import annotations

from hfta_nas.tracking._base import Tracker, TrackingError

# backend -> what WHERE is, and its default
BACKENDS = {
    "mlflow": ("a tracking URI", "MLFLOW_TRACKING_URI, else MLflow's default"),
    "tensorboard": ("a folder", "runs/tensorboard"),
    "wandb": ("a project, or entity/project", "hfta-nas"),
}


def tracker_from(spec: str) -> Tracker:
    """'mlflow[:URI]', 'tensorboard[:DIR]' or 'wandb[:PROJECT]' -> its tracker; TrackingError otherwise."""
    backend, _, where = spec.partition(":")
    backend = backend.strip().lower()
    if backend == "mlflow":
        from hfta_nas.tracking._mlflow import MLflowTracker

        return MLflowTracker(where or None)
    if backend == "tensorboard":
        from hfta_nas.tracking._tensorboard import TensorBoardTracker

        return TensorBoardTracker(where or "runs/tensorboard")
    if backend == "wandb":
        from hfta_nas.tracking._wandb import WandbTracker

        return WandbTracker(where or "hfta-nas")
    known = ", ".join(f"{name}:WHERE ({what})" for name, (what, _) in BACKENDS.items())
    raise TrackingError(f"unknown tracker {backend!r} in {spec!r}: expected {known}.")


def trackers_from(specs: list[str | Tracker] | tuple[str | Tracker, ...]) -> list[Tracker]:
    """Trackers as given, and each text spec turned into its tracker."""
    return [tracker_from(spec) if isinstance(spec, str) else spec for spec in specs]
