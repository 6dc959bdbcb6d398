"""Many search workers on one study: `hfta-nas search --workers K` on a journal
file, and separate worker processes on a throwaway PostgreSQL server, one of
them killed with SIGKILL mid-array. The budget is counted across workers (under
the study lock), no trial is left RUNNING or WAITING, and the killed worker's
trials are failed as interrupted and retried by the survivors; a worker killed
between asking and its first heartbeat is retried at once by the next run."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from hfta_nas.search import counts, open_storage
from hfta_nas.search._ledger import RETRY_OF
from hfta_nas.search._recovery import fail_and_retry
from hfta_nas.search._storage import study_lock
from hfta_nas.search_spaces import parse_space, run_search
from tests._rendezvous import GUARD_S, Rendezvous, held_command, wait_exited, wait_for

optuna.logging.set_verbosity(optuna.logging.WARNING)

ROOT = Path(__file__).resolve().parents[1]
ENDED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def space_text(n_trials, epochs, name="workers"):
    return yaml.safe_dump(
        {
            "study": {"name": name, "metrics": ["val_acc"]},
            "sampler": {"name": "tpe", "kwargs": {"n_startup_trials": 2}},
            "pruner": {"name": "none"},
            "budget": {"n_trials": n_trials},
            "array": {"size": 2, "step_cost": {"fixed_s": 1e-4, "per_gmac_s": 0.1}},  # packing not a timing
            "data": {"dataset": "digits", "batch_size": 64},
            "training": {"epochs": epochs, "optimizer": {"name": "adam", "lr": 1e-3}},
            "model": {"family": "mlp", "config": {"depth": 1}},
            "seed": 7,
            "params": {
                "training.optimizer.lr": {"distribution": "log_uniform", "min": 1e-3, "max": 3e-2},
                "model.config.width": {"distribution": "categorical", "values": [16, 32]},
            },
        }
    )


def hfta_nas_command():
    script = shutil.which("hfta-nas", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "hfta_nas.cli"]


def worker_env(**extra):
    env = dict(os.environ, PYTHONUNBUFFERED="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def counted(trials):
    return [t for t in trials if t.state in ENDED and counts(t)]


def pid_of(trial):
    worker = trial.user_attrs.get("worker")
    return int(worker.rpartition(":")[2]) if isinstance(worker, str) and worker.rpartition(":")[2].isdigit() else None


def assert_study_ended(trials, n_trials):
    states = {t.number: t.state.name for t in trials}
    assert all(t.state in ENDED for t in trials), states  # none RUNNING or WAITING
    assert len(counted(trials)) == n_trials, [(t.number, t.state.name, t.user_attrs.get("fail_reason")) for t in trials]


# ------------------------------------------------------------ --workers K, journal
def test_workers_share_one_journal_study_and_its_budget(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(space_text(n_trials=10, epochs=2))
    journal = tmp_path / "study.journal"
    result = subprocess.run(
        [
            *hfta_nas_command(),
            "search",
            str(space),
            "--workers",
            "4",
            "--threads",
            "1",
            "--storage",
            str(journal),
            "--out",
            str(tmp_path / "out"),
            "--json",
        ],
        cwd=tmp_path,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert [w["how"] for w in report["workers"]] == ["finished"] * 4
    assert report["counted"] == 10

    study = optuna.load_study(study_name="workers", storage=open_storage(str(journal))[0])
    trials = study.get_trials(deepcopy=False)
    assert_study_ended(trials, 10)
    worker_pids = {w["pid"] for w in report["workers"]}
    trained_by = {pid_of(t) for t in counted(trials)}
    assert trained_by <= worker_pids, (trained_by, worker_pids)
    assert len(trained_by) > 1, "only one worker trained"
    arrays = {t.user_attrs["array_id"] for t in counted(trials)}
    assert len({a.partition("/")[0] for a in arrays}) > 1  # arrays trained by several workers


def _as_a_background_job() -> None:
    """What a shell does to `hfta-nas search ... &` in a batch script: SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("started", ["in the foreground", "as a background job"])
