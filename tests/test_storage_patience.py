"""A storage that rides out outages (`PatientStorage`), on a fake clock: which errors are waited
out and which are raised at once, the back-off, the two lines about an outage, giving up past
the patience, a state write whose reply was lost, heartbeats judged only once the storage has
been back long enough, and the bad values of --storage-patience. A storage URL's password is
never shown: in errors, outage lines, hints, summaries and JSON it is ***."""

import errno
import logging
import sqlite3

import optuna
import pytest
import sqlalchemy.exc
import yaml
from click.testing import CliRunner
from optuna.storages import InMemoryStorage
from optuna.trial import TrialState

from hfta_nas import DEFAULT_STORAGE_PATIENCE_S, MAX_STORAGE_PATIENCE_S
from hfta_nas.cli import main
from hfta_nas.search import PatientStorage, StorageUnreachable, open_storage, patient
from hfta_nas.search._heartbeat import stale_reason
from hfta_nas.search._patience import MOST_DELAY_S, is_passing

optuna.logging.set_verbosity(optuna.logging.WARNING)


class FakeClock:
    """time.monotonic and time.sleep that only move when the storage sleeps."""

    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def refused():
    """What SQLAlchemy raises when a PostgreSQL server refuses the connection."""
    return sqlalchemy.exc.OperationalError("SELECT 1", {}, ConnectionRefusedError(111, "Connection refused"))


class Flaky(InMemoryStorage):
    """An in-memory storage whose calls fail with `error()` while `down` calls are left."""

    def __init__(self, down=0, error=refused):
        super().__init__()
        self.down, self.error, self.calls = down, error, 0

    def get_all_studies(self):
        self.calls += 1
        if self.down > 0:
            self.down -= 1
            raise self.error()
        return super().get_all_studies()


def patient_on(inner, patience=60.0):
    clock = FakeClock()
    return PatientStorage(inner, patience, sleep=clock.sleep, clock=clock), clock


def test_an_outage_is_waited_out_with_capped_backoff_and_two_lines(caplog):
    storage, clock = patient_on(Flaky(down=12), patience=600)
    with caplog.at_level(logging.WARNING, logger="hfta_nas"):
        assert storage.get_all_studies() == []
    assert storage.inner.calls == 13
    # each pause is the doubled delay (capped) times a jitter in [0.5, 1]
    delay = 0.25
    for pause in clock.sleeps:
        assert 0.5 * delay <= pause <= delay
        delay = min(2 * delay, MOST_DELAY_S)
    assert max(clock.sleeps) <= MOST_DELAY_S
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("storage unreachable since ") and "OperationalError" in lines[0]
    assert "retrying for up to 600 s" in lines[0]
    assert lines[1] == f"storage back after {clock.now:.0f} s"


def test_past_the_patience_it_stops_and_every_later_call_stops_at_once():
    storage, clock = patient_on(Flaky(down=10**6), patience=30)
    with pytest.raises(StorageUnreachable, match=r"storage unreachable for 30 s .*--storage-patience"):
        storage.get_all_studies()
    assert clock.now == pytest.approx(30)  # the last pause ends at the patience, never past it
    calls = storage.inner.calls
    with pytest.raises(StorageUnreachable):
        storage.get_all_studies()
    assert storage.inner.calls == calls  # given up: the storage is not tried again


@pytest.mark.parametrize(
    "error",
    [
        lambda: sqlalchemy.exc.IntegrityError("INSERT", {}, Exception("duplicate key")),
        lambda: sqlalchemy.exc.ProgrammingError("SELECT", {}, Exception("relation does not exist")),
        lambda: sqlalchemy.exc.OperationalError("SELECT", {}, sqlite3.OperationalError("no such table: trials")),
        lambda: OSError(errno.ENOSPC, "No space left on device"),
        lambda: KeyError("no study"),
    ],
    ids=["constraint", "schema", "sqlite-no-table", "full-disk", "key"],
)
def test_real_errors_are_raised_at_once(error):
    storage, clock = patient_on(Flaky(down=1, error=error))
    with pytest.raises(type(error())):
        storage.get_all_studies()
    assert clock.sleeps == [] and storage.inner.calls == 1


@pytest.mark.parametrize(
    "error",
    [
        refused,
        lambda: sqlalchemy.exc.OperationalError("SELECT", {}, sqlite3.OperationalError("database is locked")),
        lambda: sqlalchemy.exc.InterfaceError("SELECT", {}, Exception("connection already closed")),
        lambda: OSError(errno.ESTALE, "Stale file handle"),
        lambda: ConnectionResetError(104, "Connection reset by peer"),
    ],
    ids=["refused", "sqlite-locked", "closed", "stale-nfs", "reset"],
)
def test_connection_errors_are_passing_also_when_optuna_wraps_them(error):
    assert is_passing(error())
    try:
        try:
            raise error()
        except Exception as inner:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit") from inner
    except optuna.exceptions.StorageInternalError as wrapped:
        assert is_passing(wrapped)


