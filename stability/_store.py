"""A stability study in the Optuna storage: one Optuna study per configuration,
one trial per trained seed.

Trials are added only once their seed has finished training (COMPLETE with
the final test accuracy, or FAIL with the reason), so a killed run never
leaves a trial RUNNING, and a re-run of the same command finds every seed it
already trained and trains only the rest (seeds are deterministic, so the
stored result is the result a retrain would give). The study name carries a
digest of the configuration and dtype: another configuration never reuses
these seeds. The report is attached to the study as an artifact, which
optuna-dashboard shows next to the trials.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from optuna.trial import TrialState

from hfta_nas.errors import HftaNasError
from hfta_nas.search import set_study_text, study_text
from hfta_nas.search_spaces import ResolvedConfig

from ._design import SeedPlan
from ._result import CURVE_COLUMNS, METRICS, SEED_COLUMNS, SOURCES


@dataclass
class SeedOutcome:
    """One trained seed: its plan, how it ended and its per-epoch metrics."""

    plan: SeedPlan
    status: str  # "completed" | "failed"
    reason: str
    epochs: int
    history: list[dict[str, float]] = field(default_factory=list)
    reused: bool = False  # read back from the storage instead of trained by this run
    device: str = ""

    @property
    def final(self) -> dict[str, float]:
        return self.history[-1] if self.history else {}


def study_name_for(label: str, config: ResolvedConfig, dtype: str) -> str:
    """'stability:<label>:<digest>': the same config and dtype always land in the same study."""
    text = json.dumps({"config": config.to_dict() | {"origin": None}, "dtype": dtype}, sort_keys=True, default=str)
    return f"stability:{label}:{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def _key(plan: SeedPlan, device: str) -> tuple:
    return (
        plan.design,
        plan.seed_index,
        plan.seeds["init"],
        plan.seeds["data"],
        plan.seeds["dropout"],
        plan.seeds.get("split"),
        device,
    )


class SeedStore:
    """The stored seeds of one configuration (see the module docstring)."""

    def __init__(self, storage: Any, study_name: str, *, config: ResolvedConfig, device: str) -> None:
        self.device = device
        self.study = optuna.create_study(
            storage=storage, study_name=study_name, direction="maximize", load_if_exists=True
        )
        with warnings.catch_warnings():  # "experimental" in Optuna, stable in use
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self.study.set_metric_names(["test_r2" if config.kind == "regression" else "test_acc"])
        self.study.set_user_attr("kind", "hfta-nas stability")
        set_study_text(self.study, "config", config.to_yaml())

    @property
    def name(self) -> str:
        return self.study.study_name

    def finished(self) -> dict[tuple, SeedOutcome]:
        """Seeds trained by earlier runs on this device, by their plan."""
        return {_key(o.plan, o.device): o for o in outcomes_of(self.study) if o.device == self.device}

    def lookup(self, plan: SeedPlan, done: dict[tuple, SeedOutcome]) -> SeedOutcome | None:
        return done.get(_key(plan, self.device))

    def add(self, outcomes: list[SeedOutcome], **attrs: Any) -> None:
        for outcome in outcomes:
            self.study.add_trial(_as_trial(outcome, self.device, attrs))

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        set_study_text(self.study, "metadata", json.loads(json.dumps(metadata, default=str)))

    def attach(self, path: Path, artifact_dir: Path) -> str:
        """Attach a report file to the study (optuna-dashboard lists it under the study's artifacts)."""
        from optuna.artifacts import FileSystemArtifactStore, upload_artifact

        artifact_dir.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return upload_artifact(
                artifact_store=FileSystemArtifactStore(str(artifact_dir)),
                file_path=str(path),
                study_or_trial=self.study,
            )


def _as_trial(outcome: SeedOutcome, device: str, attrs: dict[str, Any]) -> optuna.trial.FrozenTrial:
    plan = outcome.plan
    objective = _objective_metric(outcome.final or (outcome.history[-1] if outcome.history else {}))
    value = outcome.final.get(objective)
    completed = outcome.status == "completed" and value is not None and math.isfinite(value)
    # the curve of the study's objective (test_acc; test_r2 for regression), the metric the dashboard labels it with
    intermediate = {
        row["epoch"]: row[objective] for row in outcome.history if objective in row and math.isfinite(row[objective])
    }
    user_attrs = {
        "design": plan.design,
        "seed_index": plan.seed_index,
        "device": device,
        **{f"seed_{source}": seed for source, seed in plan.seeds.items()},
        "status": outcome.status,
        "reason": outcome.reason,
        "epochs_run": outcome.epochs,
        "history": json.loads(json.dumps(outcome.history)),
        **attrs,
    }
    if not completed:
        user_attrs["fail_reason"] = outcome.reason or f"no finite {objective}"
    return optuna.trial.create_trial(
        state=TrialState.COMPLETE if completed else TrialState.FAIL,
        value=value if completed else None,
        # No params: a seed is not a hyper-parameter, and as one the dashboard's importance panel
        # ranked the seed index first. Its design and seeds are user attributes.
        params={},
        distributions={},
        user_attrs=user_attrs,
        intermediate_values=intermediate,
    )


def _objective_metric(row: dict[str, Any]) -> str:
    """What a stability study stores as each seed's value (higher is better, as the study's direction):
    the test accuracy, or for regression the test R^2."""
    return "test_r2" if "test_r2" in row else "test_acc"


def outcomes_of(study: optuna.Study) -> list[SeedOutcome]:
    """Every stored seed of a stability study (any device), oldest first."""
    outcomes = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        attrs = trial.user_attrs
        if "design" not in attrs:
            continue
        plan = SeedPlan(
            attrs["design"],
            int(attrs["seed_index"]),
            {s: int(attrs[f"seed_{s}"]) for s in SOURCES if f"seed_{s}" in attrs},
        )
        outcomes.append(
            SeedOutcome(
                plan,
                attrs["status"],
                attrs.get("reason", ""),
                int(attrs["epochs_run"]),
                list(attrs.get("history", [])),
                reused=True,
                device=attrs.get("device", "cpu"),
            )
        )
    return outcomes


def load_stability_study(storage: Any, study_name: str) -> optuna.Study:
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage) if s.study_name.startswith("stability:")]
        raise HftaNasError(
            f"no stability study named '{study_name}' in this storage "
            f"(stability studies: {', '.join(names) or 'none'})."
        ) from None
    if study.user_attrs.get("kind") != "hfta-nas stability":
        raise HftaNasError(f"study '{study_name}' is not a stability study (made by `hfta-nas stability`).")
    return study