def test_workers_stop_and_tell_their_trials_when_their_parent_is_killed(tmp_path, started):
    """SIGKILL of `hfta-nas search --workers 2` (the OOM killer, a scheduler): Linux sends its
    workers SIGINT, and each stops as on Ctrl-C, its trials told and queued again; also when
    the search was started with SIGINT ignored, as a shell starts a background job."""
    space, journal = tmp_path / "space.yaml", tmp_path / "study.journal"
    space.write_text(space_text(n_trials=40, epochs=30))
    parent = subprocess.Popen(
        [
            *hfta_nas_command(),
            "search",
            str(space),
            "--workers",
            "2",
            "--threads",
            "1",
            "--storage",
            str(journal),
            "--out",
            str(tmp_path / "out"),
            "--quiet",
        ],
        cwd=tmp_path,
        env=worker_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_as_a_background_job if started == "as a background job" else None,
    )

    try:
        workers = wait_for(_workers_holding_trials(journal), "both workers should hold trials before the kill")
    finally:
        parent.kill()
        parent.wait()
    wait_exited(workers)  # each stops as on Ctrl-C, after telling its trials
    trials = optuna.load_study(study_name="workers", storage=open_storage(str(journal))[0]).get_trials(deepcopy=False)
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]  # told as interrupted, none left held
    assert any(t.user_attrs.get("outcome") == "interrupted" for t in trials)


ORPHAN = """
import os, signal, sys, threading
from hfta_nas.search import stop_when_orphaned

def heard(signum, frame):
    os.write(1, f"{signal.Signals(signum).name}\\n".encode())  # one write: a handler may cut into another
    if signum == signal.SIGTERM:
        os._exit(0)

signal.signal(signal.SIGTERM, heard)
signal.signal(signal.SIGINT, signal.SIG_IGN if sys.argv[1] == "missed" else heard)  # missed: it came while ignored
watching = stop_when_orphaned(grace_s=0.0) is not None
os.write(1, f"watching={watching} passed_on={'HFTA_NAS_WORKER_PARENT' in os.environ}\\n".encode())
os.write(int(sys.argv[2]), b"1")  # the parent may go now
threading.Event().wait()
"""

PARENT = """
import os, subprocess, sys
ready, armed = os.pipe()
env = dict(os.environ, HFTA_NAS_WORKER_PARENT=str(os.getpid()))  # as run_workers sets it
subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1], str(armed)], env=env, pass_fds=[armed])
os.close(armed)
os.read(ready, 1)
os._exit(0)  # gone, as a SIGKILLed parent, once its worker watches
"""


@pytest.mark.parametrize(("sigint", "heard"), [("heard", ["SIGINT", "SIGTERM"]), ("missed", ["SIGTERM"])])
def test_a_worker_whose_parent_is_gone_stops_even_if_it_missed_the_kernels_sigint(sigint, heard):
    """A worker watches its parent's pid (`HFTA_NAS_WORKER_PARENT`, kept from the processes it
    starts); once the parent is gone it signals itself as the parent's stop would: SIGINT, then
    SIGTERM (which one that missed or ignored the SIGINT hears), then SIGKILL."""
    parent = subprocess.run(
        [sys.executable, "-c", PARENT, sigint, ORPHAN],
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )  # returns once the worker, which holds the same stdout, has exited too
    assert parent.stdout.split() == ["watching=True", "passed_on=False", *heard], parent.stderr


