"""Searches on a PostgreSQL server that goes away: stopped mid-search for longer than the heartbeat
grace (two workers wait it out, nothing is taken over, the budget is exact), gone for longer than
the patience (one line, exit 2, a re-run finishes the study), and one worker cut off from it by a
network partition (the other takes its trials over; its late results are dropped, never counted
twice). Workers hold mid-array on a rendezvous while the fault is made; the outage's length is the
fault itself, not a wait for something to happen."""

import importlib.util
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hfta_nas.search import open_storage
from hfta_nas.search._ledger import RETRY_OF
from tests._rendezvous import GUARD_S, Rendezvous, held_command, wait_for
from tests._tcp_link import CuttableLink
from tests.test_workers import ROOT, assert_study_ended, counted, hfta_nas_command, pid_of, space_text, worker_env

optuna.logging.set_verbosity(optuna.logging.WARNING)


def mid_array(point, trial, step=None):
    """At a trial's report of an epoch before the last (of 6): its worker is mid-array."""
    return point == "report" and step < 6


def search_command(space, storage, name, out, *extra):
    return held_command(
        "search", str(space), "--threads", "1", "--storage", storage, "--study-name", name, "--out", str(out), *extra
    )


def start(argv, log_path, env):
    with open(log_path, "w") as log:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def finish(processes):
    """Each process's exit status (a guard against a hang, not a pass condition)."""
    codes = []
    for process in processes:
        try:
            codes.append(process.wait(timeout=GUARD_S))
        except subprocess.TimeoutExpired:
            process.kill()
            codes.append(process.wait())
    return codes


def stored_trials(url, name):
    return optuna.load_study(study_name=name, storage=open_storage(url)[0]).get_trials(deepcopy=False)


def interrupted(trials):
    return [t for t in trials if str(t.user_attrs.get("fail_reason", "")).startswith("interrupted")]


def logs(tmp_path):
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(tmp_path.glob("*.log")))


@pytest.mark.slow
def test_a_database_stopped_mid_search_is_waited_out_by_two_workers(tmp_path, postgres):
    """The issue's run: the server stopped while two workers train, for longer than the heartbeat
    grace (2 s beats, 6 s grace, a 10 s outage), then started again. Both workers wait, go on, and
    finish; the budget is exact, nothing is RUNNING, and no trial was taken over."""
    n_trials, name = 6, "outage"
    space = tmp_path / "space.yaml"
    space.write_text(space_text(n_trials=n_trials, epochs=6, name=name))
    meeting = Rendezvous(tmp_path / "rendezvous")
    env = worker_env(HFTA_NAS_HEARTBEAT="2", **meeting.env(f"tests.{Path(__file__).stem}:mid_array"))
    argv = search_command(space, postgres.url, name, tmp_path / "out", "--storage-patience", "300")
    processes = [start(argv, tmp_path / f"worker{i}.log", env) for i in range(2)]
    try:
        meeting.wait(1, processes)  # one worker holds mid-array; the other trains on
        postgres.stop()
        meeting.release()
        time.sleep(10)  # the outage itself
        postgres.start()
        codes = finish(processes)
    finally:
        meeting.close()
    output = logs(tmp_path)
    assert codes == [0, 0], output
    assert "storage unreachable since" in output and "storage back after" in output, output
    assert "Traceback" not in output, output
    trials = stored_trials(postgres.url, name)
    assert_study_ended(trials, n_trials)
    assert not interrupted(trials), [t.user_attrs.get("interrupted_because") for t in interrupted(trials)]


