"""optuna-dashboard shows a search: its WSGI app, served on the study's storage, gives
back every trial's intermediate values and the user attributes the driver records."""

import io
import json
from wsgiref.util import setup_testing_defaults

import optuna_dashboard

from hfta_nas.search import open_storage
from tests.test_search import search, space_text

RECORDED = {
    "array_id",
    "slot",
    "architecture",
    "seed_init",
    "seed_data",
    "seed_dropout",
    "epochs_run",
    "train_seconds",
    "train_start",
    "train_end",
    "worker",
}


def get(app, path):
    """GET `path` from a WSGI app; (status code, decoded JSON body)."""
    environ = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "wsgi.input": io.BytesIO()}
    setup_testing_defaults(environ)
    status = []
    body = b"".join(app(environ, lambda code, headers, exc_info=None: status.append(code)))
    return int(status[0].split()[0]), json.loads(body)


def test_the_dashboard_serves_intermediate_values_and_trial_attributes(tmp_path):
    search(tmp_path)
    storage, _ = open_storage(str(tmp_path / "study.journal"))
    app = optuna_dashboard.wsgi(storage)
    code, studies = get(app, "/api/studies")
    assert code == 200
    [study] = [s for s in studies["study_summaries"] if s["study_name"] == "tiny"]
    code, detail = get(app, f"/api/studies/{study['study_id']}")
    assert code == 200 and len(detail["trials"]) == 6
    assert detail["objective_names"] == ["val_acc"] and len(detail["best_trials"]) == 1
    for trial in detail["trials"]:
        assert trial["state"] == "Complete"
        assert [v["step"] for v in trial["intermediate_values"]] == [1, 2]  # one report per epoch
        attrs = {a["key"]: a["value"] for a in trial["user_attrs"]}
        assert set(attrs) >= RECORDED, RECORDED - set(attrs)
        assert attrs["epochs_run"] == "2"


def test_the_dashboard_shows_the_pareto_front_of_a_multi_objective_search(tmp_path):
    search(
        tmp_path,
        space_text(study={"name": "tiny", "metrics": ["val_acc", "params"], "directions": ["maximize", "minimize"]}),
    )
    storage, _ = open_storage(str(tmp_path / "study.journal"))
    app = optuna_dashboard.wsgi(storage)
    _, studies = get(app, "/api/studies")
    _, detail = get(app, f"/api/studies/{studies['study_summaries'][0]['study_id']}")
    assert detail["objective_names"] == ["val_acc", "params"]
    assert 1 <= len(detail["best_trials"]) <= 6 and all(len(t["values"]) == 2 for t in detail["best_trials"])
    for trial in detail["trials"]:  # Optuna forbids trial.report here: the learning curve is a user attribute
        curve = json.loads({a["key"]: a["value"] for a in trial["user_attrs"]}["learning_curve"])
        assert curve["epoch"] == [1, 2] and len(curve["val_acc"]) == len(curve["params"]) == 2
