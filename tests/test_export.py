"""The exported best pair (weights and config) always belongs to the study's best trial:
a kill between the two writes, an older trial's config left behind, or a temporary
file a kill left are all repaired by the next run, even one with nothing left to train."""

from __future__ import annotations

import optuna
import torch
import yaml
from optuna.trial import TrialState

from tests.test_search import load_study, search, space_text

optuna.logging.set_verbosity(optuna.logging.WARNING)
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


def test_an_export_folder_that_turns_read_only_is_one_line_and_the_study_keeps_the_trials(tmp_path, monkeypatch):
    """A disk that fills up or turns read-only after training: the files cannot be written."""
    import errno

    import pytest

    from hfta_nas.errors import HftaNasError
    from hfta_nas.search import _export

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_export, "save_weights", full_disk)
    with pytest.raises(HftaNasError, match="cannot write the best trial's weights and config to .*No space left"):
        search(tmp_path, TEXT)
    trials = load_study(tmp_path).get_trials()
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    assert any(t.state == TrialState.COMPLETE for t in trials)  # told before its files were written