@pytest.mark.slow
def test_a_database_gone_past_the_patience_stops_in_one_line_and_a_rerun_finishes(tmp_path, postgres):
    n_trials, name = 4, "patience"
    space = tmp_path / "space.yaml"
    space.write_text(space_text(n_trials=n_trials, epochs=6, name=name))
    meeting = Rendezvous(tmp_path / "rendezvous")
    env = worker_env(**meeting.env(f"tests.{Path(__file__).stem}:mid_array"))
    argv = search_command(space, postgres.url, name, tmp_path / "out", "--storage-patience", "2", "--quiet")
    [worker] = [start(argv, tmp_path / "worker.log", env)]
    try:
        meeting.wait(1, [worker])
        held = [t.number for t in stored_trials(postgres.url, name) if t.state == TrialState.RUNNING]
        postgres.stop()
        meeting.release()
        [code] = finish([worker])
    finally:
        meeting.close()
    output = (tmp_path / "worker.log").read_text()
    assert code == 2, output
    assert "Traceback" not in output, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: storage unreachable for 2 s") and "retried when the study is run again" in last

    postgres.start()
    rerun = subprocess.run(
        search_command(space, postgres.url, name, tmp_path / "out", "--quiet"),
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    trials = stored_trials(postgres.url, name)
    assert_study_ended(trials, n_trials)
    assert held and {t.number for t in interrupted(trials)} >= set(held)  # the stopped worker's, retried
    for number in held:
        assert any(t.user_attrs.get(RETRY_OF) == number for t in counted(trials)), number


@pytest.mark.slow
def test_a_worker_cut_off_past_the_grace_loses_its_trials_and_its_late_results_are_dropped(tmp_path, postgres):
    """Worker A reaches the database through a link that is cut while A is mid-array; worker B,
    directly connected, sees A's heartbeats stop, fails A's trials as interrupted and retrains
    them. When the link heals, A's next reports find its trials taken over: they are dropped, A
    ends cleanly, and no parameter set is counted twice."""
    n_trials, name = 6, "partition"
    space = tmp_path / "space.yaml"
    space.write_text(space_text(n_trials=n_trials, epochs=6, name=name))
    host, port = postgres.url.rsplit("@", 1)[1].split("/", 1)[0].split(":")
    link = CuttableLink((host, int(port)))
    via_link = postgres.url.replace(f":{port}/", f":{link.port}/")
    meeting = Rendezvous(tmp_path / "rendezvous")
    a_env = worker_env(HFTA_NAS_HEARTBEAT="1", **meeting.env(f"tests.{Path(__file__).stem}:mid_array"))
    out = tmp_path / "out"
    a = start(search_command(space, via_link, name, out, "--storage-patience", "300"), tmp_path / "a.log", a_env)
    processes = [a]
    try:
        meeting.wait(1, [a])
        held = [t.number for t in stored_trials(postgres.url, name) if t.state == TrialState.RUNNING]
        link.cut()
        meeting.release()
        b_env = worker_env(HFTA_NAS_HEARTBEAT="1")
        processes.append(start(search_command(space, postgres.url, name, out), tmp_path / "b.log", b_env))
        wait_for(
            lambda: {t.number for t in interrupted(stored_trials(postgres.url, name))} >= set(held),
            "B takes over A's trials",
        )
        link.heal()
        codes = finish(processes)
    finally:
        meeting.close()
        link.close()
    output = logs(tmp_path)
    assert codes == [0, 0], output
    assert "Traceback" not in output and "UpdateFinishedTrialError" not in output, output
    trials = stored_trials(postgres.url, name)
    assert_study_ended(trials, n_trials)
    taken = interrupted(trials)
    assert held and {t.number for t in taken} >= set(held)
    assert all("no heartbeat" in t.user_attrs["interrupted_because"] for t in taken), [t.user_attrs for t in taken]
    originals = [t.user_attrs.get(RETRY_OF, t.number) for t in counted(trials)]
    assert len(originals) == len(set(originals)) == n_trials  # each parameter set (with its seeds) counted once


@pytest.mark.slow
def test_a_server_that_goes_away_while_a_worker_opens_it_is_waited_for(postgres, monkeypatch):
    """The server answered the first connection, then restarted while the worker checked Optuna's
    tables under the schema lock (chaos round: "terminating connection due to administrator
    command"): the open is retried, not refused as if the URL were wrong."""
    import sqlalchemy.exc

    real, calls = optuna.storages.get_storage, []

    def restarted_once(url):
        calls.append(url)
        if len(calls) == 1:
            raise sqlalchemy.exc.OperationalError("SELECT 1", {}, ConnectionResetError(104, "terminating connection"))
        return real(url)

    monkeypatch.setattr(optuna.storages, "get_storage", restarted_once)
    storage, _ = open_storage(postgres.url, patience=60)
    assert len(calls) == 2 and optuna.get_all_study_summaries(storage) == []


def test_a_server_that_refuses_the_first_connection_is_refused_at_once(monkeypatch):
    """A wrong URL (nothing listens) must not wait out the patience: no retry pause is taken."""
    import socket

    from hfta_nas import HftaNasError

    pauses = []
    monkeypatch.setattr("hfta_nas.search._patience.time.sleep", pauses.append)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(HftaNasError, match="cannot open storage"):
        open_storage(f"postgresql://postgres@127.0.0.1:{port}/none", patience=600)
    assert pauses == []


@pytest.mark.slow
def test_workers_past_the_patience_end_on_their_outage_line(tmp_path, postgres):
    """`--workers 2` on a server stopped for longer than the patience: each worker says it stopped,
    and so does the parent's last line; no wrong-URL message, no SQLAlchemy warning, and the outage
    is described by its cause (not by Optuna's 'invalid data in the commit' wrapper)."""
    name = "workers-patience"
    space = tmp_path / "space.yaml"
    space.write_text(space_text(n_trials=40, epochs=30, name=name))
    argv = [
        *hfta_nas_command(),
        *["search", str(space), "--workers", "2", "--threads", "1", "--storage", postgres.url],
        *["--study-name", name, "--out", str(tmp_path / "out"), "--storage-patience", "2"],
    ]
    parent = start(argv, tmp_path / "parent.log", worker_env())
    try:
        wait_for(
            lambda: parent.poll() is not None or len(running_workers(postgres.url, name)) == 2, "two workers train"
        )
        postgres.stop()
        [code] = finish([parent])
    finally:
        if parent.poll() is None:
            parent.kill()
    output = (tmp_path / "parent.log").read_text()
    assert code == 2, output
    assert "Traceback" not in output and "check the URL" not in output, output
    assert "SAWarning" not in output and "sqlalchemy" not in output.lower(), output
    assert "invalid data in the commit" not in output, output
    stopped = [line for line in output.splitlines() if "error: storage unreachable for 2 s" in line]
    assert len(stopped) == 2 and output.strip().splitlines()[-1] == stopped[-1], output


def running_workers(url, name):
    """The pids of the workers holding a RUNNING trial of the study (none while it does not exist)."""
    try:
        trials = stored_trials(url, name)
    except KeyError:
        return set()
    return {pid_of(t) for t in trials if t.state == TrialState.RUNNING} - {None}


# ------------------------------------------- the first contact, with a patience given explicitly
class Paused(BaseException):
    """Raised by a test's sleep: opening took a pause (not an Exception, which opening would rewrap)."""


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_with_patience_given_a_refused_first_contact_waits_and_says_so(monkeypatch, caplog):
    """Workers a scheduler starts while the database restarts: nothing listens yet, and the open
    waits (a pause is taken) with one line, instead of failing as a wrong URL does."""
    import logging

    def paused(seconds):
        raise Paused(seconds)

    monkeypatch.setattr("hfta_nas.search._patience.time.sleep", paused)
    with caplog.at_level(logging.WARNING, logger="hfta_nas"), pytest.raises(Paused):
        open_storage(f"postgresql://postgres@127.0.0.1:{free_port()}/none", patience=600, wait_at_start=True)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("storage unreachable since")]
    assert "Connection refused" in line and "retrying for up to 600 s" in line, line


