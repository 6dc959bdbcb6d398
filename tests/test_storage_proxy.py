"""Workers through Optuna's gRPC storage proxy (`hfta-nas storage-proxy`, `--storage grpc://HOST:PORT`):
three workers share a study through one proxy, a worker waits out a restart of its proxy, and the
proxy's bad inputs are one line each. The proxy here serves an SQLite file (any database URL works)."""

import signal
import socket
import subprocess
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner
from optuna.trial import TrialState

from hfta_nas.cli import main
from tests._rendezvous import GUARD_S, Rendezvous
from tests.test_storage_outage import finish, logs, search_command, start, stored_trials
from tests.test_workers import assert_study_ended, counted, hfta_nas_command, space_text, worker_env

optuna.logging.set_verbosity(optuna.logging.WARNING)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proxy:
    """`hfta-nas storage-proxy` in a process of its own, started once it says it listens."""

    def __init__(self, database, port):
        self.database, self.port = database, port
        self.process = None

    def start(self):
        self.process = subprocess.Popen(
            [*hfta_nas_command(), "storage-proxy", "--storage", self.database, "--port", str(self.port)],
            env=worker_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.process.stderr.readline()  # its first line: listening (or why not)
        assert "gRPC storage proxy for" in line, line + self.process.stderr.read()
        return self

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    @property
    def url(self):
        return f"grpc://127.0.0.1:{self.port}"


@pytest.fixture
def proxy(tmp_path):
    server = Proxy(f"sqlite:///{tmp_path / 'shared.db'}", free_port()).start()
    try:
        yield server
    finally:
        server.stop()


def test_grpc_storage_bad_inputs_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr("hfta_nas.search._storage.GRPC_READY_S", 0.5)
    runner = CliRunner()
    for storage, says in [
        (f"grpc://127.0.0.1:{free_port()}", "no gRPC storage proxy answered"),
        ("grpc://nowhere", "expected grpc://HOST:PORT"),
        ("grpc://host:99999", "expected grpc://HOST:PORT"),
    ]:
        result = runner.invoke(main, ["search", "search_spaces/mnist1d_mlp.yaml", "--storage", storage])
        assert result.exit_code == 2 and says in result.output, result.output
        assert result.output.strip().count("\n") == 0, result.output
    for storage in (str(tmp_path / "x.journal"), "grpc://127.0.0.1:1"):
        result = runner.invoke(main, ["storage-proxy", "--storage", storage])
        assert result.exit_code == 2 and "expected a database URL" in result.output, result.output
    assert not (tmp_path / "x.journal").exists()


@pytest.mark.slow
def test_three_workers_share_a_study_through_one_proxy(tmp_path, proxy):
    n_trials, name = 8, "proxied"
    space = tmp_path / "space.yaml"
    space.write_text(space_text(n_trials=n_trials, epochs=2, name=name))
    result = subprocess.run(
        [*hfta_nas_command(), "search", str(space), "--workers", "3", "--threads", "1", "--storage", proxy.url]
        + ["--out", str(tmp_path / "out"), "--quiet"],
        cwd=tmp_path,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    trials = stored_trials(proxy.url, name)
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) for t in trials)
    # No study lock reaches through the proxy: workers racing for the last places may each take
    # one (documented); everything they asked is trained and told.
    assert n_trials <= len(counted(trials)) <= n_trials + 2, [(t.number, t.state.name) for t in trials]
    assert {t.user_attrs.get("worker", "").rpartition(":")[0] for t in trials} != {""}


def mid_array(point, trial, step=None):
    return point == "report" and step < 4


@pytest.mark.slow
def test_a_worker_waits_out_a_restart_of_its_proxy(tmp_path, proxy):
    n_trials, name = 4, "restart"
    space = tmp_path / "space.yaml"
    space.write_text(space_text(n_trials=n_trials, epochs=4, name=name))
    meeting = Rendezvous(tmp_path / "rendezvous")
    env = worker_env(**meeting.env(f"tests.{Path(__file__).stem}:mid_array"))
    argv = search_command(space, proxy.url, name, tmp_path / "o")
    worker = start(argv, tmp_path / "worker.log", env)
    try:
        meeting.wait(1, [worker])
        proxy.stop()
        meeting.release()
        proxy.start()
        [code] = finish([worker])
    finally:
        meeting.close()
    output = logs(tmp_path)
    assert code == 0, output
    assert "Traceback" not in output, output
    assert_study_ended(stored_trials(proxy.url, name), n_trials)
