"""Runs land where researchers look: MLflow, TensorBoard and W&B, read back with each tool's own reader.

A search logs one run per trial, grouped by its study (MLflow: an experiment; TensorBoard: a folder;
W&B: the group), with the trial's params, its array, slot and seeds, a curve per metric and the
final values; a stability study one run per seed. A bad --log is one line and exit 2; a tracker
whose server goes away mid-search is warned about once and the search goes on. Each backend's
tests are skipped where its library is not installed (`pip install 'hfta-nas[mlflow]'` ...).
"""

import contextlib
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from hfta_nas.cli import main
from hfta_nas.search import TrialEpochEnded
from hfta_nas.stability import StabilityTracking
from hfta_nas.stability._configs import LabelledConfig
from hfta_nas.stability._runner import run_stability
from hfta_nas.tracking import SearchTracking
from tests._rendezvous import GUARD_S
from tests.test_search import load_study, search, space_text
from tests.test_stability import mlp_config
from tests.test_startup import loaded_after, present, run_cli

pytestmark = pytest.mark.xdist_group(name="tracking")  # one search feeds the three readers
optuna.logging.set_verbosity(optuna.logging.WARNING)
LIBRARIES = ("mlflow", "tensorboard", "torch.utils.tensorboard", "wandb")
INSTALLED = [name for name in ("mlflow", "tensorboard", "wandb") if importlib.util.find_spec(name)]


def specs(folder: Path) -> list[str]:
    """--log values for every installed tracker, writing into `folder` (W&B: where WANDB_DIR says, `wandb_dir`)."""
    where = {"mlflow": f"mlflow:sqlite:///{folder}/mlflow.db", "tensorboard": f"tensorboard:{folder}/tb"}
    return [where.get(name, "wandb:tracked") for name in INSTALLED]


def wandb_dir(folder: Path) -> dict[str, str]:
    return {"WANDB_DIR": str(folder / "wb")}


@pytest.fixture(scope="module")
def offline_wandb():
    """W&B writes its runs to disk only (each test's into a folder of its own: `wandb_dir`)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("WANDB_MODE", "offline")
    patch.setenv("WANDB_SILENT", "true")
    yield
    patch.undo()


@pytest.fixture(scope="module")
def searched(tmp_path_factory, offline_wandb):
    """A six-trial search logged to every installed tracker, and its study."""
    folder = tmp_path_factory.mktemp("search")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_DIR", wandb_dir(folder)["WANDB_DIR"])  # read when the tracker is made
        tracking = SearchTracking(*specs(folder))
    with tracking:
        search(folder, on_event=tracking)
    return folder, load_study(folder)


@pytest.fixture(scope="module")
def seeds(tmp_path_factory, offline_wandb):
    """A three-seed stability study logged to every installed tracker, and its outcomes."""
    folder = tmp_path_factory.mktemp("stability")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_DIR", wandb_dir(folder)["WANDB_DIR"])  # read when the tracker is made
        tracking = StabilityTracking(*specs(folder))
    with tracking:
        result, _ = run_stability([LabelledConfig("mlp", mlp_config())], n_seeds=3, on_event=tracking)
    return folder, result


def attributes_of(trial):
    return {key: trial.user_attrs[key] for key in ("array_id", "slot", "seed_init", "seed_data", "seed_dropout")}


# ------------------------------------------------------------------ MLflow
def mlflow_runs(folder, experiment):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{folder}/mlflow.db")
    found = client.get_experiment_by_name(experiment)
    assert found is not None, [e.name for e in client.search_experiments()]
    return client, {run.info.run_name: run for run in client.search_runs([found.experiment_id])}


def test_mlflow_has_an_experiment_per_study_and_a_run_per_trial(searched):
    pytest.importorskip("mlflow")
    folder, study = searched
    client, runs = mlflow_runs(folder, "tiny")
    assert sorted(runs) == sorted(f"trial {t.number}" for t in study.trials)
    for trial in study.trials:
        run = runs[f"trial {trial.number}"]
        assert run.info.status == "FINISHED" and run.data.tags["state"] == "COMPLETE"
        assert run.data.params == {key: str(value) for key, value in trial.params.items()}
        assert {key: run.data.tags[key] for key in attributes_of(trial)} == {
            key: str(value) for key, value in attributes_of(trial).items()
        }
        curve = client.get_metric_history(run.info.run_id, "val_acc")
        assert [(m.step, m.value) for m in sorted(curve, key=lambda m: m.step)] == sorted(
            trial.intermediate_values.items()
        )
        assert run.data.metrics["final/val_acc"] == trial.value
        assert {"train_loss", "val_loss"} <= set(run.data.metrics)


def test_mlflow_has_a_run_per_seed_grouped_by_the_configs_study(seeds):
    pytest.importorskip("mlflow")
    folder, result = seeds
    client, runs = mlflow_runs(folder, "mlp")  # no storage: the label names the study
    assert sorted(runs) == ["seed 0", "seed 1", "seed 2"]
    for index, row in result.seeds.sort_values("seed_index").iterrows():
        run = runs[f"seed {row['seed_index']}"]
        assert run.data.tags["seed_init"] == str(row["seed_init"]) and run.data.tags["slot"] == str(index)
        assert run.data.params["hparams.lr"] == "0.05" and run.data.params["model"] == "mlp"
        assert len(client.get_metric_history(run.info.run_id, "test_acc")) == 2
        assert run.data.metrics["final/test_acc"] == pytest.approx(row["test_acc"], rel=1e-12)


# ------------------------------------------------------------- TensorBoard
def tensorboard_run(folder):
    """Scalars (tag -> [(step, value)]) and hparams of one run's folder, by TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(folder))
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    return scalars, {key: getattr(value, value.WhichOneof("kind")) for key, value in hparams.items()}