@pytest.mark.parametrize(
    "url",
    ["postgresql://postgres@no-such-host.invalid/x", "mysql+pymysql://root@no-such-host.invalid/x"],
    ids=["postgresql", "mysql"],
)
def test_with_patience_given_an_unknown_host_still_fails_at_once(monkeypatch, url):
    """A host name that does not resolve does not pass by waiting: refused at once, no pause."""
    from hfta_nas import HftaNasError

    if url.startswith("mysql") and importlib.util.find_spec("pymysql") is None:
        pytest.skip("no MySQL driver here")

    def paused(seconds):
        raise Paused(seconds)

    monkeypatch.setattr("hfta_nas.search._patience.time.sleep", paused)
    with pytest.raises(HftaNasError, match="cannot open storage .*check the URL"):
        open_storage(url, patience=600, wait_at_start=True)


def driver_error(text):
    """What SQLAlchemy raises for a connection psycopg could not open, with libpq's text."""
    import sqlalchemy.exc

    class OperationalError(Exception):  # psycopg.OperationalError's place, without importing it
        pass

    return sqlalchemy.exc.OperationalError("SELECT 1", {}, OperationalError(text))


@pytest.mark.parametrize(
    ("text", "waits"),
    [
        ('connection to server at "127.0.0.1", port 5432 failed: Connection refused', True),
        ('connection to server at "db", port 5432 failed: FATAL:  the database system is starting up', True),
        ('connection to server at "db", port 5432 failed: FATAL:  password authentication failed for user "u"', False),
        ('connection to server at "db", port 5432 failed: FATAL:  database "hfta" does not exist', False),
        ('connection to server at "db", port 5432 failed: FATAL:  no pg_hba.conf entry for host "10.0.0.2"', False),
        ("failed to resolve host 'db': [Errno -3] Temporary failure in name resolution", False),
        ("(1045, \"Access denied for user 'root'@'10.0.0.2' (using password: YES)\")", False),
    ],
)
def test_a_first_contact_waits_only_for_what_passes_by_waiting(text, waits):
    """Each of these is about reaching the database (is_passing: a running worker waits them all out),
    but at start only a refusal or a server starting up passes by waiting."""
    from hfta_nas.search._patience import is_passing, passes_at_start

    error = driver_error(text)
    assert is_passing(error) and passes_at_start(error) == waits


@pytest.mark.slow
def test_with_patience_given_a_search_started_while_the_database_is_down_waits_for_it(tmp_path, postgres):
    """`search --storage-patience 300` started while the server is stopped: one line says it waits,
    and when the server is back the search runs to its end."""
    name = "late-database"
    space = tmp_path / "space.yaml"
    space.write_text(space_text(n_trials=2, epochs=1, name=name))
    postgres.stop()
    log = tmp_path / "worker.log"
    argv = search_command(space, postgres.url, name, tmp_path / "out", "--storage-patience", "300", "--quiet")
    worker = start(argv, log, worker_env())
    try:
        wait_for(lambda: worker.poll() is not None or "storage unreachable since" in log.read_text(), "it waits")
        postgres.start()
        [code] = finish([worker])
    finally:
        if worker.poll() is None:
            worker.kill()
    output = log.read_text()
    assert code == 0, output
    waiting = [line for line in output.splitlines() if line.startswith("storage unreachable since")]
    assert len(waiting) == 1 and "Connection refused" in waiting[0] and "storage back after" in output, output
    assert "Traceback" not in output, output
    assert_study_ended(stored_trials(postgres.url, name), 2)