def test_a_finished_state_whose_reply_was_lost_is_not_an_error():
    """The server applied the COMPLETE, then the connection dropped before its reply: the retry
    finds the trial finished as asked, and that is success, not UpdateFinishedTrialError."""

    class LostReply(InMemoryStorage):
        lost = 1

        def set_trial_state_values(self, trial_id, state, values=None):
            applied = super().set_trial_state_values(trial_id, state, values)
            if self.lost:
                self.lost -= 1
                raise refused()
            return applied

    storage, _ = patient_on(LostReply())
    study = optuna.create_study(storage=storage)
    trial = study.ask()
    study.tell(trial, 0.5)
    assert study.trials[0].state == TrialState.COMPLETE and study.trials[0].value == 0.5
    other = study.ask()
    storage.inner.lost = 0
    study.tell(other, 0.1)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):  # a real second tell is still refused
        storage.set_trial_state_values(other._trial_id, TrialState.COMPLETE, [0.2])


def test_a_study_runs_through_a_patient_storage_and_its_engine_stays_reachable(tmp_path):
    url = f"sqlite:///{tmp_path / 'p.db'}"
    storage, location = open_storage(url, patience=5)
    assert isinstance(storage, PatientStorage) and location == url
    assert storage._backend.engine.dialect.name == "sqlite"  # read through to the wrapped storage
    study = optuna.create_study(storage=storage, study_name="s")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    assert len(optuna.load_study(study_name="s", storage=url).trials) == 3
    assert isinstance(patient(url, 10), PatientStorage)


def test_heartbeats_are_not_judged_until_the_storage_has_been_back_long_enough():
    """After an outage every heartbeat is as old as the outage: a worker that has just got the
    storage back must not take over trials whose workers have not had their next retry yet."""
    study = optuna.create_study()
    trial = study.ask()
    study.set_user_attr("x", 1)
    study._storage.set_trial_user_attr(trial._trial_id, "heartbeat", 1000.0)
    frozen = study._storage.get_trial(trial._trial_id)
    now, interval = 1100.0, 10.0  # 100 s without a heartbeat, grace 30 s
    assert stale_reason(frozen, now=now, interval=interval) is not None
    assert stale_reason(frozen, now=now, interval=interval, connected_for=5.0) is None
    assert stale_reason(frozen, now=now, interval=interval, connected_for=30 + MOST_DELAY_S) is None
    assert stale_reason(frozen, now=now, interval=interval, connected_for=31 + MOST_DELAY_S) is not None


def test_connected_for_counts_from_the_opening_and_from_the_end_of_the_last_outage():
    """A worker that has just opened the storage may have missed an outage that ended a moment
    before: it waits as one just back from an outage does."""
    storage, clock = patient_on(Flaky(down=3))
    assert storage.connected_for() == 0.0
    clock.now += 100
    assert storage.connected_for() == pytest.approx(100.0)
    storage.get_all_studies()
    assert storage.connected_for() == 0.0
    clock.now += 7
    assert storage.connected_for() == pytest.approx(7.0)


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "1e12", str(MAX_STORAGE_PATIENCE_S + 1)])
def test_bad_storage_patience_is_one_line_and_stores_nothing(tmp_path, value):
    journal = tmp_path / "s.journal"
    result = CliRunner().invoke(
        main, ["search", "search_spaces/mnist1d_mlp.yaml", "--storage", str(journal), "--storage-patience", value]
    )
    assert result.exit_code == 2, result.output
    assert result.output.strip().count("\n") == 0 and "storage patience must be a number of seconds" in result.output
    assert not journal.exists()


@pytest.mark.parametrize("value", ["-3", ".nan", "1e9"])
def test_bad_storage_patience_in_the_space_is_refused_at_its_key(tmp_path, value):
    journal = tmp_path / "s.journal"
    result = CliRunner().invoke(
        main,
        [
            "search",
            "search_spaces/mnist1d_mlp.yaml",
            "--storage",
            str(journal),
            "--set",
            f"study.storage_patience={value}",
        ],
    )
    assert result.exit_code == 2, result.output
    assert "study.storage_patience" in result.output and result.output.strip().count("\n") == 0
    assert not journal.exists()


def test_the_default_patience_is_ten_minutes_for_a_space_and_for_open_storage(tmp_path):
    from hfta_nas.search_spaces import load_space

    assert DEFAULT_STORAGE_PATIENCE_S == 600
    assert load_space("search_spaces/mnist1d_mlp.yaml").study.storage_patience == 600
    assert open_storage(str(tmp_path / "d.journal"))[0].outage.patience == 600