def test_tensorboard_has_a_folder_per_study_and_a_subfolder_per_trial(searched):
    pytest.importorskip("tensorboard")
    folder, study = searched
    assert sorted(p.name for p in (folder / "tb" / "tiny").iterdir()) == sorted(
        f"trial_{t.number}" for t in study.trials
    )
    for trial in study.trials:
        scalars, hparams = tensorboard_run(folder / "tb" / "tiny" / f"trial_{trial.number}")
        curve = sorted(trial.intermediate_values.items())
        assert [step for step, _ in scalars["val_acc"]] == [step for step, _ in curve]
        assert [v for _, v in scalars["val_acc"]] == pytest.approx([v for _, v in curve], rel=1e-6)  # float32
        assert scalars["final/val_acc"][0][1] == pytest.approx(trial.value, rel=1e-6)
        assert {key: hparams[key] for key in trial.params} == pytest.approx(trial.params)
        assert {key: hparams[key] for key in attributes_of(trial)} == attributes_of(trial)
        assert hparams["state"] == "COMPLETE" and hparams["study"] == "tiny"


def test_tensorboard_has_a_subfolder_per_seed(seeds):
    pytest.importorskip("tensorboard")
    folder, result = seeds
    assert sorted(p.name for p in (folder / "tb" / "mlp").iterdir()) == ["seed_0", "seed_1", "seed_2"]
    for _, row in result.seeds.iterrows():
        scalars, hparams = tensorboard_run(folder / "tb" / "mlp" / f"seed_{row['seed_index']}")
        assert [step for step, _ in scalars["test_acc"]] == [1, 2]
        assert scalars["final/test_acc"][0][1] == pytest.approx(row["test_acc"], rel=1e-6)
        assert hparams["seed_data"] == row["seed_data"] and hparams["optimizer"] == "sgd"


# ---------------------------------------------------------------------- W&B
def wandb_runs(folder):
    """(group, display name) -> run: config, history rows, summary and exit code, from each offline run's
    .wandb transaction log as W&B's own reader (`wandb leet inspect --json`) prints its records."""
    runs = {}
    for log in folder.glob("wandb/offline-run-*/run-*.wandb"):
        done = subprocess.run(
            [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)],
            capture_output=True,
            text=True,
            timeout=GUARD_S,
        )
        assert done.returncode == 0, done.stderr
        run = {"config": {}, "history": [], "summary": {}}
        for record in map(json.loads, done.stdout.splitlines()):
            kind = record["type"]
            if kind == "run":
                run.update(name=record["run"]["display_name"], group=record["run"]["run_group"])
                run["config"].update(record["run"]["config"]["update"])
            elif kind == "config":
                run["config"].update(record["config"].get("update", {}))
            elif kind == "history":
                run["history"].append(record["history"]["item"])
            elif kind == "summary":
                run["summary"].update(record["summary"].get("update", {}))
            elif kind == "exit":
                run["exit_code"] = record["exit"].get("exit_code", 0)
        runs[run["group"], run["name"]] = run
    return runs


