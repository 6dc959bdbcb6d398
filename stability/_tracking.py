"""`StabilityTracking`: a stability study's seeds as tracker runs (MLflow, TensorBoard, W&B),
one per seed, grouped by the configuration's study, logged as each array ends."""

from __future__ import annotations

from typing import Any

from hfta_nas.tracking import Runs, Tracker, trackers_from


class StabilityTracking:
    """`run_study(..., on_event=tracking)` (or `run_stability`); close it (or use `with`) after.

        with StabilityTracking("tensorboard:runs/tb") as tracking:
            stability.run_study(["config.yaml"], seeds=32, on_event=tracking)

    A seed's run: the configuration's settings as params; its seeds, array and slot as
    attributes; a point per metric and epoch; its last epoch's values as final ones.
    Seeds reused from the storage (trained by an earlier run) are not logged again."""

    def __init__(self, *trackers: str | Tracker) -> None:
        self.runs = Runs(trackers_from(trackers))

    def __call__(self, kind: str, info: dict[str, Any]) -> None:
        if kind == "seeds":
            for row in info["seeds"]:
                self._log(row, info["array"])

    def _log(self, row: dict[str, Any], array: int) -> None:
        outcome, plan = row["outcome"], row["outcome"].plan
        key = (row["study"], plan.design, plan.seed_index)
        attributes = {
            "study": row["study"],
            "label": row["label"],
            "design": plan.design,
            "seed_index": plan.seed_index,
            **{f"seed_{source}": seed for source, seed in plan.seeds.items()},
            "array": array,
            "slot": row["slot"],
        }
        name = f"seed {plan.seed_index}" if plan.design == "all" else f"{plan.design} seed {plan.seed_index}"
        self.runs.start(key, row["study"], name, row["config"].to_dict(), attributes)
        for epoch, metrics in enumerate(outcome.history, start=1):
            self.runs.log(key, epoch, metrics)
        final = {f"final/{metric}": value for metric, value in outcome.final.items()}
        self.runs.end(key, final, "COMPLETE" if outcome.status == "completed" else "FAIL", outcome.reason)

    def close(self) -> None:
        """Flush every tracker (waits for the calls still queued)."""
        self.runs.close()

    def __enter__(self) -> StabilityTracking:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
