"""MLflow: an experiment per study, a run per trial (or seed). The trial's parameters are
the run's params; where and how it trained (array, slot, seeds) its tags."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from hfta_nas.tracking._base import Tracker, TrackingError, flat

# How a run ended -> MLflow's run status (a pruned trial finished: it was stopped by design).
STATUS = {"COMPLETE": "FINISHED", "PRUNED": "FINISHED", "FAIL": "FAILED", "INTERRUPTED": "KILLED"}
REMOTE = ("http", "https", "databricks")  # checked at the first call: a down server would hold start-up for minutes


class MLflowTracker(Tracker):
    """Runs in the MLflow tracking store `uri` (sqlite:///mlflow.db, http://host:5000, ...;
    None: MLFLOW_TRACKING_URI, else MLflow's default)."""

    name = "mlflow"

    def __init__(self, uri: str | None = None) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise TrackingError("MLflow is not installed: pip install 'hfta-nas[mlflow]'.") from None
        # MLflow prints two links per run ended on a server's store to stdout, which carries `--json` output
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self.uri = uri
        self.experiments: dict[str, str] = {}  # study -> experiment id
        try:  # a local store that cannot be opened is the user's to fix now, not a warning mid-search
            self.client = MlflowClient(tracking_uri=uri)
            if (uri or "").split(":", 1)[0] not in REMOTE:
                self.client.search_experiments(max_results=1)
        except Exception as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise TrackingError(f"mlflow:{uri or ''}: cannot open the tracking store ({first}).") from None

    def start(self, group: str, name: str, params: Mapping[str, Any], attributes: Mapping[str, Any]) -> str:
        from mlflow.entities import Param

        tags = {key: str(value) for key, value in flat(attributes).items()}
        run = self.client.create_run(self._experiment(group), run_name=name, tags=tags)
        params = [Param(key, str(value)) for key, value in flat(params).items()]
        for at in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(run.info.run_id, params=params[at : at + 100])
        return run.info.run_id

    def log(self, run: str, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(run, metrics=[Metric(key, float(value), now, step) for key, value in metrics.items()])

    def end(self, run: str, final: Mapping[str, float], state: str, reason: str) -> None:
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, 0) for key, value in final.items()]
        tags = [RunTag("state", state), *([RunTag("reason", reason[:5000])] if reason else [])]
        self.client.log_batch(run, metrics=metrics, tags=tags)
        self.client.set_terminated(run, STATUS[state])

    def _experiment(self, study: str) -> str:
        if study not in self.experiments:
            found = self.client.get_experiment_by_name(study)
            if found is None:
                try:
                    self.experiments[study] = self.client.create_experiment(study)
                except Exception:  # another worker of the study created it meanwhile
                    found = self.client.get_experiment_by_name(study)
                    if found is None:
                        raise
            if found is not None:
                self.experiments[study] = found.experiment_id
        return self.experiments[study]