def test_a_sigterm_to_the_parent_reaches_every_worker_and_each_stops_as_on_ctrl_c(tmp_path):
    """SIGTERM of `hfta-nas search --workers 2` alone (Slurm's `--signal=B:TERM@...` to the batch
    shell, docker stop, kill): the parent forwards it, each worker tells its trials and queues them
    again, and the parent exits 143 with one line."""
    space, journal, log = tmp_path / "space.yaml", tmp_path / "study.journal", tmp_path / "parent.log"
    space.write_text(space_text(n_trials=40, epochs=30))
    command = [*hfta_nas_command(), "search", str(space), "--workers", "2", "--threads", "1"]
    with open(log, "wb") as output:
        parent = subprocess.Popen(
            [*command, "--storage", str(journal), "--out", str(tmp_path / "out"), "--quiet"],
            cwd=tmp_path,
            env=worker_env(),
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        workers = wait_for(_workers_holding_trials(journal), "both workers should hold trials before the SIGTERM")
        parent.send_signal(signal.SIGTERM)
        parent.wait(timeout=GUARD_S)
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.wait()
    printed = log.read_text(errors="replace")
    assert parent.returncode == 143, printed[-3000:]
    assert "terminated by SIGTERM" in printed.splitlines() and "Traceback" not in printed, printed[-3000:]
    wait_exited(workers)
    trials = optuna.load_study(study_name="workers", storage=open_storage(str(journal))[0]).get_trials(deepcopy=False)
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    interrupted = [t for t in trials if t.user_attrs.get("outcome") == "interrupted"]
    # told by the workers themselves (a trial the SIGTERM caught between its ask and the write of
    # its worker's name has no pid; the reason, which only a stopping worker writes, still says so)
    assert interrupted and {pid_of(t) for t in interrupted} - {None} <= workers
    assert {t.user_attrs["interrupted_because"] for t in interrupted} == {"SIGTERM stopped its search"}
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    assert len(waiting) == len(interrupted)  # each queued again, for the next run


def _workers_holding_trials(journal):
    """A condition for `wait_for`: the pids of the two workers once each holds a RUNNING trial."""

    def holding():
        if not journal.exists() or not journal.stat().st_size:
            return set()
        trials = optuna.load_study(study_name="workers", storage=open_storage(str(journal))[0]).trials
        workers = {pid_of(t) for t in trials if t.state == TrialState.RUNNING} - {None}
        return workers if len(workers) == 2 else set()

    return holding


FIRST_OPEN = """
import sys
import optuna
from hfta_nas.search import open_storage
from tests._rendezvous import arrive_and_hold
optuna.logging.set_verbosity(optuna.logging.WARNING)
arrive_and_hold()  # all start at once, when the test releases them
optuna.create_study(storage=open_storage(sys.argv[1])[0], study_name="first", load_if_exists=True)
"""


def test_simultaneous_first_opens_of_a_fresh_sqlite_file_all_succeed(tmp_path):
    """Several workers started at once on a new SQLite file raced to create its tables
    ("table studies already exists"); they now create them one at a time."""
    url, meeting = f"sqlite:///{tmp_path / 'fresh.db'}", Rendezvous(tmp_path / "rendezvous")
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", FIRST_OPEN, url],
            env=worker_env(**meeting.env()),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(8)
    ]
    meeting.wait(8, processes)
    meeting.release()
    meeting.close()
    outputs = [(p.wait(timeout=GUARD_S), p.stdout.read()) for p in processes]
    assert all(code == 0 for code, _ in outputs), [out[-500:] for code, out in outputs if code]
    assert [s.study_name for s in optuna.get_all_study_summaries(open_storage(url)[0])] == ["first"]


# ------------------------------------------------------------------- PostgreSQL
@pytest.fixture
def postgres_url(postgres):
    """The URL of a throwaway PostgreSQL server (conftest's `postgres`)."""
    return postgres.url