# --------------------------------------------------- a storage URL's password is never shown
SECRET = "s3cret-Pa55"
UNREACHABLE_WITH_PASSWORD = f"postgresql://nobody:{SECRET}@127.0.0.1:1/x"  # port 1: refused at once


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://user:{SECRET}@db:5432/hfta",
        f"postgresql+psycopg://user:{SECRET}%40x/y@db/hfta",  # an encoded '@' and a '/' in the password
        f"mysql://root:{SECRET}@localhost/x?charset=utf8",
        f"redis://:{SECRET}@host:6379/0",
        "postgresql://user@db/hfta",  # nothing to mask
        "sqlite:////tmp/study.db",
    ],
)
def test_a_url_is_shown_as_sqlalchemy_shows_it_without_its_password(url):
    from sqlalchemy.engine import make_url

    from hfta_nas.search._credentials import hide_passwords

    assert hide_passwords(url) == make_url(url).render_as_string(hide_password=True)
    assert SECRET not in hide_passwords(f"cannot open storage '{url}': refused (host=db password={SECRET})")


@pytest.mark.parametrize(
    "command",
    [
        ["search", "search_spaces/mnist1d_mlp.yaml"],
        ["search", "search_spaces/mnist1d_mlp.yaml", "--dry-run"],
        ["search", "search_spaces/mnist1d_mlp.yaml", "--workers", "2"],
        ["stability", "stability/configs/mnist1d_cnn.yaml", "--seeds", "2"],
        ["dashboard"],
        ["storage-proxy"],
    ],
    ids=lambda command: " ".join(command[:1] + [a for a in command if a.startswith("--")]),
)
def test_an_unreachable_storage_is_one_line_with_its_password_masked(command):
    """What lands in a Slurm log: the URL is named, its password is not."""
    result = CliRunner().invoke(main, [*command, "--storage", UNREACHABLE_WITH_PASSWORD])
    assert result.exit_code == 2, result.output
    assert SECRET not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "'postgresql://nobody:***@127.0.0.1:1/x'" in errors[0], result.output
    assert "Traceback" not in result.output


def test_an_outage_is_logged_and_ends_without_the_password_a_driver_quotes(caplog):
    def quoting_the_url():
        return sqlalchemy.exc.OperationalError(
            "SELECT 1", {}, ConnectionRefusedError(111, f"connection to {UNREACHABLE_WITH_PASSWORD} refused")
        )

    storage, _ = patient_on(Flaky(down=1000, error=quoting_the_url), patience=5)
    with caplog.at_level(logging.WARNING, logger="hfta_nas"), pytest.raises(StorageUnreachable) as stopped:
        storage.get_all_studies()
    said = [record.getMessage() for record in caplog.records] + [str(stopped.value)]
    assert all(SECRET not in line and "nobody:***@" in line for line in said), said


@pytest.mark.slow
def test_summaries_hints_and_json_name_a_database_without_its_password(tmp_path, postgres):
    """A real search, dry run and stability study on a throwaway PostgreSQL (trust auth: any
    password is accepted), asked for JSON: the storage is named everywhere, its password nowhere."""
    url = postgres.url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@")
    shown = "postgres:***@127.0.0.1"  # (the search names the URL it connected with: driver and timeouts added)
    space, config = tmp_path / "space.yaml", tmp_path / "tiny.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "study": {"name": "masked", "metrics": ["val_acc"]},
                "budget": {"n_trials": 2},
                "data": {"dataset": "digits", "batch_size": 64},
                "training": {"epochs": 1, "optimizer": {"name": "adam", "lr": 1e-3}},
                "model": {"family": "mlp", "config": {"depth": 1, "width": 16}},
                "params": {"training.optimizer.lr": {"distribution": "log_uniform", "min": 1e-3, "max": 3e-2}},
            }
        )
    )
    config.write_text(
        "model: mlp\nmodel_config: {width: 16, depth: 1}\ndataset: digits\noptimizer: adam\nhparams: {lr: 0.01}\n"
        "epochs: 1\ndata: {batch_size: 32}\n"
    )
    runs = {
        "search": ["search", str(space), "--out", str(tmp_path / "out"), "--threads", "1", "--json"],
        "dry run": ["search", str(space), "--dry-run", "--json"],
        "search summary": ["search", str(space), "--n-more", "1", "--threads", "1"],
        "stability": ["stability", str(config), "--seeds", "2", "--threads", "1", "--out", str(tmp_path / "r")],
    }
    for name, args in runs.items():
        result = CliRunner().invoke(main, [*args, "--storage", url])
        assert result.exit_code == 0, (name, result.output[-3000:])
        assert SECRET not in result.output and shown in result.output, (name, result.output[-3000:])
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