def test_wandb_offline_has_a_run_per_trial_grouped_by_the_study(searched):
    pytest.importorskip("wandb")
    folder, study = searched
    runs = {name: run for (group, name), run in wandb_runs(folder / "wb").items() if group == "tiny"}
    assert sorted(runs) == sorted(f"trial {t.number}" for t in study.trials)
    for trial in study.trials:
        run = runs[f"trial {trial.number}"]
        assert {key: run["config"][key] for key in trial.params} == trial.params
        assert {key: run["config"][key] for key in attributes_of(trial)} == attributes_of(trial)
        curve = sorted((row["_step"], row["val_acc"]) for row in run["history"])
        assert curve == sorted(trial.intermediate_values.items())
        assert run["summary"]["final/val_acc"] == trial.value and run["summary"]["state"] == "COMPLETE"
        assert run["exit_code"] == 0


def test_wandb_offline_has_a_run_per_seed(seeds):
    pytest.importorskip("wandb")
    folder, result = seeds
    runs = {name: run for (group, name), run in wandb_runs(folder / "wb").items() if group == "mlp"}
    assert sorted(runs) == ["seed 0", "seed 1", "seed 2"]
    for _, row in result.seeds.iterrows():
        run = runs[f"seed {row['seed_index']}"]
        assert run["config"]["seed_dropout"] == row["seed_dropout"] and run["config"]["array"] == 1
        assert [r["_step"] for r in run["history"]] == [1, 2]
        assert run["summary"]["final/test_acc"] == pytest.approx(row["test_acc"], rel=1e-12)


