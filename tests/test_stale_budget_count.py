"""A trial asked on a stale count of the budget never trains past it.

Workers count the budget, then ask, under the study lock. On PostgreSQL that lock is a session's
advisory lock, and a database crash ends every session: a worker that counted just before the
crash asks just after it, while another worker, which was waiting for the lock, takes it and counts
the same free place. (The chaos benchmark's database-restart round once ended with 7 trials
complete of a budget of 6.) The later of such trials is refused as surplus when its slot starts."""

import threading

import optuna
import pytest
from optuna.trial import TrialState

from hfta_nas.search import open_storage
from hfta_nas.search._ledger import Ledger, Outcome
from hfta_nas.search._storage import study_lock
from hfta_nas.search_spaces import parse_space, run_search
from tests._rendezvous import GUARD_S
from tests.test_workers import assert_study_ended, space_text

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_a_trial_asked_on_a_stale_count_is_refused_as_surplus(tmp_path, monkeypatch):
    """The first time the budget is full, the count says one place is left (as a count made before
    a crash does): the search asks one trial too many, which fails as surplus, never trained; the
    study ends with exactly its budget counted."""
    space, journal = tmp_path / "space.yaml", tmp_path / "study.journal"
    space.write_text(space_text(n_trials=4, epochs=2))
    remaining, stale = Ledger.remaining, []

    def one_stale_count(self):
        left = remaining(self)
        if left == 0 and not stale:
            stale.append(True)
            return 1
        return left

    monkeypatch.setattr(Ledger, "remaining", one_stale_count)
    run_search(parse_space(space.read_text(), source=str(space)), storage=str(journal), out_dir=tmp_path / "out")
    trials = optuna.load_study(study_name="workers", storage=open_storage(str(journal))[0]).get_trials(deepcopy=False)
    assert stale and len(trials) == 5
    assert_study_ended(trials, 4)
    [extra] = [t for t in trials if t.state == TrialState.FAIL]
    assert extra.number == 4 and extra.user_attrs["outcome"] == Outcome.SURPLUS.value, extra.user_attrs
    assert "train_start" not in extra.user_attrs


@pytest.mark.slow
def test_a_database_crash_frees_the_study_lock_and_the_later_ask_past_the_budget_is_refused(postgres):
    """Worker A holds the study lock and has counted one free place when the server crashes;
    worker B, waiting for the lock, gets it once the server is back and asks that place; then A
    asks it too. The budget is overdrawn by one, and exactly the later trial is past it."""
    url, name, n_trials = postgres.url, "crashed", 3
    first, second = (
        optuna.create_study(study_name=name, storage=open_storage(url)[0], load_if_exists=True) for _ in "ab"
    )
    for _ in range(n_trials - 1):  # all places but one taken
        first.ask()
    ledger_a = Ledger(first, n_trials, study_lock(open_storage(url)[0], url, name))
    ledger_b = Ledger(second, n_trials, study_lock(open_storage(url)[0], url, name))
    asked_by_b: list[optuna.Trial] = []

    def worker_b():
        with ledger_b.lock:
            if ledger_b.remaining() > 0:
                asked_by_b.append(second.ask())

    with ledger_a.lock:
        assert ledger_a.remaining() == 1
        waiting = threading.Thread(target=worker_b, daemon=True)
        waiting.start()
        postgres.stop(mode="immediate")  # a crash: every session, and the advisory lock A held, ends
        postgres.start()
        waiting.join(GUARD_S)
        assert asked_by_b, "worker B did not ask while A held the study lock (the lock survived the crash?)"
        asked_by_a = first.ask()
    running = first.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    assert len(running) == n_trials + 1
    assert not ledger_a.beyond_budget(asked_by_b[0])
    assert ledger_a.beyond_budget(asked_by_a)
