"""`--set key=value` on search, stability and train, and the training section's clipping,
accumulation and early stopping as a search space and a config file write them."""

import json

import optuna
import pytest
from click.testing import CliRunner

import hfta_nas
from hfta_nas.cli import main
from hfta_nas.search import study_text
from hfta_nas.search_spaces import ResolvedConfig, SpaceError, parse_space
from tests.test_search import search, space_text


def test_set_overrides_a_space_and_is_validated_with_it():
    space = parse_space(
        space_text(),
        "s.yaml",
        [
            "training.epochs=5",
            "array.size=4",
            "model.config.depth=2",
            "params.training.optimizer.lr=0.01",
            "training.clip_norm=0.5",
        ],
    )
    assert space.training.epochs == 5 and space.array.size == 4 and space.model.config["depth"] == 2
    assert space.fixed == {"training.optimizer.lr": 0.01} and list(space.searched) == ["model.config.width"]
    assert space.resolve({"model.config.width": 16}).hparams["clip_norm"] == 0.5
    assert space.overrides == (
        "training.epochs=5",
        "array.size=4",
        "model.config.depth=2",
        "params.training.optimizer.lr=0.01",
        "training.clip_norm=0.5",
    )
    with pytest.raises(SpaceError) as caught:
        parse_space(space_text(), "s.yaml", ["training.epochs=ten", "training.epoch=2", "budget"])
    assert str(caught.value).splitlines() == [
        "--set budget: expected key=value with a dotted key, e.g. training.epochs=2"
    ]
    with pytest.raises(SpaceError) as caught:
        parse_space(space_text(), "s.yaml", ["training.epochs=ten", "training.clip_norm=-1"])
    lines = str(caught.value).splitlines()
    assert "--set training.epochs=ten: training.epochs: expected an integer, got 'ten' (str)" in lines
    assert any(
        line.startswith("--set training.clip_norm=-1: training.clip_norm: expected a value > 0") for line in lines
    )


def test_a_config_file_takes_either_layout_and_round_trips_the_new_settings(tmp_path):
    config = ResolvedConfig.from_yaml(
        "model: mlp\nmodel_config: {width: 8, depth: 1}\ndataset: digits\n",
        "c.yaml",
        [
            "epochs=3",
            "training.accumulate=2",
            "hparams.clip_value=0.1",
            "early_stopping={patience: 2}",
            "training.clip_norm=1.0",
        ],
    )
    assert config.epochs == 3 and config.accumulate == 2 and config.hparams["clip_value"] == 0.1
    assert config.hparams["clip_norm"] == 1.0
    assert config.early_stopping == {"metric": "val_loss", "patience": 2, "min_delta": 0.0, "mode": None}
    assert ResolvedConfig.from_yaml(config.to_yaml()) == config
    plain = ResolvedConfig.from_yaml("model: mlp\ndataset: digits\n")
    text = plain.to_yaml()
    assert "accumulate" not in text and "early_stopping" not in text and "clip" not in text  # as before they existed
    with pytest.raises(SpaceError, match=r"--set accumulate=0: accumulate: expected a value >= 1"):
        ResolvedConfig.from_yaml("model: mlp\ndataset: digits\n", "c.yaml", ["accumulate=0"])


def test_a_search_with_early_stopping_refills_the_stopped_slots(tmp_path):
    text = space_text(
        seed=0,  # its trials' sampler streams draw clip norms with which some trials stop early
        sampler={"name": "random"},  # every trial asked as a slot frees (TPE would hold its guided asks)
        budget={"n_trials": 5},
        array={"size": 2},
        training={
            "epochs": 6,
            "optimizer": {"name": "sgd", "lr": 0.5},
            "accumulate": 2,
            "clip_norm": 1.0,
            "early_stopping": {"metric": "val_acc", "patience": 1},
        },
        params={
            "training.clip_norm": {"distribution": "log_uniform", "min": 0.01, "max": 1.0},
            "model.config.width": {"distribution": "categorical", "values": [16]},
        },
    )
    summary = search(tmp_path, text)
    study = optuna.load_study(
        study_name="tiny",
        storage=optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(tmp_path / "study.journal"))
        ),
    )
    trials = study.trials
    assert summary.trials == {"COMPLETE": 5}
    early = [t for t in trials if t.user_attrs["epochs_run"] < 6]
    assert early, "some trial should stop early"
    # every early stop freed its slot for a waiting trial: fewer arrays than trials / size would need
    assert len({t.user_attrs["array_id"] for t in trials}) < 3
    for trial in trials:  # each trial's reported curve ends where it stopped
        assert max(trial.intermediate_values) == trial.user_attrs["epochs_run"]


