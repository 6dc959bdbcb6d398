"""The default journal survives a write cut short: a torn last record (a full disk, a
kill mid-append) or a last record that lost only its newline must not make every later
command on the file fail, for every study in it."""

from __future__ import annotations

import logging

import optuna
import pytest
from click.testing import CliRunner

from cli import main
from hfta_nas.search import open_storage
from tests.test_search import space_text

optuna.logging.set_verbosity(optuna.logging.WARNING)
TINY = {
    "budget": {"n_trials": 2},
    "array": {"size": 2},
    "training": {"epochs": 1, "optimizer": {"name": "adam", "lr": 1e-3}},
}


def run_search_command(folder, n_trials):
    space = folder / "space.yaml"
    space.write_text(space_text(**TINY))
    return CliRunner().invoke(
        main,
        [
            "search",
            str(space),
            "--storage",
            str(folder / "study.journal"),
            "--out",
            str(folder / "out"),
            "--n-trials",
            str(n_trials),
            "--threads",
            "1",
            "--quiet",
        ],
    )


def trials(journal):
    study = optuna.load_study(study_name="tiny", storage=open_storage(str(journal))[0])
    return study.get_trials(deepcopy=False)


@pytest.mark.parametrize("cut", ["torn record", "lost newline"])
def test_search_continues_on_a_journal_cut_mid_write(tmp_path, cut, caplog):
    assert run_search_command(tmp_path, 2).exit_code == 0
    journal = tmp_path / "study.journal"
    whole = journal.read_bytes()
    before = [(t.number, t.state, t.params) for t in trials(journal)]
    other = optuna.create_study(study_name="other", storage=open_storage(str(journal))[0])
    other.enqueue_trial({"x": 0.5})
    full = journal.read_bytes()
    journal.write_bytes(full[:-25] if cut == "torn record" else full[:-1])

    with caplog.at_level(logging.WARNING, logger="hfta_nas"):
        result = run_search_command(tmp_path, 4)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    after = trials(journal)
    assert [(t.number, t.state, t.params) for t in after[:2]] == before  # what was stored is kept
    assert len(after) == 4 and all(t.state.is_finished() for t in after)
    assert journal.read_bytes().startswith(whole)
    assert optuna.load_study(study_name="other", storage=open_storage(str(journal))[0])  # the other study reads too
    torn = tmp_path / "study.journal.torn"
    if cut == "torn record":  # the cut-off bytes are kept aside, and said so
        kept = torn.read_bytes().rstrip(b"\n")
        assert kept and b"\n" not in kept and full[:-25].endswith(kept)
        assert "cut off mid-write" in caplog.text and str(torn) in caplog.text
    else:
        assert not torn.exists() and "lost its newline; restored" in caplog.text


def test_torn_record_is_the_cut_prefix_of_the_last_record(tmp_path):
    journal = tmp_path / "study.journal"
    storage = open_storage(str(journal))[0]
    optuna.create_study(study_name="s", storage=storage).enqueue_trial({"x": 1.0})
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:-1]) + lines[-1][:10])
    open_storage(str(journal))
    assert journal.read_bytes() == b"".join(lines[:-1])
    assert (tmp_path / "study.journal.torn").read_bytes() == lines[-1][:10] + b"\n"
    assert open_storage(str(journal))[0] is not None  # a second open finds nothing to mend
    assert (tmp_path / "study.journal.torn").read_bytes() == lines[-1][:10] + b"\n"
