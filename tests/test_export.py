"""The exported best pair (weights and config) always belongs to the study's best trial:
a kill between the two writes, an older trial's config left behind, or a temporary
file a kill left are all repaired by the next run, even one with nothing left to train.
A pair that cannot be written (a full disk) fails no trial and ends the run in one line."""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import optuna
import pytest
import torch
import yaml
from optuna.trial import TrialState

from tests._rendezvous import GUARD_S
from tests.test_search import load_study, search, space_text

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parents[1]
TEXT = space_text(
    budget={"n_trials": 4}, array={"size": 2}, training={"epochs": 1, "optimizer": {"name": "adam", "lr": 1e-3}}
)


def best_number(tmp_path) -> int:
    done = load_study(tmp_path).get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return min(done, key=lambda t: (-t.values[0], t.number)).number


def published(out) -> tuple[int, dict]:
    config = yaml.safe_load((out / "best_config.yaml").read_text())
    return config["origin"]["trial"], torch.load(out / "best_weights.pt")


def test_the_published_pair_is_the_study_best_and_only_it_is_staged(tmp_path):
    summary = search(tmp_path, TEXT)
    out = tmp_path / "out"
    number, weights = published(out)
    assert number == best_number(tmp_path)
    assert summary.exported == {"weights": str(out / "best_weights.pt"), "config": str(out / "best_config.yaml")}
    assert sorted(p.name for p in (out / ".trials").iterdir()) == [f"{number}.pt", f"{number}.yaml"]
    assert (out / ".trials" / f"{number}.pt").read_bytes() == (out / "best_weights.pt").read_bytes()
    assert not list(out.glob(".*.tmp"))


def test_a_rerun_with_nothing_to_train_repairs_a_mixed_pair_and_strays(tmp_path):
    search(tmp_path, TEXT)
    out = tmp_path / "out"
    number, _ = published(out)
    good_weights, good_config = (out / "best_weights.pt").read_bytes(), (out / "best_config.yaml").read_bytes()
    # as a kill between the two writes of a later export would leave them: new weights, another trial's config
    (out / "best_weights.pt").write_bytes(b"weights of a trial that was never the best")
    other = yaml.safe_load(good_config)
    other["origin"]["trial"] = number + 1
    (out / "best_config.yaml").write_text(yaml.safe_dump(other))
    (out / ".best_weights.pt.abc123.tmp").write_bytes(b"half a file")
    (out / ".trials" / "99.pt").write_bytes(b"a staged trial that is not the best")

    search(tmp_path, TEXT)  # the budget is spent: nothing trains, the export is repaired
    assert (out / "best_weights.pt").read_bytes() == good_weights
    assert (out / "best_config.yaml").read_bytes() == good_config
    assert not list(out.glob(".*.tmp")) and not (out / ".trials" / "99.pt").exists()
    assert len(load_study(tmp_path).get_trials()) == 4


def test_a_better_trial_from_another_run_replaces_the_pair(tmp_path):
    search(tmp_path, TEXT)
    out = tmp_path / "out"
    study = load_study(tmp_path)
    best = study.best_trial
    # a trial told COMPLETE elsewhere (another worker) with a better value and staged files
    better = optuna.trial.create_trial(params=best.params, distributions=best.distributions, value=best.value + 1.0)
    study.add_trial(better)
    number = max(t.number for t in study.get_trials())
    (out / ".trials" / f"{number}.pt").write_bytes((out / "best_weights.pt").read_bytes())
    config = yaml.safe_load((out / "best_config.yaml").read_text())
    config["origin"]["trial"] = number
    (out / ".trials" / f"{number}.yaml").write_text(yaml.safe_dump(config))

    search(tmp_path, TEXT, n_trials=5)
    assert published(out)[0] == best_number(tmp_path) == number
    assert sorted(p.name for p in (out / ".trials").iterdir()) == [f"{number}.pt", f"{number}.yaml"]


def test_a_best_trial_whose_weights_were_never_written_is_named_not_hidden(tmp_path):
    """The study's best trial ended in a run that could not write its weights (a full disk): the
    next run, with nothing to train, keeps the older pair but says whose it is and which trial
    has none, where it used to print the older pair as the best's."""
    search(tmp_path, TEXT)
    out, study = tmp_path / "out", load_study(tmp_path)
    older, _ = published(out)
    best = study.best_trial
    better = optuna.trial.create_trial(params=best.params, distributions=best.distributions, value=best.value + 1.0)
    study.add_trial(better)  # told COMPLETE by a run whose weights never reached the disk: nothing staged
    number = max(t.number for t in study.get_trials())

    summary = search(tmp_path, TEXT, n_trials=5)
    assert published(out)[0] == older
    assert summary.unsaved_best == (
        f"trial {number}, the study's best, has no weights saved here (its run could not write them, wrote "
        f"them under another --out, or is still writing them); the files in '{out}' are trial {older}'s"
    )