# ---------------------------------------------------------------- commands
def cli(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def test_search_and_stability_commands_log_with_log(tmp_path, offline_wandb):
    if not INSTALLED:
        pytest.skip("no tracker library installed")
    space, config = tmp_path / "space.yaml", tmp_path / "mlp.yaml"
    space.write_text(space_text(budget={"n_trials": 2}, study={"name": "cli", "metrics": ["val_acc"]}))
    config.write_text(mlp_config().to_yaml())
    options = ["--storage", tmp_path / "s.journal", "--quiet", *[f"--log={spec}" for spec in specs(tmp_path)]]
    done = cli("search", space, "--out", tmp_path / "out", *options, env=wandb_dir(tmp_path))
    assert done.exit_code == 0, done.output
    report = ["--out", tmp_path / "report", "--format", "json"]
    done = cli("stability", config, "--seeds", 2, *report, *options, env=wandb_dir(tmp_path))
    assert done.exit_code == 0, done.output
    (study,) = [name for name in load_studies(tmp_path / "s.journal") if name.startswith("stability:")]
    logged = {"cli": ["trial 0", "trial 1"], study: ["seed 0", "seed 1"]}
    if "mlflow" in INSTALLED:
        assert {name: sorted(mlflow_runs(tmp_path, name)[1]) for name in logged} == logged
    if "tensorboard" in INSTALLED:
        folders = {
            p.name: sorted(run.name.replace("_", " ") for run in p.iterdir()) for p in (tmp_path / "tb").iterdir()
        }
        assert folders == {"cli": logged["cli"], study.replace(":", "_"): logged[study]}
    if "wandb" in INSTALLED:
        runs = wandb_runs(tmp_path / "wb")
        assert {name: sorted(run for group, run in runs if group == name) for name in logged} == logged


def load_studies(journal):
    from hfta_nas.search import open_storage

    return [s.study_name for s in optuna.get_all_study_summaries(open_storage(str(journal))[0])]


BAD_LOGS = [
    ("nosuch:x", "unknown tracker 'nosuch'"),
    ("tensorboard:{file}/tb", "tensorboard:"),  # a folder inside a file cannot be made
]


@pytest.mark.parametrize(("log", "message"), BAD_LOGS, ids=["unknown backend", "unwritable folder"])
@pytest.mark.parametrize("command", ["search", "stability"])
def test_a_bad_log_is_one_line_and_exit_2(tmp_path, command, log, message):
    if log.startswith("tensorboard"):
        pytest.importorskip("tensorboard")
    (tmp_path / "file").write_text("")
    config = tmp_path / "config.yaml"
    config.write_text(space_text() if command == "search" else mlp_config().to_yaml())
    done = cli(command, config, "--storage", tmp_path / "s.journal", "--log", log.format(file=tmp_path / "file"))
    assert done.exit_code == 2, done.output
    assert done.output.startswith("error: ") and message in done.output and done.output.count("\n") == 1
    assert "Traceback" not in done.output and not (tmp_path / "s.journal").exists()


@pytest.mark.parametrize("backend", ["mlflow", "tensorboard", "wandb"])
def test_a_tracker_whose_library_is_missing_says_which_extra_to_install(tmp_path, backend):
    """The library made unimportable in a fresh interpreter (None in sys.modules: what an absent module reads as)."""
    blocked = {"tensorboard": "torch.utils.tensorboard"}.get(backend, backend)
    (tmp_path / "space.yaml").write_text(space_text())
    code = f"""
import sys
sys.modules[{blocked!r}] = None
from hfta_nas.cli import main
main(["search", "space.yaml", "--storage", "s.journal", "--log", {backend!r}], prog_name="hfta-nas")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=GUARD_S, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    name = {"mlflow": "MLflow", "tensorboard": "TensorBoard", "wandb": "W&B"}[backend]
    assert done.stderr == f"error: {name} is not installed: pip install 'hfta-nas[{backend}]'.\n"


def test_wandb_online_without_a_login_is_one_line_before_anything_trains(tmp_path):
    pytest.importorskip("wandb")
    (tmp_path / "space.yaml").write_text(space_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), WANDB_MODE="online", WANDB_CONFIG_DIR=str(tmp_path / "config"))
    command = ["search", "space.yaml", "--storage", "s.journal", "--log", "wandb:p"]
    code = f"from hfta_nas.cli import main; main({command!r}, prog_name='hfta-nas')"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=GUARD_S, cwd=tmp_path, env=env
    )
    assert done.returncode == 2 and done.stderr.startswith("error: wandb:p: not logged in to W&B"), done.stderr
    assert done.stderr.count("\n") == 1 and not (tmp_path / "s.journal").exists()


# ------------------------------------------------------- a server goes away
@pytest.fixture
def mlflow_server(tmp_path, monkeypatch):
    """A real MLflow tracking server on a free port, up once it says so; its client does not retry."""
    pytest.importorskip("mlflow")
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{tmp_path}/server.db"]
    server = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, start_new_session=True
    )  # a group of its own: its uvicorn and job runners go with it
    lines = []
    for line in server.stdout:  # blocks until the server writes: no polling
        lines.append(line)
        if "Application startup complete" in line or "Listening at" in line:
            break
    assert server.poll() is None, "".join(lines)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # a refused connection fails at once
    yield (lambda: os.killpg(server.pid, signal.SIGKILL)), f"http://127.0.0.1:{port}"
    with contextlib.suppress(ProcessLookupError):  # stopped by the test already
        os.killpg(server.pid, signal.SIGKILL)
    server.wait()


@pytest.mark.slow
def test_a_tracking_server_that_goes_away_is_warned_about_once_and_the_search_goes_on(tmp_path, mlflow_server, caplog):
    stop, uri = mlflow_server
    stopped = []

    def stop_the_server_at_the_first_epoch(event):
        if isinstance(event, TrialEpochEnded) and not stopped:
            stopped.append(stop())
        tracking(event)

    with caplog.at_level(logging.WARNING, logger="hfta_nas.tracking"), SearchTracking(f"mlflow:{uri}") as tracking:
        summary = search(tmp_path, on_event=stop_the_server_at_the_first_epoch)
    assert summary.trials == {"COMPLETE": 6}
    warnings = [r.getMessage() for r in caplog.records if r.name == "hfta_nas.tracking"]
    assert len(warnings) == 1 and warnings[0].startswith("tracking: mlflow failed"), warnings


def test_the_tracking_libraries_load_only_when_a_tracker_is_made():
    done = loaded_after(
        "import hfta_nas, hfta_nas.tracking, hfta_nas.stability; hfta_nas.stability.StabilityTracking; result = 0"
    )
    assert present(done["modules"], LIBRARIES) == []
    helped = run_cli("search", "--help")
    assert "--log BACKEND[:WHERE]" in helped["result"]["output"] and present(helped["modules"], LIBRARIES) == []
