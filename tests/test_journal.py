"""The default journal survives a write cut short: a torn last record (a full disk, a
kill mid-append) or a last record that lost only its newline must not make every later
command on the file fail, for every study in it."""

from __future__ import annotations

import logging

import optuna
import pytest
from click.testing import CliRunner

from hfta_nas.cli import main
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


def test_a_journal_cut_at_a_records_end_says_how_much_was_lost(tmp_path, caplog):
    """No sequence numbers in the journal: a cut between two records (a restored copy, a truncation)
    reads as a whole, shorter journal. hfta-nas recorded where it left the file, and says what the
    cut took (bytes and records), once; the search goes on from what is left."""
    assert run_search_command(tmp_path, 2).exit_code == 0
    journal = tmp_path / "study.journal"
    full = journal.read_bytes()
    lines = full.splitlines(keepends=True)
    kept = b"".join(lines[: len(lines) // 2])
    journal.write_bytes(kept)

    with caplog.at_level(logging.WARNING, logger="hfta_nas"):
        result = run_search_command(tmp_path, 4)
    assert result.exit_code == 0, result.output
    said = [r.getMessage() for r in caplog.records if "shorter than hfta-nas last wrote" in r.getMessage()]
    lost = len(lines) - len(lines) // 2
    assert said == [
        f"journal '{journal}' is {len(full) - len(kept)} bytes shorter than hfta-nas last wrote it: its last "
        f"{lost} record(s) were lost (cut off at a record's end: a restored copy, a truncation); the studies in "
        "it go on from what is left"
    ], caplog.text
    assert journal.read_bytes().startswith(kept) and not (tmp_path / "study.journal.torn").exists()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hfta_nas"):
        open_storage(str(journal))
    assert not caplog.records  # said once


def test_a_journal_cut_and_appended_to_again_says_records_were_replaced(tmp_path, caplog):
    """A cut that later appends made as long again is seen by the last record hfta-nas wrote."""
    journal = tmp_path / "study.journal"
    storage = open_storage(str(journal))[0]
    optuna.create_study(study_name="s", storage=storage).enqueue_trial({"x": 1.0})
    lines = journal.read_bytes().splitlines(keepends=True)
    assert b"1.0" in lines[-1]
    journal.write_bytes(b"".join(lines[:-1]) + lines[-1].replace(b"1.0", b"2.0"))  # as long, another record
    with caplog.at_level(logging.WARNING, logger="hfta_nas"):
        study = optuna.load_study(study_name="s", storage=open_storage(str(journal))[0])
    assert "was changed before the end hfta-nas last wrote" in caplog.text, caplog.text
    assert study.trials[0].system_attrs["fixed_params"] == {"x": 2.0}  # it goes on from what the file holds


def test_the_recorded_end_follows_every_append_of_several_writers(tmp_path):
    """Four writers (each its own open of the journal, as workers are) append at once; the recorded
    end is the file's size and line count, and a fresh open finds nothing lost."""
    import json
    import threading

    from hfta_nas.search._journal_end import check_end, end_file
    from hfta_nas.search._storage import _KernelFileLock

    journal = tmp_path / "study.journal"
    start = threading.Barrier(4)

    def write(index):
        storage = open_storage(str(journal))[0]
        start.wait()
        study = optuna.create_study(study_name=f"s{index}", storage=storage, load_if_exists=True)
        for value in range(20):
            study.enqueue_trial({"x": float(value)})

    writers = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    recorded = json.loads(end_file(journal).read_text())
    content = journal.read_bytes()
    assert recorded["size"] == len(content) and recorded["records"] == content.count(b"\n") > 4 * 20
    assert check_end(journal, _KernelFileLock(journal)) is None


def test_a_journal_deleted_to_start_afresh_is_not_taken_for_a_cut_one(tmp_path, caplog):
    journal = tmp_path / "study.journal"
    optuna.create_study(study_name="s", storage=open_storage(str(journal))[0]).enqueue_trial({"x": 1.0})
    journal.unlink()
    with caplog.at_level(logging.WARNING, logger="hfta_nas"):
        optuna.create_study(study_name="s", storage=open_storage(str(journal))[0])
    assert not caplog.records, caplog.text
