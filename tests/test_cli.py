"""The hfta-nas command: help, a small real run, and clear errors (exit 2, no traceback)."""

import json

import optuna
import pytest
from click.testing import CliRunner

import hfta_nas.search
from hfta_nas.cli import main


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
    result = run(
        "train",
        "--dataset",
        "digits",
        "--model",
        "mlp",
        "--config",
        "width=16",
        "--seeds",
        "3,1,4",
        "--lr",
        "1e-2,3e-3,1e-3",
        "--epochs",
        "2",
        "--json",
        "--threads",
        "1",
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert [row["init_seed"] for row in summary["slots"]] == [3, 1, 4]
    assert all(
        row["status"] == "completed" and row["epochs"] == 2 and 0 <= row["val_acc"] <= 1 for row in summary["slots"]
    )
    assert summary["samples_per_second"] > 0


def test_train_with_schedule_and_separate_seed_sources():
    result = run(
        "train",
        "--dataset",
        "digits",
        "--model",
        "mlp",
        "--seeds",
        "2",
        "--data-seeds",
        "5,6",
        "--dropout-seeds",
        "7,8",
        "--schedule",
        "step",
        "--schedule-arg",
        "step_size=1",
        "--epochs",
        "1",
        "--json",
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["slots"]
    assert [(r["data_seed"], r["dropout_seed"]) for r in rows] == [(5, 7), (6, 8)]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--dataset", "imagenet"], "imagenet"),
        (["--model", "no_such_module:build"], "no_such_module"),
        (["--model", "resnet"], "unknown model 'resnet'"),
        (["--lr", "1e-3,2e-3", "--seeds", "3"], "has 2 values but the array has 3 slots"),
        (["--config", "depth=-1", "--model", "mlp"], "depth"),
        (["--epochs", "-1"], "epochs must be a non-negative integer"),
        (["--lr", "fast"], "expected a number"),
        (["--seeds", "0"], "must be >= 1"),
    ],
)
def test_user_errors_exit_2_without_traceback(args, message):
    result = run("train", "--dataset", "digits", "--model", "mlp", "--epochs", "1", *args)  # later options win
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


