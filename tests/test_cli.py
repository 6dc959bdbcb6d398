"""The hfta-nas command: help, a small real run, and clear errors (exit 2, no traceback)."""

import json

import pytest
from click.testing import CliRunner

from cli import main


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_help_lists_the_commands():
    result = run("--help")
    assert result.exit_code == 0
    assert "train" in result.output


def test_train_help_documents_defaults():
    result = run("train", "--help")
    assert result.exit_code == 0 and "[default: cnn1d]" in result.output and "--json" in result.output


def test_train_json_reports_every_slot():
    result = run("train", "--dataset", "digits", "--model", "mlp", "--config", "width=16", "--seeds", "3,1,4",
                 "--lr", "1e-2,3e-3,1e-3", "--epochs", "2", "--json", "--threads", "1")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert [row["init_seed"] for row in summary["slots"]] == [3, 1, 4]
    assert all(row["status"] == "completed" and row["epochs"] == 2 and 0 <= row["val_acc"] <= 1 for row in summary["slots"])
    assert summary["samples_per_second"] > 0


def test_train_with_schedule_and_separate_seed_sources():
    result = run("train", "--dataset", "digits", "--model", "mlp", "--seeds", "2", "--data-seeds", "5,6",
                 "--dropout-seeds", "7,8", "--schedule", "step", "--schedule-arg", "step_size=1", "--epochs", "1", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["slots"]
    assert [(r["data_seed"], r["dropout_seed"]) for r in rows] == [(5, 7), (6, 8)]


@pytest.mark.parametrize("args,message", [
    (["--dataset", "imagenet"], "imagenet"),
    (["--model", "no_such_module:build"], "no_such_module"),
    (["--model", "resnet"], "unknown model 'resnet'"),
    (["--lr", "1e-3,2e-3", "--seeds", "3"], "has 2 values but the array has 3 slots"),
    (["--config", "depth=-1", "--model", "mlp"], "depth"),
    (["--epochs", "-1"], "epochs must be a non-negative integer"),
    (["--lr", "fast"], "expected a number"),
    (["--seeds", "0"], "must be >= 1"),
])
def test_user_errors_exit_2_without_traceback(args, message):
    result = run("train", "--dataset", "digits", "--model", "mlp", "--epochs", "1", *args)  # later options win
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