def test_search_stability_and_train_take_set_on_the_command_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    space = tmp_path / "space.yaml"
    space.write_text(space_text(budget={"n_trials": 2}))
    journal = str(tmp_path / "s.journal")
    result = CliRunner().invoke(
        main,
        [
            "search",
            str(space),
            "--storage",
            journal,
            "--quiet",
            "--set",
            "training.epochs=1",
            "--set",
            "study.name=short",
        ],
    )
    assert result.exit_code == 0, result.output
    study = optuna.load_study(
        study_name="short", storage=optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(journal))
    )
    assert {t.user_attrs["epochs_run"] for t in study.trials} == {1}
    assert study_text(study, "space_overrides") == ["training.epochs=1", "study.name=short"]
    # the best trials re-run as they were searched: with the override
    result = CliRunner().invoke(
        main,
        [
            "stability",
            "--study",
            "short",
            "--top-k",
            "1",
            "--seeds",
            "2",
            "--storage",
            journal,
            "--quiet",
            "--format",
            "csv",
            "--plot-format",
            "png",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    import pandas as pd

    seeds = pd.read_csv(tmp_path / json.loads(result.output)["report"] / "seeds.csv")
    assert set(seeds["epochs"]) == {1}

    result = CliRunner().invoke(
        main,
        [
            "stability",
            "--seeds",
            "2",
            "--storage",
            journal,
            "--quiet",
            "--json",
            "--format",
            "csv",
            "--set",
            "training.epochs=1",
            "--set",
            "data.batch_size=250",
        ],
    )
    assert result.exit_code == 0, result.output
    bad = CliRunner().invoke(main, ["stability", "--seeds", "2", "--storage", journal, "--set", "epochs=0"])
    assert (
        bad.exit_code == 2 and bad.output.strip() == "error: --set epochs=0: epochs: expected a value >= 1, got 0 (int)"
    )

    result = CliRunner().invoke(
        main,
        [
            "train",
            "--dataset",
            "digits",
            "--model",
            "mlp",
            "--seeds",
            "2",
            "--json",
            "--set",
            "epochs=2",
            "--set",
            "model_config.width=8",
            "--set",
            "accumulate=2",
        ],
    )
    assert result.exit_code == 0, result.output
    bad = CliRunner().invoke(main, ["train", "--set", "optimiser=sgd"])
    assert bad.exit_code == 2 and "unknown setting 'optimiser'" in bad.output and "Traceback" not in bad.output


def test_train_set_is_the_same_run_as_the_python_api():
    run = hfta_nas.train(
        "mlp",
        model_config={"width": 8, "depth": 1},
        dataset="digits",
        seeds=[0, 1],
        epochs=2,
        hparams={"lr": 3e-3, "clip_norm": 0.5},
        accumulate=2,
        dtype="float64",
    )
    result = CliRunner().invoke(
        main,
        [
            "train",
            "--dataset",
            "digits",
            "--model",
            "mlp",
            "--seeds",
            "2",
            "--json",
            "--dtype",
            "float64",
            "--set",
            "model_config={width: 8, depth: 1}",
            "--set",
            "epochs=2",
            "--set",
            "training.clip_norm=0.5",
            "--set",
            "accumulate=2",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["slots"]
    assert [row["val_acc"] for row in rows] == [r.final["val_acc"] for r in run.results.values()]


def test_train_set_takes_a_loss_and_shows_regression_metrics():
    result = CliRunner().invoke(
        main,
        [
            "train",
            "--dataset",
            "diabetes",
            "--model",
            "mlp",
            "--seeds",
            "2",
            "--epochs",
            "1",
            "--set",
            "loss=huber",
            "--set",
            "loss.delta=0.5",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "val rmse" in result.output and "val acc" not in result.output
    bad = CliRunner().invoke(main, ["train", "--set", "loss=msee", "--epochs", "1"])
    assert bad.exit_code == 2 and "unknown loss 'msee'" in bad.output
    bad = CliRunner().invoke(main, ["train", "--set", "model_config=3", "--set", "model_config.width=3"])
    assert bad.exit_code == 2 and "model_config is 3, not a mapping" in bad.output and "Traceback" not in bad.output