# ------------------------------------------------------------- output that survives terminals and pipes
def test_printed_commands_never_wrap_in_a_narrow_terminal_or_a_pipe(tmp_path):
    """COLUMNS=60 (a narrow terminal) and no COLUMNS (a pipe): the dashboard command stays one line,
    and a re-run with nothing left to train says why instead of '0 arrays'."""
    from tests.test_search import space_text

    space = tmp_path / "space.yaml"
    space.write_text(space_text(budget={"n_trials": 2}))
    journal = tmp_path / "a-rather-long-folder-name-for-the-journal" / "study.journal"
    args = [
        "search",
        str(space),
        "--storage",
        str(journal),
        "--out",
        str(tmp_path / "out"),
        "--quiet",
        "--threads",
        "1",
    ]
    for env in ({"COLUMNS": "60"}, {}):
        result = CliRunner().invoke(main, args, env=env)
        assert result.exit_code == 0, result.output
        expected = f"dashboard: optuna-dashboard {journal} --artifact-dir {journal.parent / 'artifacts'}"
        assert expected in result.output.splitlines(), result.output
    assert "nothing to train this run" in result.output and "0 arrays" not in result.output
    # the space file is the study's artifact (shown readably by the dashboard), uploaded once for both runs
    study = optuna.load_study(
        study_name="tiny",
        storage=optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal))),
    )
    [artifact] = optuna.artifacts.get_all_artifact_meta(study)
    assert artifact.filename == "space.yaml"
    assert (journal.parent / "artifacts" / artifact.artifact_id).read_text() == space.read_text()
    assert "space_text" not in study.user_attrs

    config = tmp_path / "tiny.yaml"
    config.write_text(
        "model: mlp\nmodel_config: {width: 8, depth: 1}\ndataset: digits\noptimizer: sgd\n"
        "hparams: {lr: 0.05}\nepochs: 1\ndata: {batch_size: 50}\n"
    )
    result = CliRunner().invoke(
        main,
        [
            "stability",
            str(config),
            "--seeds",
            "2",
            "--storage",
            str(journal),
            "--out",
            str(tmp_path / "report"),
            "--format",
            "html",
            "--plot-format",
            "png",
            "--quiet",
            "--threads",
            "1",
        ],
        env={"COLUMNS": "60"},
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    dashboard = next(line for line in lines if line.startswith("dashboard: "))
    assert dashboard.endswith(str(tmp_path / "a-rather-long-folder-name-for-the-journal" / "artifacts")), lines
    assert "1 array of 2 slots" in result.output and "array(s)" not in result.output
    # beside the journal: the study and its report's artifacts; lock files hidden, no checkpoint folder left
    assert sorted(p.name for p in journal.parent.iterdir() if not p.name.startswith(".")) == [
        "artifacts",
        "study.journal",
    ]


# ------------------------------------------------------------------------------- dashboard
def test_dashboard_refuses_a_storage_that_does_not_exist_and_creates_nothing(tmp_path):
    for storage in (tmp_path / "typo.journal", f"sqlite:///{tmp_path / 'typo.db'}"):
        result = CliRunner().invoke(main, ["dashboard", "--storage", str(storage)])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert "no storage at" in result.output and "run `hfta-nas search`" in result.output
    assert list(tmp_path.iterdir()) == []


def test_dashboard_takes_the_next_free_port_when_the_default_is_busy(tmp_path, monkeypatch):
    import socket

    import optuna
    import optuna_dashboard

    journal = tmp_path / "s.journal"
    optuna.create_study(storage=hfta_nas.search.open_storage(str(journal))[0], study_name="x")
    served = {}
    monkeypatch.setattr(optuna_dashboard, "run_server", lambda storage, host, port, **kw: served.update(port=port))
    try:
        taken = socket.create_server(("127.0.0.1", 8080))
    except OSError:  # taken already, by something else on this machine: the same situation
        taken = None
    try:
        result = CliRunner().invoke(main, ["dashboard", "--storage", str(journal)])
    finally:
        if taken is not None:
            taken.close()
    assert result.exit_code == 0, result.output
    assert 8080 < served["port"] <= 8099 and f"port 8080 is taken; serving on {served['port']} instead" in result.output


def test_n_more_trains_that_many_more_trials_than_the_study_counts(tmp_path):
    from tests.test_search import space_text

    space = tmp_path / "space.yaml"
    space.write_text(space_text(budget={"n_trials": 2}))
    args = [
        "search",
        str(space),
        "--storage",
        str(tmp_path / "s.journal"),
        "--out",
        str(tmp_path / "out"),
        "--quiet",
        "--threads",
        "1",
        "--json",
    ]
    assert CliRunner().invoke(main, args).exit_code == 0
    result = CliRunner().invoke(main, [*args, "--n-more", "2"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["trials"] == {"COMPLETE": 4}  # Optuna's optimize(n_trials=2) meaning
    both = CliRunner().invoke(main, [*args, "--n-more", "1", "--n-trials", "3"])
    assert both.exit_code == 2 and "not both" in both.output


def test_piped_runs_print_plain_progress_lines_with_an_eta(tmp_path):
    """Not a terminal: a stability study prints about ten lines per array with an ETA as it trains,
    and a search's status line per array carries one."""
    from tests.test_search import space_text

    config = tmp_path / "tiny.yaml"
    config.write_text(
        "model: mlp\nmodel_config: {width: 8, depth: 1}\ndataset: digits\noptimizer: sgd\n"
        "hparams: {lr: 0.05}\nepochs: 20\ndata: {batch_size: 50}\n"
    )
    result = CliRunner().invoke(
        main,
        [
            "stability",
            str(config),
            "--seeds",
            "2",
            "--storage",
            str(tmp_path / "s.journal"),
            "--out",
            str(tmp_path / "r"),
            "--format",
            "csv",
            "--plot-format",
            "png",
            "--threads",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("tiny (2 slots): epoch ")]
    assert len(lines) == 10 and lines[-1].startswith("tiny (2 slots): epoch 20/20") and "ETA" in lines[0]

    space = tmp_path / "space.yaml"
    space.write_text(space_text(budget={"n_trials": 4}))
    result = CliRunner().invoke(
        main,
        [
            "search",
            str(space),
            "--storage",
            str(tmp_path / "s.journal"),
            "--out",
            str(tmp_path / "o"),
            "--threads",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    assert any("complete" in line and "ETA" in line for line in result.stderr.splitlines()), result.stderr


def test_printed_commands_quote_paths_with_spaces(tmp_path):
    import shlex

    from tests.test_search import space_text

    space = tmp_path / "space.yaml"
    space.write_text(space_text(budget={"n_trials": 1}))
    journal = tmp_path / "my runs" / "study.journal"
    result = CliRunner().invoke(
        main,
        [
            "search",
            str(space),
            "--storage",
            str(journal),
            "--study-name",
            "my study",
            "--out",
            str(tmp_path / "my out"),
            "--quiet",
            "--threads",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("dashboard: "))
    assert shlex.split(line.removeprefix("dashboard: ")) == [
        "optuna-dashboard",
        str(journal),
        "--artifact-dir",
        str(journal.parent / "artifacts"),
    ]


# ----------------------------------------------------------------- the search's last screen
def test_the_last_screen_fits_80_columns_and_ends_with_next_steps(tmp_path):
    from tests.test_search import space_text

    space = tmp_path / "space.yaml"
    space.write_text(space_text(budget={"n_trials": 2}))
    journal, out = tmp_path / "study.journal", tmp_path / "out"
    args = ["search", str(space), "--storage", str(journal), "--out", str(out), "--quiet", "--threads", "1"]
    result = CliRunner().invoke(main, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    table = [line for line in lines if line[:1] in "┏┃┡│└"]
    assert table and max(len(line) for line in table) <= 80, "\n".join(table)
    assert lines[-2:] == [
        f"next: hfta-nas stability {out / 'best_config.yaml'} --seeds 32   # how far the best trial's score "
        "moves with the seed",
        f"next: hfta-nas dashboard --storage {journal}   # the study in optuna-dashboard: curves, importances, "
        "every trial",
    ]
    # the stability command it names reads the exported config (its own tests run it)
    from hfta_nas.stability import load_config

    assert load_config(out / "best_config.yaml") is not None


def test_a_low_occupancy_says_why_on_its_line():
    from types import SimpleNamespace

    from hfta_nas.search_spaces._search_output import occupancy_reason

    low = SimpleNamespace(mean_occupancy=0.3, arrays=[{"slots": 2, "array_size": 8}, {"slots": 8, "array_size": 8}])
    assert occupancy_reason(low).startswith(" (arrays started 62% full")
    assert "pruning" in occupancy_reason(low)
    assert occupancy_reason(SimpleNamespace(mean_occupancy=0.9, arrays=low.arrays)) == ""


def test_a_stability_array_continued_from_a_checkpoint_says_so(capsys):
    from hfta_nas.stability._cli import _Progress

    with _Progress(enabled=True) as progress:
        progress.event("continued", {"label": "mlp", "size": 2, "epoch": 3, "epochs": 8})
    printed = " ".join(capsys.readouterr().err.split())
    assert "mlp (2 slots): continuing from epoch 3/8, from the checkpoint an interrupted run left" in printed


def test_piped_stability_progress_counts_from_the_arrays_start_and_times_its_epochs(capsys, monkeypatch):
    """Not a terminal: elapsed time counts from the array's start (its build and first epoch
    included), and the ETA is the mean time per epoch so far times the epochs left; a progress
    that did not hear the start gives no ETA until an epoch is timed."""
    import hfta_nas.stability._cli as stability_cli

    now = [0.0]
    monkeypatch.setattr(stability_cli.time, "monotonic", lambda: now[0])
    info = {"label": "cnn", "size": 4, "epochs": 8}

    def at(seconds, progress, kind, **more):
        now[0] = float(seconds)
        progress.event(kind, {**info, **more})

    with stability_cli._Progress(enabled=True) as progress:
        at(0, progress, "started")
        at(2, progress, "epoch", epoch=1)
        at(4, progress, "epoch", epoch=2)
        at(16, progress, "epoch", epoch=8)
        at(20, progress, "continued", epoch=3)  # a re-run restored epochs 1-3 from a checkpoint
        at(20, progress, "started")
        at(23, progress, "epoch", epoch=4)  # one epoch trained in this run
    later = stability_cli._Progress(enabled=True)
    at(30, later, "epoch", epoch=5)  # no "started" heard
    at(32, later, "epoch", epoch=6)
    lines = [" ".join(line.split()) for line in capsys.readouterr().err.splitlines() if ": epoch " in line]
    assert lines == [
        "cnn (4 slots): epoch 1/8, 2.0 s, ETA 14 s",
        "cnn (4 slots): epoch 2/8, 4.0 s, ETA 12 s",
        "cnn (4 slots): epoch 8/8, 16.0 s",
        "cnn (4 slots): epoch 4/8, 3.0 s, ETA 12 s",
        "cnn (4 slots): epoch 5/8, 0.0 s",
        "cnn (4 slots): epoch 6/8, 2.0 s, ETA 4 s",
    ]