def test_a_ctrl_c_just_after_the_study_lock_was_granted_leaves_it_free(tmp_path, monkeypatch):
    """Python raises a KeyboardInterrupt just after the call it arrived in; when that call is the
    flock that got the study lock, the lock must be given back, or the stopping worker (telling
    its trials under the same lock, with a new file) and every other worker wait on it forever."""
    import fcntl

    journal = tmp_path / "study.journal"
    lock = study_lock(open_storage(str(journal))[0], str(journal), "workers")
    real_flock, interrupted = fcntl.flock, []

    def flock_then_ctrl_c(handle, operation):
        real_flock(handle, operation)
        if operation == fcntl.LOCK_EX and not interrupted:
            interrupted.append(operation)
            raise KeyboardInterrupt

    monkeypatch.setattr(fcntl, "flock", flock_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt) as stopping, lock:  # kept, as the stopping worker keeps it
        pass
    [lock_file] = tmp_path.glob(".study.journal.*.lock")
    with open(lock_file, "a") as another_worker:  # a new open file, as another process's
        real_flock(another_worker, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError while held
        real_flock(another_worker, fcntl.LOCK_UN)
    with lock:  # and this worker takes it again
        assert interrupted == [fcntl.LOCK_EX] and stopping.traceback


@pytest.mark.slow
def test_postgres_study_lock_excludes_another_worker(postgres_url):
    """Two workers' locks on one PostgreSQL study: the second waits while the first holds it.
    (Optuna's storage cache once hid the engine, and the lock silently did nothing.)"""
    first = study_lock(open_storage(postgres_url)[0], postgres_url, "locked")
    second = study_lock(open_storage(postgres_url)[0], postgres_url, "locked")
    entered = threading.Event()

    def other_worker():
        with second:
            entered.set()

    with first:
        thread = threading.Thread(target=other_worker, daemon=True)
        thread.start()
        assert not entered.wait(1.0), "the second worker entered while the first held the study lock"
    assert entered.wait(30), "the second worker never got the lock after the first released it"
    thread.join(30)


@pytest.mark.slow
def test_a_ctrl_c_just_after_the_postgres_study_lock_was_granted_leaves_it_free(postgres_url, monkeypatch):
    """The advisory lock is the database session's, and a connection closed the plain way goes
    back to the engine's pool, session and lock with it: one cut short by a Ctrl-C just after the
    grant is invalidated, so another worker (another session) takes the lock at once."""
    import hashlib

    import sqlalchemy

    lock = study_lock(open_storage(postgres_url)[0], postgres_url, "locked")
    real_commit, interrupted = sqlalchemy.engine.Connection.commit, []

    def commit_then_ctrl_c(connection):
        real_commit(connection)
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt

    monkeypatch.setattr(sqlalchemy.engine.Connection, "commit", commit_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt) as stopping, lock:  # kept, as the stopping worker keeps it
        pass
    monkeypatch.undo()
    key = int.from_bytes(hashlib.sha256(b"locked").digest()[:8], "big", signed=True)
    another_worker = sqlalchemy.create_engine(postgres_url)
    with another_worker.connect() as connection:
        taken = connection.execute(sqlalchemy.text("SELECT pg_try_advisory_lock(:key)"), {"key": key}).scalar()
        connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": key})
    another_worker.dispose()
    assert taken and stopping.traceback
    with lock:  # and this worker takes it again
        pass


@pytest.mark.slow
def test_postgres_workers_and_a_second_study_never_hang_or_overshoot_round_after_round(tmp_path, postgres_url):
    """The hang seen before the study lock really locked: 3 workers (`--workers 3`) racing for
    the last places while a second study runs on the same database. Each round is bounded
    by a timeout; each study ends with exactly its budget and nothing RUNNING or WAITING.
    2 rounds here (about 18 s each on 2 cores); HFTA_NAS_WORKER_ROUNDS=10 for the full check."""
    n_trials, base = 7, hfta_nas_command()
    for round_ in range(int(os.environ.get("HFTA_NAS_WORKER_ROUNDS", "2"))):
        names = (f"race{round_}", f"other{round_}")
        commands = []
        for name, workers in zip(names, (3, 1)):
            space = tmp_path / f"{name}.yaml"
            space.write_text(space_text(n_trials=n_trials, epochs=1, name=name))
            commands.append(
                [
                    *base,
                    "search",
                    str(space),
                    "--threads",
                    "1",
                    "--storage",
                    postgres_url,
                    "--workers",
                    str(workers),
                    "--out",
                    str(tmp_path / name),
                    "--quiet",
                ]
            )
        processes = [
            subprocess.Popen(
                c, cwd=tmp_path, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            for c in commands
        ]
        try:
            outputs = [p.communicate(timeout=GUARD_S)[0] for p in processes]
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        assert [p.returncode for p in processes] == [0, 0], (round_, [o[-2000:] for o in outputs])
        for name in names:
            trials = optuna.load_study(study_name=name, storage=open_storage(postgres_url)[0]).get_trials(
                deepcopy=False
            )
            assert_study_ended(trials, n_trials)


def first_epochs_reported(point, trial, step=None):
    """At a trial's report of an epoch before the last (of 8): its worker is mid-array."""
    return point == "report" and step < 8


@pytest.mark.slow
def test_postgres_workers_survive_a_killed_worker(tmp_path, postgres_url):
    n_trials, name = 8, "workers"
    space = tmp_path / "space.yaml"
    space.write_text(space_text(n_trials=n_trials, epochs=8, name=name))
    argv = held_command(
        "search",
        str(space),
        "--threads",
        "1",
        "--storage",
        postgres_url,
        "--study-name",
        name,
        "--out",
        str(tmp_path / "out"),
    )  # not --quiet: array and retry lines in the logs
    # A dead worker on this host is seen at once (its pid is gone); a short heartbeat makes the
    # survivors look again every 2 s and labels held trials sooner, with a grace (3 intervals)
    # that a live but busy worker on this shared CPU still meets.
    meeting = Rendezvous(tmp_path / "rendezvous")
    env = worker_env(HFTA_NAS_HEARTBEAT="3", **meeting.env(f"tests.{Path(__file__).stem}:first_epochs_reported"))
    processes = []
    try:
        for i in range(3):
            with open(tmp_path / f"worker{i}.log", "w") as log:
                processes.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
        pids = {p.pid: p for p in processes}
        try:
            # the first worker to report an epoch holds there, mid-array, until it is killed
            [victim] = meeting.wait(1, processes)
        except AssertionError as error:
            raise AssertionError(f"no worker was seen mid-array ({error}): {_logs(tmp_path)}") from None
        study = optuna.load_study(study_name=name, storage=open_storage(postgres_url)[0])
        held = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if pid_of(t) == victim]
        os.kill(victim, signal.SIGKILL)
        assert pids[victim].wait() == -signal.SIGKILL
        for process in processes:
            if process.pid != victim:
                try:
                    returncode = process.wait(timeout=GUARD_S)  # a guard against a hung worker only
                except subprocess.TimeoutExpired:
                    returncode = None
                assert returncode == 0, (
                    f"survivor {process.pid}: {returncode}\n{_trials(postgres_url, name)}\n{_logs(tmp_path)}"
                )
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        meeting.close()

    study = optuna.load_study(study_name=name, storage=open_storage(postgres_url)[0])
    trials = study.get_trials(deepcopy=False)
    assert_study_ended(trials, n_trials)
    by_number = {t.number: t for t in trials}
    interrupted = [t for t in trials if str(t.user_attrs.get("fail_reason", "")).startswith("interrupted")]
    assert held and {t.number for t in interrupted} >= set(held)
    for trial in interrupted:
        assert trial.state == TrialState.FAIL
        assert pid_of(trial) == victim and "exited" in trial.user_attrs["interrupted_because"], trial.user_attrs
    for number in held:
        original = by_number[number]
        retries = [
            t
            for t in trials
            if t.number > number
            and t.params == original.params
            and pid_of(t) not in (None, victim)
            and t.user_attrs.get(RETRY_OF) == number
        ]  # same parameters, and the seeds of the trial it retries
        assert retries, f"trial {number} of the killed worker was not retried"
        assert any(t in counted(trials) for t in retries)
    survivors = {p.pid for p in processes} - {victim}
    assert {pid_of(t) for t in counted(trials)} <= survivors | {victim}
    assert not any(pid_of(t) == victim for t in counted(trials) if t.state != TrialState.COMPLETE)


# --------------------------------------------- killed between asking and training
KILL_AFTER_FIRST_ASK = """
import os, signal, sys
sys.path.insert(0, {root!r})
from hfta_nas.search import _optimize
from hfta_nas.search_spaces import parse_space, run_search

ask = _optimize._Search._ask
def ask_then_die(self, *args, **kwargs):
    candidate = ask(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)  # before the array starts, before any heartbeat
    return candidate
_optimize._Search._ask = ask_then_die
run_search(parse_space(open({space!r}).read(), source={space!r}), storage={storage!r}, out_dir={out!r})
"""


def test_a_worker_killed_before_its_first_heartbeat_is_retried_at_once(tmp_path):
    """Trials carry their worker from the ask on, so the next run on this machine
    sees at once that its process is gone (no wait for the no-heartbeat grace)."""
    space, journal = tmp_path / "space.yaml", tmp_path / "study.journal"
    space.write_text(space_text(n_trials=2, epochs=2))
    script = KILL_AFTER_FIRST_ASK.format(
        root=str(ROOT), space=str(space), storage=str(journal), out=str(tmp_path / "out")
    )
    killed = subprocess.run(
        [sys.executable, "-c", script], env=worker_env(), capture_output=True, text=True, timeout=GUARD_S
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    study = optuna.load_study(study_name="workers", storage=open_storage(str(journal))[0])
    [orphan] = study.get_trials(deepcopy=False)
    assert orphan.state == TrialState.RUNNING and "heartbeat" not in orphan.user_attrs

    summary = run_search(
        parse_space(space.read_text(), source=str(space)), storage=str(journal), out_dir=tmp_path / "out"
    )
    trials = optuna.load_study(study_name="workers", storage=open_storage(str(journal))[0]).get_trials(deepcopy=False)
    assert_study_ended(trials, 2)
    orphan = trials[orphan.number]
    assert orphan.state == TrialState.FAIL and orphan.user_attrs["fail_reason"].startswith("interrupted:")
    assert "exited" in orphan.user_attrs["interrupted_because"], orphan.user_attrs
    assert any(t.user_attrs.get(RETRY_OF) == orphan.number and t.params == orphan.params for t in counted(trials))
    assert summary.trials.get("COMPLETE") == 2


def test_a_trial_taken_over_before_its_array_starts_leaves_its_slot_untold(tmp_path, monkeypatch):
    """This worker asked a trial, was cut off past the heartbeat grace, and another worker failed
    the trial as interrupted and queued its retry: when its array starts, the first write about
    that trial finds it finished. The slot leaves after its first epoch, nothing is told twice,
    and the search ends normally with the retry trained in its place."""
    from hfta_nas.search import _array_job
    from hfta_nas.search._ledger import Ledger, Outcome

    space, journal = tmp_path / "space.yaml", tmp_path / "study.journal"
    space.write_text(space_text(n_trials=3, epochs=2))
    tell_start, taken = _array_job.ArrayJob._tell_start, []

    def taken_over_first(self, proposal, slot, **extra):
        if not taken:  # another worker's retry_stale_trials, as it would run meanwhile
            taken.append(proposal.number)
            fail_and_retry(Ledger(proposal.trial.study, None), proposal.trial, "no heartbeat for 40 s", lambda e: None)
        return tell_start(self, proposal, slot, **extra)

    monkeypatch.setattr(_array_job.ArrayJob, "_tell_start", taken_over_first)
    run_search(parse_space(space.read_text(), source=str(space)), storage=str(journal), out_dir=tmp_path / "out")
    trials = optuna.load_study(study_name="workers", storage=open_storage(str(journal))[0]).get_trials(deepcopy=False)
    assert_study_ended(trials, 3)
    [first] = taken
    assert trials[first].state == TrialState.FAIL and trials[first].user_attrs["outcome"] == Outcome.INTERRUPTED.value
    assert "train_start" not in trials[first].user_attrs  # nothing of this worker's was written after the takeover
    assert [t.number for t in counted(trials) if t.user_attrs.get(RETRY_OF) == first]  # its retry counted once


def test_a_ctrl_c_right_after_an_ask_leaves_no_trial_running(tmp_path, monkeypatch):
    """The SIGINT that Ctrl-C (or a killed --workers parent) sends can land just after Optuna
    created a trial and before the worker recorded it as held: the stop must still tell it
    (a clean-clone CI run once left such a trial RUNNING)."""
    space, journal = tmp_path / "space.yaml", tmp_path / "study.journal"
    space.write_text(space_text(n_trials=4, epochs=2))
    ask, asks = optuna.Study.ask, []

    def ask_then_interrupted(study, *args, **kwargs):
        trial = ask(study, *args, **kwargs)
        asks.append(trial.number)
        if len(asks) == 2:
            signal.raise_signal(signal.SIGINT)  # delivered here, at once, by Python's default handler
        return trial

    monkeypatch.setattr(optuna.Study, "ask", ask_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_search(parse_space(space.read_text(), source=str(space)), storage=str(journal), out_dir=tmp_path / "out")
    trials = optuna.load_study(study_name="workers", storage=open_storage(str(journal))[0]).get_trials(deepcopy=False)
    assert len(asks) == 2 and not [t.number for t in trials if t.state == TrialState.RUNNING]
    assert trials[asks[1]].user_attrs.get("outcome") == "interrupted"


def test_a_sigterm_right_after_an_ask_and_another_during_the_tell_lose_no_trial(tmp_path, monkeypatch):
    """A SIGTERM (under the command line's handler) lands just after an ask, and a second one
    (a scheduler signals every process, the --workers parent forwards it) while the stopping
    search tells its trials: every held trial is told and queued again, none left RUNNING."""
    from hfta_nas.cli import Terminated, _sigterm_as_interrupt

    space, journal = tmp_path / "space.yaml", tmp_path / "study.journal"
    space.write_text(space_text(n_trials=4, epochs=2))
    ask, enqueue, asks, second = optuna.Study.ask, optuna.Study.enqueue_trial, [], []

    def ask_then_terminated(study, *args, **kwargs):
        trial = ask(study, *args, **kwargs)
        asks.append(trial.number)
        if len(asks) == 2:
            signal.raise_signal(signal.SIGTERM)  # held until the trial is recorded as held, then raised
        return trial

    def enqueue_then_terminated_again(study, *args, **kwargs):
        if len(asks) == 2 and not second:  # the stop's first retry: between its fail and its enqueue
            second.append(True)
            signal.raise_signal(signal.SIGTERM)
        return enqueue(study, *args, **kwargs)

    monkeypatch.setattr(optuna.Study, "ask", ask_then_terminated)
    monkeypatch.setattr(optuna.Study, "enqueue_trial", enqueue_then_terminated_again)
    with pytest.raises(Terminated), _sigterm_as_interrupt():
        run_search(parse_space(space.read_text(), source=str(space)), storage=str(journal), out_dir=tmp_path / "out")
    assert second, "the second SIGTERM was not sent during the tell"
    trials = optuna.load_study(study_name="workers", storage=open_storage(str(journal))[0]).get_trials(deepcopy=False)
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    interrupted = [t for t in trials if t.user_attrs.get("outcome") == "interrupted"]
    assert sorted(t.number for t in interrupted) == asks  # both held trials, the one asked as the signal came too
    assert {t.user_attrs["interrupted_because"] for t in interrupted} == {"SIGTERM stopped its search"}
    queued = [t.user_attrs.get(RETRY_OF) for t in trials if t.state == TrialState.WAITING]
    assert sorted(queued) == asks  # each queued again: the second SIGTERM cut no tell short


def _trials(url, name):
    try:
        study = optuna.load_study(study_name=name, storage=open_storage(url)[0])
    except Exception as error:  # for a failure message only
        return f"(study not readable: {error})"
    rows = [
        f"{t.number} {t.state.name} worker={t.user_attrs.get('worker')} host={t.user_attrs.get('worker_host')} "
        f"epochs={t.user_attrs.get('epochs_run')} beat={t.user_attrs.get('heartbeat')} start={t.datetime_start} "
        f"reason={t.user_attrs.get('fail_reason')} because={t.user_attrs.get('interrupted_because')}"
        for t in study.trials
    ]
    return "\n".join([f"now={time.time()}", *rows])


def _logs(tmp_path):
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(tmp_path.glob("worker*.log"))
    )