def _recorded_metrics(outcomes: dict[str, list[SeedOutcome]]) -> list[str]:
    """The standard metrics, then any other a seed recorded (a user metric such as val_top2)."""
    extra = {
        key
        for group in outcomes.values()
        for o in group
        for row in o.history
        for key in row
        if key.startswith(("train_", "val_", "test_")) and key not in METRICS
    }
    return [*METRICS, *sorted(extra)]


def frames(outcomes: dict[str, list[SeedOutcome]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """seeds.csv and curves.csv rows (columns as documented in stability/_result.py)."""
    seed_rows, curve_rows = [], []
    metrics = _recorded_metrics(outcomes)
    for label, group in outcomes.items():
        for o in group:
            final = o.final if o.status == "completed" else {}
            seed_rows.append(
                {
                    "config": label,
                    "seed_index": o.plan.seed_index,
                    "design": o.plan.design,
                    **{f"seed_{s}": o.plan.seeds.get(s) for s in SOURCES},
                    "status": o.status,
                    "reason": o.reason,
                    "epochs": o.epochs,
                    **{m: final.get(m, float("nan")) for m in metrics},
                }
            )
            for row in o.history:
                curve_rows += [
                    {
                        "config": label,
                        "design": o.plan.design,
                        "seed_index": o.plan.seed_index,
                        "epoch": int(row["epoch"]),
                        "metric": m,
                        "value": row[m],
                    }
                    for m in metrics
                    if m in row
                ]
    seeds = pd.DataFrame(seed_rows, columns=[*SEED_COLUMNS, *metrics])
    seeds["seed_split"] = seeds["seed_split"].astype("Int64")  # empty where the data's own split was used
    curves = pd.DataFrame(curve_rows, columns=list(CURVE_COLUMNS))
    return seeds, curves


def result_of(study: optuna.Study) -> Any:
    """The StabilityResult stored in a stability study (for `hfta-nas report --study`)."""
    from ._result import StabilityResult

    label = study.study_name.split(":")[1] if study.study_name.count(":") >= 2 else study.study_name
    outcomes = outcomes_of(study)
    if not outcomes:
        raise HftaNasError(f"stability study '{study.study_name}' has no finished seeds yet.")
    metadata = dict(study_text(study, "metadata", {}))
    metadata["studies"] = {label: study.study_name}  # a compare run stored every config's protocol in each study
    metadata["configs"] = {label: metadata.get("configs", {}).get(label)}
    return StabilityResult(*frames({label: outcomes}), metadata)
