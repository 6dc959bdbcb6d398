"""A throwaway PostgreSQL server on 127.0.0.1 (trust auth), for tests and the chaos script.

`throwaway_postgres(database)` starts one in a temporary folder (as the `postgres`
user when running as root: initdb refuses root), yields its URL, and stops and
removes it afterwards; `throwaway_server` yields the server itself, which can be
stopped and started again (a database outage). `Unavailable` says why none can
be started here.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


class Unavailable(RuntimeError):
    """No PostgreSQL server can be started on this machine (the message says why)."""


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(
        glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0,
    )
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres() -> tuple[list[str], tuple[int, int] | None]:
    """The command prefix that runs a program as the postgres user (none unless root), and its uid/gid."""
    if os.geteuid() != 0:
        return [], None
    runuser = shutil.which("runuser")
    if runuser is None:
        raise Unavailable("running as root and `runuser` is missing: cannot run initdb as another user")
    import pwd

    try:
        account = pwd.getpwnam("postgres")
    except KeyError:
        raise Unavailable("running as root and there is no `postgres` user to run initdb as") from None
    return [runuser, "-u", "postgres", "--"], (account.pw_uid, account.pw_gid)


class PostgresServer:
    """A running throwaway server: its `url`, and `stop()` / `start()` on the same port and data
    (a database restart, or an outage as long as the caller waits between the two)."""

    def __init__(self, prefix: list[str], pg_ctl: str, data: Path, options: str, log: Path, url: str) -> None:
        self.prefix, self.pg_ctl, self.data, self.options, self.log, self.url = prefix, pg_ctl, data, options, log, url
        self.running = False

    def start(self) -> None:
        subprocess.run(
            [*self.prefix, self.pg_ctl, "-D", str(self.data), "-o", self.options, "-l", str(self.log), "-w", "-t", "60"]
            + ["start"],
            check=True,
            capture_output=True,
            timeout=90,
        )
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        """Stop the server ("fast": connections are closed; "immediate": as a crash)."""
        subprocess.run(
            [*self.prefix, self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "stop"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.running = False


@contextlib.contextmanager
def throwaway_postgres(database: str = "hfta_nas") -> Iterator[str]:
    """A throwaway server's URL (see `throwaway_server`)."""
    with throwaway_server(database) as server:
        yield server.url


@contextlib.contextmanager
def throwaway_server(database: str = "hfta_nas") -> Iterator[PostgresServer]:
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if not (initdb and pg_ctl):
        raise Unavailable(
            "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or in /usr/lib/postgresql/*/bin"
        )
    if importlib.util.find_spec("psycopg") is None:
        raise Unavailable("the psycopg 3 driver is needed for postgresql:// storages")
    prefix, owner = _as_postgres()
    base = Path(tempfile.mkdtemp(prefix="hfta-nas-pg-"))  # its parents must be readable by the postgres user
    data, sockets, log = base / "data", base / "sock", base / "server.log"
    server = None
    try:
        sockets.mkdir()
        base.chmod(0o755)
        if owner is not None:
            for path in (base, sockets):
                os.chown(path, *owner)
        port = _free_port()
        subprocess.run(
            [*prefix, initdb, "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        # fsync off: nothing here survives an OS crash, and a server crash (an immediate stop) loses nothing
        # the OS was given. Commits stay synchronous: asynchronous ones are acknowledged before their WAL is
        # written, so a crash would lose trials a client was told exist, which no real database does.
        options = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=on"
        server = PostgresServer(
            prefix, pg_ctl, data, options, log, f"postgresql://postgres@127.0.0.1:{port}/{database}"
        )
        server.start()
        import psycopg

        with psycopg.connect(
            f"host=127.0.0.1 port={port} user=postgres dbname=postgres", autocommit=True
        ) as connection:
            connection.execute(f"CREATE DATABASE {database}")
        yield server
    except subprocess.CalledProcessError as error:
        server_log = log.read_text(errors="replace") if log.exists() else ""
        raise RuntimeError(
            f"{error.cmd[len(prefix)]} failed: {error.stderr!r} {error.stdout!r}\n{server_log}"
        ) from error
    finally:
        if server is not None and server.running:
            subprocess.run(
                [*prefix, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"], capture_output=True, timeout=60
            )
        shutil.rmtree(base, ignore_errors=True)