def test_a_trial_taken_over_while_its_worker_was_paused_is_not_told_twice(tmp_path):
    """A worker paused past the heartbeat grace finds its trial failed and retried by another
    worker (here: failed from outside after the first epoch); its slot stops, the search goes on."""
    from hfta_nas.search import EpochEnded, open_storage

    text = space_text(
        budget={"n_trials": 2}, array={"size": 2}, training={"epochs": 3, "optimizer": {"name": "adam", "lr": 1e-3}}
    )
    taken: list[int] = []

    def take_over(event):
        if isinstance(event, EpochEnded) and event.epoch == 1 and not taken:
            storage = open_storage(str(tmp_path / "study.journal"))[0]
            study = optuna.load_study(study_name="tiny", storage=storage)
            trial = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))[0]
            storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
            taken.append(trial.number)

    search(tmp_path, text, on_event=take_over)
    trials = {t.number: t for t in load_study(tmp_path).get_trials()}
    assert taken and trials[taken[0]].state == TrialState.FAIL
    assert len(trials[taken[0]].intermediate_values) == 1  # nothing reported after it was taken
    others = [t for n, t in trials.items() if n != taken[0]]
    assert others and all(t.state == TrialState.COMPLETE for t in others)


def test_an_export_that_fails_with_any_error_fails_no_trial_and_ends_in_one_line(tmp_path, monkeypatch):
    """A write that fails with an error of any type (torch's zip writer says a full disk with a
    RuntimeError): every trial is still trained and told COMPLETE, and the run ends with one
    HftaNasError (the CLI's one line, exit 2) once the trials are told."""
    from hfta_nas.errors import HftaNasError
    from hfta_nas.search import _export

    def torn_write(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(_export, "save_weights", torn_write)
    with pytest.raises(HftaNasError, match="cannot write the best trial's weights and config to .*RuntimeError"):
        search(tmp_path, TEXT)
    trials = load_study(tmp_path).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4, [t.user_attrs.get("fail_reason") for t in trials]


WIDE = space_text(  # weights of ~150 KB each: more than the small disk below holds
    budget={"n_trials": 4},
    array={"size": 2},
    training={"epochs": 2, "optimizer": {"name": "adam", "lr": 1e-3}},
    params={"training.optimizer.lr": {"distribution": "log_uniform", "min": 1e-3, "max": 3e-2}},
    model={"family": "mlp", "config": {"depth": 1, "width": 512}},
)


@contextlib.contextmanager
def small_disk(folder: Path) -> Iterator[Callable[[], None] | None]:
    """`folder` on a real 48 KiB tmpfs (mounting needs root), yielding None; where it cannot be
    mounted, a limit on the size of any file the command writes (RLIMIT_FSIZE: a write past it
    fails with EFBIG), yielding the function that sets it in the command's process."""
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        yield lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        return
    try:
        yield None
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_full_disk_under_out_loses_no_trained_trial_and_says_so_in_one_line(tmp_path):
    """`--out` on a disk too small for the best weights: torch's zip writer failed with a
    RuntimeError, which failed the whole array (its trained trials FAIL and counted) and
    exited 0. Now every trial is told COMPLETE, and the command ends with one line naming the
    full disk and exit status 2."""
    space, journal = tmp_path / "space.yaml", tmp_path / "study.journal"
    space.write_text(WIDE)
    command = [sys.executable, str(ROOT / "cli.py"), "search", str(space), "--storage", str(journal)]
    with small_disk(tmp_path / "out") as limit:
        done = subprocess.run(
            [*command, "--out", str(tmp_path / "out"), "--threads", "1", "--quiet"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT), "HFTA_NAS_CHECKPOINT": "off"},
            preexec_fn=limit,
            capture_output=True,
            text=True,
            timeout=GUARD_S,
        )
    printed = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in printed, printed[-3000:]
    errors = [line for line in printed.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "cannot write the best trial's weights" in errors[0], printed[-3000:]
    if limit is None:
        assert "no space left on the device (disk full)" in errors[0]
    trials = load_study(tmp_path).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4, [t.user_attrs.get("fail_reason") for t in trials]


def test_a_pbt_run_whose_out_is_full_tells_every_member_and_the_next_run_writes_the_files(tmp_path):
    """The population's best weights cannot be written: its members are told COMPLETE, one line
    and exit 2 (a traceback before), and the checkpoint is kept, from which the same command run
    again, with space, writes them."""
    space, journal = tmp_path / "pbt.yaml", tmp_path / "study.journal"
    space.write_text(
        space_text(
            study={"name": "pbt", "metrics": ["val_acc"]},
            pbt={"population": 4, "interval": 2, "explore": {"training.optimizer.lr": {"factors": [0.8, 1.25]}}},
            training={"epochs": 4, "optimizer": {"name": "adam", "lr": 1e-3}},
            model={"family": "mlp", "config": {"depth": 1, "width": 512}},
            params={"training.optimizer.lr": {"distribution": "log_uniform", "min": 1e-3, "max": 3e-2}},
        )
    )
    command = [sys.executable, str(ROOT / "cli.py"), "search", str(space), "--storage", str(journal), "--threads", "1"]
    run = dict(cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    with small_disk(tmp_path / "out") as limit:
        if limit is not None:
            pytest.skip("needs a small disk for --out alone: the PBT checkpoint is larger than the file limit")
        done = subprocess.run([*command, "--out", str(tmp_path / "out")], **run, timeout=GUARD_S)
    printed = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in printed, printed[-3000:]
    errors = [line for line in printed.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "weights and config" in errors[0] and "(disk full)" in errors[0], printed[-3000:]
    members = load_study(tmp_path, "pbt").get_trials()
    assert [t.state for t in members] == [TrialState.COMPLETE] * 4

    again = subprocess.run([*command, "--out", str(tmp_path / "out")], **run, timeout=GUARD_S)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    best = max(members, key=lambda t: (t.value, -t.number))
    assert published(tmp_path / "out")[0] == best.number
