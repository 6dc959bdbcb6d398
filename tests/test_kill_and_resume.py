"""A real SIGKILL in the middle of `hfta-nas search` / `hfta-nas stability`, then the
same command again: it finishes, keeps what the killed run finished, retries (search)
or trains (stability) only what was lost, and leaves nothing RUNNING.

The commands run as subprocesses (`--threads 1`); the test watches the Optuna journal
the command writes and kills the process once it is mid-array.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from hfta_nas.search import open_storage
from tests._rendezvous import GUARD_S, Rendezvous, held_command
from tests.test_search import space_text as tiny_space_text

pytestmark = pytest.mark.slow  # SIGKILL and Ctrl-C of real commands: the chaos part of the suite

optuna.logging.set_verbosity(optuna.logging.WARNING)

ROOT = Path(__file__).resolve().parents[1]
N_TRIALS = 6
EPOCHS = 6
NOT_COUNTED = ("interrupted:", "surplus:")
THIS_MODULE = f"tests.{Path(__file__).stem}"  # where the held process finds the conditions below


def hfta_nas_command(*args: str) -> list[str]:
    """The installed `hfta-nas` script of this interpreter, else `python cli.py`."""
    script = Path(sys.executable).with_name("hfta-nas")
    if script.exists():
        return [sys.executable, str(script), *args]
    return [sys.executable, str(ROOT / "cli.py"), *args]


def start(args: list[str], log: Path, held: dict[str, str] | None = None) -> subprocess.Popen:
    """The command running in the background, its output in `log`; with `held` (a rendezvous's
    environment), in a process that holds where the rendezvous says."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    command = held_command(*args) if held else hfta_nas_command(*args)
    with open(log, "wb") as stream:
        return subprocess.Popen(command, cwd=ROOT, stdout=stream, stderr=subprocess.STDOUT, env={**env, **(held or {})})


def finish(args: list[str], log: Path) -> subprocess.CompletedProcess:
    process = start(args, log)
    try:
        process.wait(timeout=GUARD_S)  # a guard against a hung run only
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"{args[0]} hung:\n{log.read_text(errors='replace')[-3000:]}") from None
    return subprocess.CompletedProcess(args, process.returncode, log.read_text(errors="replace"), "")


def stop_where(
    args: list[str], log: Path, when: str, journal: Path, sent: signal.Signals = signal.SIGKILL
) -> tuple[dict, int]:
    """Run the command until it holds where `when` ('module:function', see tests._rendezvous)
    says, send it `sent` (SIGKILL) there, and return the stored trials as the stopped run left
    them (read after it ended) and its exit status."""
    meeting = Rendezvous(log.parent / f"{log.stem}.rendezvous")
    process = start(args, log, held=meeting.env(when))
    try:
        try:
            meeting.wait(1, [process])
        except AssertionError as error:
            raise AssertionError(f"{error}:\n{log.read_text(errors='replace')[-3000:]}") from None
        process.send_signal(sent)  # it stands still where the condition held
        process.wait(timeout=GUARD_S)  # SIGINT: it ends on its own, and that is what is tested
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()  # reaped: the re-run sees a dead worker pid
        meeting.close()
    if sent == signal.SIGKILL:
        assert process.returncode == -signal.SIGKILL
    return stored_trials(open_storage(str(journal))[0]), process.returncode


def _checkpointed_trials(folder: Path) -> set[int]:
    """The trials still training in some checkpoint file under `folder` (of a killed run: nothing writes them now)."""
    import torch

    covered = set()
    for path in folder.rglob("*.pt"):
        state = torch.load(path, weights_only=True)
        results = state["trainer"]["results"]
        covered |= {record["origin"] for sid, record in state["slots"].items() if results[sid]["status"] == "running"}
    return covered


def stored_trials(storage) -> dict[str, list]:
    """Every study in the storage by name, with its trials."""
    return {s.study_name: storage.get_all_trials(s._study_id, deepcopy=False) for s in storage.get_all_studies()}


# -------------------------------------------------------------------- search
def search_space(epochs: int = EPOCHS) -> str:
    return tiny_space_text(
        study={"name": "killed", "metrics": ["val_acc"]},
        budget={"n_trials": N_TRIALS},
        training={"epochs": epochs, "optimizer": {"name": "adam", "lr": 1e-3}},
    )


def mid_second_array(point: str, trial, **_) -> bool:
    """At a report: finished trials to keep and an array in the middle of its epochs (a RUNNING
    trial that has reported some epochs but not all)."""
    if point != "report":
        return False
    trials = trial.study.get_trials(deepcopy=False)
    return any(t.state == TrialState.COMPLETE for t in trials) and any(
        t.state == TrialState.RUNNING and 0 < len(t.intermediate_values) < EPOCHS for t in trials
    )


MID_SECOND_ARRAY = f"{THIS_MODULE}:mid_second_array"


def test_search_killed_mid_array_resumes_keeps_finished_trials_and_retries_the_killed_ones(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(search_space())
    journal, out = tmp_path / "s.journal", tmp_path / "out"
    args = ["search", str(space), "--threads", "1", "--storage", str(journal), "--out", str(out), "--quiet"]

    before = stop_where(args, tmp_path / "first.log", MID_SECOND_ARRAY, journal)[0]["killed"]
    before = {t.number: t for t in before}
    finished = {n: t for n, t in before.items() if t.state.is_finished()}
    killed = {n: t for n, t in before.items() if t.state == TrialState.RUNNING}
    assert finished and killed, {n: t.state.name for n, t in before.items()}
    assert any(t.intermediate_values for t in killed.values())  # killed mid-array, not between arrays
    config_path = out / "best_config.yaml"
    left_by_the_kill = set(out.glob(".*.tmp"))  # a kill mid-export leaves its temporary file, never a torn target
    if config_path.exists():  # written atomically: a kill never leaves half a file
        assert isinstance(yaml.safe_load(config_path.read_text()), dict)

    covered = _checkpointed_trials(tmp_path / "checkpoints")  # trials a checkpoint of the killed run holds

    done = finish(args, tmp_path / "second.log")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "lock file" not in done.stdout  # no write lock outlived the killed process (Optuna's symlink lock did, 30 s)
    assert not list((tmp_path / "checkpoints").rglob("*.pt"))  # every array ended: no checkpoint is left

    study = optuna.load_study(study_name="killed", storage=open_storage(str(journal))[0])
    trials = study.get_trials(deepcopy=False)
    by_number = {t.number: t for t in trials}
    # nothing left hanging
    assert not [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    # what the killed run finished is kept as it was
    for number, old in finished.items():
        new = by_number[number]
        assert (new.state, new.values, new.params, new.intermediate_values) == (
            old.state,
            old.values,
            old.params,
            old.intermediate_values,
        )
    # what it was training is failed as interrupted, and its parameters trained again
    retried = [t for t in trials if t.number > max(before)]
    for number, old in killed.items():
        assert by_number[number].state == TrialState.FAIL
        assert by_number[number].user_attrs["fail_reason"].startswith("interrupted")
        again = [t for t in retried if t.params == old.params and t.state == TrialState.COMPLETE]
        assert again, f"trial {number} ({old.params}) was not retried"
        if number in covered:  # continued from the checkpoint: the epochs trained before the kill are kept, not redone
            assert again[0].user_attrs.get("resumed_from_epoch", 0) >= 1, again[0].user_attrs
            kept = {
                step: value for step, value in again[0].intermediate_values.items() if step in old.intermediate_values
            }
            assert kept == old.intermediate_values
    # the budget counts finished work only, exactly n_trials of it
    counted = [t for t in trials if not str(t.user_attrs.get("fail_reason", "")).startswith(NOT_COUNTED)]
    assert len(counted) == N_TRIALS, [(t.number, t.state.name, t.user_attrs.get("fail_reason")) for t in trials]
    assert all(t.state == TrialState.COMPLETE for t in counted)
    # the exported best config is whole and names the study's best trial
    exported = yaml.safe_load(config_path.read_text())
    assert isinstance(exported, dict)
    assert (out / "best_weights.pt").stat().st_size > 0
    assert set(out.glob(".*.tmp")) <= left_by_the_kill  # the re-run's own atomic writes all completed


@pytest.mark.parametrize(
    ("sent", "status", "line", "because"),
    [
        (signal.SIGINT, 130, "interrupted", "Ctrl-C (SIGINT) stopped its search"),
        # Slurm's time limit and scancel, docker stop, systemd, kill: handled as Ctrl-C is
        (signal.SIGTERM, 143, "terminated by SIGTERM", "SIGTERM stopped its search"),
    ],
    ids=["SIGINT", "SIGTERM"],
)
def test_search_stopped_by_ctrl_c_or_sigterm_leaves_nothing_running_and_the_next_run_trains_the_rest(
    tmp_path, sent, status, line, because
):
    space = tmp_path / "space.yaml"
    space.write_text(search_space())
    journal, out = tmp_path / "s.journal", tmp_path / "out"
    args = ["search", str(space), "--threads", "1", "--storage", str(journal), "--out", str(out), "--quiet"]
    studies, returncode = stop_where(args, tmp_path / "first.log", MID_SECOND_ARRAY, journal, sent=sent)
    stopped, printed = studies["killed"], (tmp_path / "first.log").read_text()
    assert returncode == status, printed[-2000:]
    assert line in printed.splitlines() and "Traceback" not in printed, printed[-2000:]
    assert not [t.number for t in stopped if t.state == TrialState.RUNNING]  # told at the stop, not left for a re-run
    interrupted = [t for t in stopped if t.user_attrs.get("outcome") == "interrupted"]
    assert interrupted and all(t.user_attrs["interrupted_because"] == because for t in interrupted)
    queued = [t for t in stopped if t.state == TrialState.WAITING]
    assert sorted(map(repr, (t.params for t in interrupted))) == sorted(
        map(repr, (t.system_attrs["fixed_params"] for t in queued))
    )  # each queued again with its parameters

    done = finish(args, tmp_path / "second.log")
    assert done.returncode == 0, done.stdout[-3000:]
    trials = optuna.load_study(study_name="killed", storage=open_storage(str(journal))[0]).get_trials(deepcopy=False)
    assert not [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    counted = [t for t in trials if t.user_attrs.get("outcome") in ("complete", "pruned", "failed")]
    assert len(counted) == N_TRIALS and all(t.state == TrialState.COMPLETE for t in counted)
    for old in interrupted:
        assert any(t.params == old.params and t.state == TrialState.COMPLETE for t in trials), old.number


# ----------------------------------------------------------------- stability
STABILITY_CONFIG = """\
model: mlp
model_config: {width: 16, depth: 1}
dataset: digits
optimizer: adam
hparams: {lr: 0.01}
epochs: 15
data: {batch_size: 32}
"""


def first_epoch(point: str, subject, **_) -> bool:
    """When the first array's first epoch has trained (any command)."""
    return point == "epoch"


def _sigterm_commands(tmp_path: Path) -> dict[str, list[str]]:
    """The commands a scheduler may stop, each writing into `tmp_path`."""
    config, pbt_space = tmp_path / "tiny.yaml", tmp_path / "pbt.yaml"
    config.write_text(STABILITY_CONFIG)
    pbt_space.write_text(
        tiny_space_text(
            study={"name": "pbt", "metrics": ["val_acc"]},
            pbt={"population": 4, "interval": 2, "explore": {"training.optimizer.lr": {"factors": [0.8, 1.25]}}},
            training={"epochs": 30, "optimizer": {"name": "adam", "lr": 1e-3}},
            params={"training.optimizer.lr": {"distribution": "log_uniform", "min": 1e-3, "max": 3e-2}},
        )
    )
    journal = ["--storage", str(tmp_path / "s.journal"), "--threads", "1"]
    return {
        "train": ["train", "--model", "mlp", "--dataset", "digits", "--seeds", "2", "--epochs", "30", "--threads", "1"],
        "stability": ["stability", str(config), "--seeds", "2", *journal, "--out", str(tmp_path / "report")],
        "pbt": ["search", str(pbt_space), *journal, "--out", str(tmp_path / "out"), "--quiet"],
    }


@pytest.mark.parametrize("command", ["train", "stability", "pbt"])
def test_sigterm_stops_every_command_in_one_line_with_status_143(tmp_path, command):
    """As Ctrl-C stops them (exit 130), the same command run again continues: stored seeds are
    reused, a PBT population is continued (the search's arrays are told and retried: the test above)."""
    args = _sigterm_commands(tmp_path)[command]
    journal, log = tmp_path / "s.journal", tmp_path / "first.log"
    studies, returncode = stop_where(args, log, f"{THIS_MODULE}:first_epoch", journal, sent=signal.SIGTERM)
    printed = log.read_text(errors="replace")
    assert returncode == 143, printed[-2000:]
    assert printed.splitlines()[-1] == "terminated by SIGTERM" and "Traceback" not in printed, printed[-2000:]
    if command == "pbt":  # as on Ctrl-C, its members wait for the next run (which continues or replaces them)
        assert {t.state for t in studies["pbt"]} == {TrialState.RUNNING}


_ARRAYS_CHECKPOINTED: set[Path] = set()


def second_array_checkpointed(point: str, checkpointer, **_) -> bool:
    """After a checkpoint is written: the second array's (each array has its own file)."""
    if point == "checkpoint":
        _ARRAYS_CHECKPOINTED.add(checkpointer.path)
    return len(_ARRAYS_CHECKPOINTED) >= 2


def test_stability_killed_mid_run_reuses_the_stored_seeds_and_completes_the_report(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(STABILITY_CONFIG)
    journal, out = tmp_path / "s.journal", tmp_path / "report"
    args = [
        "stability",
        str(config),
        "--seeds",
        "4",
        "--array-size",
        "2",
        "--threads",
        "1",
        "--storage",
        str(journal),
        "--out",
        str(out),
        "--format",
        "csv,json",
        "--plot-format",
        "svg",
        "--json",
    ]

    # the first array of 2 seeds is stored once it has trained; kill once the second has
    # checkpointed an epoch (it saves one at every epoch's end)
    studies = stop_where(args, tmp_path / "first.log", f"{THIS_MODULE}:second_array_checkpointed", journal)[0]
    (study_name,) = [name for name in studies if name.startswith("stability:")]
    before = studies[study_name]
    assert len(before) == 2, "the kill came after the whole study was stored: nothing was left to resume"
    assert all(t.state.is_finished() for t in before)  # seeds are stored only when trained: never RUNNING

    done = finish(args, tmp_path / "second.log")
    assert done.returncode == 0, done.stdout[-3000:]
    summary = json.loads(done.stdout[done.stdout.index("{") :])
    assert summary["reused_seeds"] == 2
    assert [a["size"] for a in summary["arrays"]] == [2]  # only the missing seeds were trained
    assert summary["arrays"][0]["resumed_epoch"] >= 1  # ... from the killed array's last checkpointed epoch
    assert not list((tmp_path / "checkpoints").rglob("*.pt"))
    assert summary["configs"][0]["n"] == 4

    study = optuna.load_study(study_name=study_name, storage=open_storage(str(journal))[0])
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 4 and all(t.state == TrialState.COMPLETE for t in trials)
    assert sorted(t.user_attrs["seed_index"] for t in trials) == [0, 1, 2, 3]
    for old in before:  # reused, not retrained: the stored trial is unchanged and not added again
        new = trials[old.number]
        assert (new.value, new.user_attrs, new.datetime_complete) == (old.value, old.user_attrs, old.datetime_complete)

    # the report has every seed, the reused ones with their stored numbers
    seeds = [row for row in _csv_rows(out / "seeds.csv")]
    assert sorted(int(row["seed_index"]) for row in seeds) == [0, 1, 2, 3]
    stored = {t.user_attrs["seed_index"]: t.value for t in trials}
    assert all(float(row["test_acc"]) == stored[int(row["seed_index"])] for row in seeds)


def _csv_rows(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="") as stream:
        return list(csv.DictReader(stream))
