"""Chaos rounds: kill, pause or interrupt searches and stability studies at random times,
re-run them, and check that nothing was lost. Not a unit test (minutes per dozen rounds).

    python -m benchmarks.chaos                     # 100 rounds, journal + SQLite (+ PostgreSQL when it can start)
    python -m benchmarks.chaos --rounds 10 --seed 3 --storages journal --json chaos.json
    python -m benchmarks.chaos --rounds 30 --epochs 40  # longer arrays: signals land mid-array, re-runs resume
    python -m benchmarks.chaos --faults network,database --rounds 50 --minutes 25  # hosts in namespaces (root)

Each round draws, from `--seed`: the command (search or stability), the storage
(journal file, SQLite, a throwaway PostgreSQL), 1-3 workers (search), the signal
(SIGKILL, SIGINT, or SIGSTOP for a few seconds then SIGCONT), its target (the
command, or one worker) and its time. It runs the command, sends the signal, lets
it end, runs the same command again to the end with no signal, and checks:

- search: nothing RUNNING or WAITING; exactly n_trials counted; every trial failed
  as interrupted has a finished retry with its parameters, and no two counted
  trials retry the same one; the exported config names the study's best trial and
  the exported weights are its staged ones; every counted trial whose parameters
  and seeds a clean reference run also trained has the reference's value (1e-6);
- stability: every seed completed once, with the values of a clean reference run
  (1e-5: a re-run trains the missing seeds in a smaller array);
- both: no checkpoint file is left once the re-run ends (a re-run that continued an
  array from its checkpoint is counted in the last line).

A round that breaks an invariant is printed with its draw and its logs' tails. The
last line is the count: `chaos: N rounds (S signalled mid-run, R continued mid-array), K passed, F failed`.

Many hosts, one machine: `--faults network,database` (the rounds above are `--faults signals`,
the default; kinds may be mixed, and each kind may be named alone: partition, slow-link,
host-kill, db-restart). Each such round runs a search on a throwaway PostgreSQL server
from 2-3 hosts, each a network namespace with a veth pair to the root namespace, where
the server listens (see benchmarks/_netns.py; one worker per host, its own host name), with
HFTA_NAS_HEARTBEAT=2 (a 6 s grace). Once the target host holds a trial (its worker's id on a
RUNNING trial, with a heartbeat) and a drawn 0-2 s later, one fault:

- partition: the host's link drops every packet for `--partition-seconds` (default 6-24 s:
  the issue's 30-120 s at the default 10 s heartbeat, scaled to the 2 s one, so from about
  the grace to 4 graces; a partition past the grace hands the host's trials to the others
  and drops its late results; libpq gives a stalled connection up after 15 s);
- slow-link: the host's link is a token bucket of 16, 64 or 256 kbit/s each way (2 s queue,
  then drops) for as long (netem is used for a delay where the kernel has it; it has not
  here);
- host-kill: every process of the host is SIGKILLed (the others take its trials over by
  their heartbeats' age: another host's pid means nothing to them);
- db-restart: the server is stopped (fast or immediate, as a crash) and started again after
  `--outage-seconds` (default 0-24 s: 0 is a restart).

A quarter of the rounds give the target host (db-restart: every host) a patience shorter than
the fault, so it may stop with exit 2 and its one line; the others get 300 s. Then all hosts
end, the same search runs again to the end from the root namespace, and the round checks,
besides the search invariants above (and that no parameter set is counted twice: each
counted trial's original number is unique), that every host ended with exit 0, or with 2 and
the one line "error: storage unreachable for ..." where its patience was short, or was the
one killed; that no log holds a traceback; and that every link is up again with no qdisc.
The namespaces live for the whole run and are removed at its end (also after an error);
what a crashed run left is removed at the next start. Where
namespaces cannot be made (not root, no `ip`) one line says so and the database faults run
alone, the hosts then being plain processes. The summary gives a line per fault kind.

SIGTERM and a full disk: `--faults sigterm,disk` (the kinds' names: sigterm, disk-full). A
sigterm round sends SIGTERM, as a scheduler does at a time limit, to a search, a stability study
or a PBT population once an array is part-way, checks exit 143, its one line and that nothing
is left RUNNING, then re-runs it and checks the study against a clean run
(benchmarks/_chaos_sigterm.py). A disk-full round puts `--out` on a small tmpfs that fills while
the best weights are written (root), checks that no trained trial failed, one line names the
full disk and the exit is 2, frees the space and checks that the next run finishes the study
(benchmarks/_chaos_disk.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna

from benchmarks._chaos_rounds import (
    EPOCHS,
    SIGNALS,
    STORAGES,
    Draw,
    clean_run,
    command,
    disturbed_run,
    env,
    search_problems,
    search_reference,
    space_text,
    stability_config,
    stability_problems,
    stability_resumed,
    stability_values,
    storage_url,
)
from benchmarks._cli import package_versions
from hfta_nas.search import open_storage


# --------------------------------------------------------------------- main
def draw_round(rng: random.Random, number: int, storages: list[str]) -> Draw:
    what = rng.choice(["search", "search", "stability"])
    workers = rng.choice([1, 2, 3]) if what == "search" else 1
    sig = rng.choice(SIGNALS)
    target = rng.choice(["command", "worker"]) if workers > 1 else "command"
    return Draw(
        number,
        what,
        rng.choice(storages),
        workers,
        sig,
        target,
        round(rng.uniform(1.0, 7.0), 2),
        round(rng.uniform(0.5, 4.0), 2),
    )


def references(base: Path, epochs: int = EPOCHS, pbt: bool = False) -> dict[str, Any]:
    """Clean runs of both commands (and of a PBT population), once, on the journal (values do not
    depend on the storage)."""
    folder = base / "reference"
    folder.mkdir()
    (folder / "space.yaml").write_text(space_text("reference", epochs))
    (folder / "config.yaml").write_text(stability_config(epochs))
    url = storage_url("journal", folder, None, "reference")
    for what in ("search", "stability"):
        probe = Draw(0, what, "journal", 1, "", "command", 0, 0)
        if clean_run(command(probe, folder, url), folder / f"{what}.log"):
            raise SystemExit(f"the clean reference {what} failed:\n{(folder / f'{what}.log').read_text()[-3000:]}")
    found = {"search": search_reference(url, "reference"), "stability": stability_values(folder / "report")}
    if pbt:
        found["pbt"] = _pbt_reference(base / "reference-pbt", epochs)
    return found


def _pbt_reference(folder: Path, epochs: int) -> dict[str, Any]:
    from benchmarks._chaos_pbt import pbt_reference, pbt_space_text

    folder.mkdir()
    (folder / "space.yaml").write_text(pbt_space_text("reference", epochs))
    url = storage_url("journal", folder, None, "reference")
    if clean_run(command(Draw(0, "search", "journal", 1, "", "command", 0, 0), folder, url), folder / "pbt.log"):
        raise SystemExit(f"the clean reference PBT run failed:\n{(folder / 'pbt.log').read_text()[-3000:]}")
    return pbt_reference(url, "reference", folder / "out")


def run_round(
    draw: Draw, base: Path, postgres: str | None, reference: dict[str, Any], epochs: int = EPOCHS
) -> tuple[list[str], int, bool, bool]:
    """The round's broken invariants, how many results were compared with a clean run, whether
    the signal found the command running, and whether the re-run continued a checkpoint."""
    folder = base / f"round-{draw.round}"
    folder.mkdir()
    name = f"chaos{draw.round}"
    (folder / "space.yaml").write_text(space_text(name, epochs))
    (folder / "config.yaml").write_text(stability_config(epochs))
    url = storage_url(draw.storage, folder, postgres, name)
    argv = command(draw, folder, url)
    hit = disturbed_run(draw, argv, folder / "disturbed.log")
    if clean_run(argv, folder / "rerun.log"):
        return [f"the re-run failed:\n{(folder / 'rerun.log').read_text(errors='replace')[-1500:]}"], 0, hit, False
    if draw.command == "search":
        problems, compared = search_problems(url, name, folder / "out", reference["search"])
        resumed = any(
            "resumed_from_epoch" in t.user_attrs
            for t in optuna.load_study(study_name=name, storage=open_storage(url)[0]).get_trials(deepcopy=False)
        )
    else:
        problems, compared = stability_problems(folder / "report", reference["stability"])
        resumed = stability_resumed(folder / "report")
    left = sorted(str(p.relative_to(folder)) for p in folder.rglob("checkpoints/*/*.pt"))
    if left:
        problems.append(f"checkpoints left after the re-run: {left}")
    return problems, compared, hit, resumed


# ------------------------------------------------------- many hosts: network and database faults
FAULT_GROUPS = {
    "signals": ("signals",),
    "network": ("partition", "slow-link", "host-kill"),
    "database": ("db-restart",),
    "disk": ("disk-full",),
}
FAULTS = ("signals", "sigterm", "disk-full", "partition", "slow-link", "host-kill", "db-restart")
ONE_HOST = ("signals", "sigterm", "disk-full")  # faults of one command on the drawn storage
HEARTBEAT_S = "2"  # HFTA_NAS_HEARTBEAT of the hosts and the re-run: a 6 s grace
PATIENCE_S = 300.0  # a host's --storage-patience unless the round draws a short one
HOST_GUARD_S = 420  # a host still running this long after its round began is a hang: killed, a problem
SLOW_KBIT = (16, 64, 256)


@dataclass
class HostDraw:
    """What one many-hosts round does."""

    round: int
    fault: str  # partition | slow-link | host-kill | db-restart
    hosts: int
    target: int  # the host the fault is made to (db-restart: -1, all of them)
    after_s: float  # seconds after the target first holds a trial
    length_s: float  # partition, slow link, database down (0 for host-kill)
    kbit: int  # slow-link only
    stop_mode: str  # db-restart only: fast | immediate
    patience_s: float  # the target's (db-restart: every host's) --storage-patience
    namespaces: bool


def parse_range(text: str) -> tuple[float, float]:
    low, _, high = text.partition("-")
    low_s, high_s = float(low), float(high or low)
    if not 0 <= low_s <= high_s:
        raise ValueError(text)
    return low_s, high_s


def draw_host_round(
    rng: random.Random,
    number: int,
    fault: str,
    partition: tuple[float, float],
    outage: tuple[float, float],
    namespaces: bool,
) -> HostDraw:
    hosts = rng.choice([2, 3])
    target = -1 if fault == "db-restart" else rng.randrange(hosts)
    if fault == "db-restart":
        length = 0.0 if rng.random() < 0.25 else rng.uniform(*outage)
    elif fault == "host-kill":
        length = 0.0
    else:
        length = rng.uniform(*partition)
    short = fault != "host-kill" and length >= 2 and rng.random() < 0.25
    return HostDraw(
        number,
        fault,
        hosts,
        target,
        round(rng.uniform(0.0, 2.0), 2),
        round(length, 1),
        rng.choice(SLOW_KBIT) if fault == "slow-link" else 0,
        rng.choice(["fast", "immediate"]) if fault == "db-restart" else "",
        round(max(1.0, length / 3), 1) if short else PATIENCE_S,
        namespaces,
    )


def _held_by(server_url: str, database: str, pid: int | None) -> bool:
    """Whether a RUNNING trial of the round's study is labelled with the worker `pid` (any: None)
    and has had a heartbeat. (A host killed between its ask and its first beat leaves trials the
    others retry only after the 120 s startup grace, which does not shrink with the interval:
    such rounds pass, slowly, so the faults wait for a beat.)"""
    import psycopg

    server, _, _ = server_url.rpartition("/")
    label = '"%:' + (str(pid) if pid is not None else "%") + '"'
    with contextlib.suppress(psycopg.Error), psycopg.connect(f"{server}/{database}", connect_timeout=5) as connection:
        row = connection.execute(
            "SELECT count(*) FROM trials t "
            "JOIN trial_user_attributes w ON w.trial_id = t.trial_id AND w.key = 'worker' "
            "JOIN trial_user_attributes b ON b.trial_id = t.trial_id AND b.key = 'heartbeat' "
            "WHERE t.state = 'RUNNING' AND w.value_json LIKE %s",
            (label,),
        ).fetchone()
        return bool(row and row[0])
    return False


def _wait_until_held(server_url: str, database: str, pid: int | None, processes: list[Any], guard_s: float) -> bool:
    """Poll until the target holds a trial; False when it never did (all ended, or the guard passed)."""
    deadline = time.monotonic() + guard_s
    while time.monotonic() < deadline and any(p.poll() is None for p in processes):
        if _held_by(server_url, database, pid):
            return True
        time.sleep(0.2)
    return False


def _host_env() -> dict[str, str]:
    return dict(env(), HFTA_NAS_HEARTBEAT=HEARTBEAT_S)


def _host_url(url: str, hosts: Any, i: int) -> str:
    return url.replace("@127.0.0.1:", f"@{hosts.gateway(i)}:") if hosts is not None else url


def _make_fault(draw: HostDraw, hosts: Any, server: Any, processes: list[Any]) -> str:
    """Make the draw's fault and undo it after its length; what was done."""
    i = draw.target
    if draw.fault == "host-kill":
        if hosts is not None:
            killed = hosts.kill(i)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(processes[i].pid, signal.SIGKILL)
            killed = 1
        return f"killed {killed} process(es) of host {i}"
    if draw.fault == "db-restart":
        server.stop(mode=draw.stop_mode)
        try:
            time.sleep(draw.length_s)  # the outage itself
        finally:
            server.start()
        return f"database stopped ({draw.stop_mode}) for {draw.length_s} s"
    if draw.fault == "partition":
        hosts.cut(i)
        try:
            time.sleep(draw.length_s)  # the partition itself
        finally:
            hosts.heal(i)
        return f"host {i} cut off for {draw.length_s} s"
    how = hosts.slow(i, draw.kbit)
    try:
        time.sleep(draw.length_s)  # the slow spell itself
    finally:
        hosts.fast(i)
    return f"host {i}'s link {how} for {draw.length_s} s"


def _host_exit_problems(draw: HostDraw, codes: list[int | None], folder: Path) -> list[str]:
    problems = []
    for i, code in enumerate(codes):
        log = (folder / f"host{i}.log").read_text(errors="replace")
        last = log.strip().splitlines()[-1] if log.strip() else ""
        if "Traceback" in log:
            problems.append(f"host {i}'s log holds a traceback:\n{log[-2500:]}")
        if code == 0:
            continue
        if code is None:
            problems.append(f"host {i} still ran after {HOST_GUARD_S} s (killed):\n{log[-2500:]}")
        elif draw.fault == "host-kill" and i == draw.target and code in (-signal.SIGKILL, 128 + signal.SIGKILL):
            continue
        elif code == 2 and draw.target in (i, -1) and draw.patience_s < PATIENCE_S:
            if not last.startswith("error: storage unreachable for"):
                problems.append(f"host {i} stopped with 2 but its last line is {last!r}")
        else:
            problems.append(f"host {i} exited with {code}:\n{log[-2500:]}")
    return problems


def run_host_round(
    draw: HostDraw, base: Path, server: Any, hosts: Any, reference: dict[str, Any], epochs: int = EPOCHS
) -> tuple[list[str], int, bool, dict[str, Any]]:
    """The round's broken invariants, how many results equal a clean run's, whether the fault found
    the target holding a trial, and what happened (exit codes, takeovers, the fault made)."""
    folder = base / f"round-{draw.round}"
    folder.mkdir()
    name = f"chaos{draw.round}"
    (folder / "space.yaml").write_text(space_text(name, epochs))
    url = storage_url("postgresql", folder, server.url, name)
    search = Draw(draw.round, "search", "postgresql", 1, "", "command", 0, 0)
    processes = []
    for i in range(draw.hosts):
        patience = draw.patience_s if draw.target in (i, -1) else PATIENCE_S
        argv = [*command(search, folder, _host_url(url, hosts, i)), "--storage-patience", f"{patience:g}"]
        with open(folder / f"host{i}.log", "wb") as stream:
            processes.append(
                subprocess.Popen(
                    hosts.wrap(i, argv) if hosts is not None else argv,
                    cwd=folder,
                    env=_host_env(),
                    stdout=stream,
                    stderr=subprocess.STDOUT,
                )
            )
    started, made, codes = time.monotonic(), "", []
    try:
        pid = processes[draw.target].pid if draw.target >= 0 else None
        held = _wait_until_held(server.url, name, pid, processes, 120)
        if held:
            time.sleep(draw.after_s)  # a drawn moment after the target took its trial
        made = _make_fault(draw, hosts, server, processes)
        for process in processes:
            try:
                codes.append(process.wait(timeout=max(1.0, HOST_GUARD_S - (time.monotonic() - started))))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        if hosts is not None:
            for i in range(draw.hosts):
                hosts.kill(i)
        if not server.running:
            server.start()
    problems = _host_exit_problems(draw, codes, folder)
    if hosts is not None:
        from benchmarks._netns import link_faults_left

        problems += link_faults_left(hosts, draw.hosts)
    with open(folder / "rerun.log", "wb") as stream:
        rerun = subprocess.run(
            command(search, folder, url),
            cwd=folder,
            env=_host_env(),
            stdout=stream,
            stderr=subprocess.STDOUT,
            timeout=900,
        )
    if rerun.returncode:
        problems.append(f"the re-run failed:\n{(folder / 'rerun.log').read_text(errors='replace')[-1500:]}")
        return problems, 0, held, {"codes": codes, "made": made}
    found, compared = search_problems(url, name, folder / "out", reference["search"])
    problems += found
    trials = optuna.load_study(study_name=name, storage=open_storage(url)[0]).get_trials(deepcopy=False)
    taken = [t.number for t in trials if str(t.user_attrs.get("interrupted_because", "")).startswith("no heartbeat")]
    logs = "".join((folder / f"host{i}.log").read_text(errors="replace") for i in range(draw.hosts))
    happened = {
        "codes": codes,
        "made": made,
        "taken_over": taken,
        "interrupted": sum(1 for t in trials if "interrupted_because" in t.user_attrs),
        "outage_lines": logs.count("storage unreachable since"),
        "gave_up": logs.count("error: storage unreachable for"),
    }
    if problems:
        for path in sorted(folder.glob("*.log")):
            problems.append(f"--- {path.name}:\n{path.read_text(errors='replace')[-2000:]}")
    return problems, compared, held, happened


def _prepare_server(server: Any, hosts: Any) -> None:
    """Let the hosts reach the server: it listens on their gateways too, trusting their subnet."""
    if hosts is None:
        return
    server.stop()
    with open(server.data / "pg_hba.conf", "a") as hba:
        hba.write(f"host all all {hosts.subnet} trust\n")
    server.options = server.options.replace(
        "listen_addresses=127.0.0.1", "listen_addresses=" + ",".join(["127.0.0.1", *hosts.gateways()])
    )
    server.start()


def _summary_by_fault(results: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for r in results:
        kind = r.get("fault", "signals")
        row = table.setdefault(kind, {"rounds": 0, "passed": 0, "failed": 0, "hit": 0, "taken_over": 0})
        row["rounds"] += 1
        row["failed" if r["problems"] else "passed"] += 1
        row["hit"] += bool(r.get("signal_hit", r.get("fault_hit")))
        row["taken_over"] += bool(r.get("taken_over"))
    return table


def _stop_round(
    fault: str,
    rng: random.Random,
    number: int,
    storages: list[str],
    base: Path,
    postgres: str | None,
    reference: dict[str, Any],
    epochs: int,
) -> tuple[dict[str, Any], list[str], int, str, str]:
    """One SIGTERM or full-disk round: its record, problems, results compared, and what to print."""
    if fault == "sigterm":
        from benchmarks._chaos_sigterm import draw_sigterm_round, run_sigterm_round

        draw = draw_sigterm_round(rng, number, storages)
        problems, compared, hit, resumed = run_sigterm_round(draw, base, postgres, reference, epochs)
        what = f"SIGTERM {draw.command} {draw.storage} workers={draw.workers} ->{draw.target} +{draw.after_s}s"
        extra = (" [continued mid-array from a checkpoint]" if resumed else "") + (
            "" if hit else " [no array was part-way when it was sent]"
        )
        record = {"fault": fault, **asdict(draw), "signal_hit": hit, "resumed_mid_array": resumed}
        return record, problems, compared, what, extra
    from benchmarks._chaos_disk import draw_disk_round, run_disk_round

    disk = draw_disk_round(rng, number, storages)
    problems, compared, filled = run_disk_round(disk, base, postgres, reference, epochs)
    extra = "" if filled else " [the disk held every file: nothing filled it]"
    record = {"fault": fault, **asdict(disk), "fault_hit": filled, "resumed_mid_array": False}
    return record, problems, compared, f"full disk {disk.command} {disk.storage} {disk.free_kib} KiB free", extra


def _unmount_left(base: Path) -> None:
    """Unmount the small disks a round left under `base` (one that crashed mid-round)."""
    from benchmarks._chaos_disk import mounts_under, unmount

    for point in mounts_under(base):
        unmount(point)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0, help="draws the rounds")
    parser.add_argument("--storages", default=",".join(STORAGES), help="from journal, sqlite, postgresql")
    parser.add_argument(
        "--faults",
        default="signals",
        help="from signals (the kill/stop/interrupt rounds), network (partition, slow-link, host-kill), "
        "database (db-restart), or those kinds by name [signals]",
    )
    parser.add_argument(
        "--partition-seconds",
        default="6-24",
        help="a partition's (and a slow spell's) length, drawn from MIN-MAX seconds [6-24: one to four "
        "heartbeat graces at HFTA_NAS_HEARTBEAT=2; the issue's 30-120 s are these at the default 10 s]",
    )
    parser.add_argument(
        "--outage-seconds", default="0-24", help="how long the database stays down, MIN-MAX seconds [0-24]"
    )
    parser.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="start no round after this many minutes (the count says how many ran) [no limit]",
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep every round's folder here")
    parser.add_argument(
        "--epochs",
        type=int,
        default=EPOCHS,
        help=f"epochs of every model [{EPOCHS}]; more make a signal land mid-array more often",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the draws and results here")
    args = parser.parse_args(argv)
    storages = [s for s in args.storages.split(",") if s]
    if not storages or set(storages) - set(STORAGES) or args.rounds < 1 or args.epochs < 1:
        parser.error(f"--storages takes some of {','.join(STORAGES)}; --rounds and --epochs must be positive")
    faults: list[str] = []
    for word in (w for w in args.faults.split(",") if w):
        if word not in FAULT_GROUPS and word not in FAULTS:
            names = ", ".join(dict.fromkeys([*FAULT_GROUPS, *FAULTS]))
            parser.error(f"--faults takes some of {names}, not {word!r}")
        faults += [f for f in FAULT_GROUPS.get(word, (word,)) if f not in faults]
    try:
        partition, outage = parse_range(args.partition_seconds), parse_range(args.outage_seconds)
    except ValueError as error:
        parser.error(f"--partition-seconds and --outage-seconds take MIN-MAX seconds, e.g. 6-24: {error}")
    if not faults:
        parser.error("--faults names no fault")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    load_at_start = [round(v, 2) for v in os.getloadavg()]
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="hfta-nas-chaos-")) if args.keep is None else args.keep
    base.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    notes: list[str] = []
    with contextlib.ExitStack() as stack:
        postgres = server = hosts = None
        host_faults = [f for f in faults if f not in ONE_HOST]
        if host_faults:
            from benchmarks import _netns
            from benchmarks._postgres import Unavailable, throwaway_server

            try:
                server = stack.enter_context(throwaway_server("hfta_nas_chaos"))
            except Unavailable as why:
                print(f"chaos: no PostgreSQL ({why}); no network or database faults", flush=True)
                notes.append(f"no PostgreSQL: {why}")
                host_faults = []
            if host_faults and any(f in FAULT_GROUPS["network"] for f in host_faults):
                why_not = _netns.why_not()
                if why_not is None:
                    hosts = stack.enter_context(_netns.Hosts(3))
                    _prepare_server(server, hosts)
                else:
                    print(f"chaos: no network namespaces ({why_not}); the database faults alone", flush=True)
                    notes.append(f"no network namespaces: {why_not}")
                    host_faults = [f for f in host_faults if f not in FAULT_GROUPS["network"]]
            faults = [f for f in faults if f in ONE_HOST or f in host_faults]
            if not faults:
                print("chaos: no fault can be made here", flush=True)
                return 1
        if "disk-full" in faults:
            from benchmarks import _chaos_disk

            why_not = _chaos_disk.why_not()
            if why_not is not None:
                print(f"chaos: no full-disk rounds: {why_not}", flush=True)
                notes.append(f"no full-disk rounds: {why_not}")
                faults.remove("disk-full")
            stack.callback(_unmount_left, base)
        if not faults:
            print("chaos: no fault can be made here", flush=True)
            return 1
        if set(ONE_HOST) & set(faults) and "postgresql" in storages:
            from benchmarks._postgres import Unavailable, throwaway_postgres

            try:
                postgres = stack.enter_context(throwaway_postgres("hfta_nas_chaos"))
            except Unavailable as why:
                print(f"chaos: no PostgreSQL ({why}); journal and SQLite only", flush=True)
                storages.remove("postgresql")
        reference = references(base, args.epochs, pbt=bool({"sigterm", "disk-full"} & set(faults)))
        run_started = time.monotonic()
        for number in range(1, args.rounds + 1):
            if args.minutes is not None and time.monotonic() - run_started > 60 * args.minutes:
                print(f"chaos: {args.minutes:g} minutes passed; {number - 1} of {args.rounds} rounds ran", flush=True)
                notes.append(f"stopped after {args.minutes:g} minutes: {number - 1} of {args.rounds} rounds ran")
                break
            fault = "signals" if faults == ["signals"] else rng.choice(faults)
            started = time.monotonic()
            if fault == "signals":
                draw = draw_round(rng, number, storages)
                problems, compared, hit, resumed = run_round(draw, base, postgres, reference, args.epochs)
                record = {"fault": "signals", **asdict(draw), "signal_hit": hit, "resumed_mid_array": resumed}
                what = (
                    f"{draw.command} {draw.storage} workers={draw.workers} {draw.signal}->{draw.target} at {draw.at_s}s"
                )
                verdict_extra = (" [continued mid-array from a checkpoint]" if resumed else "") + (
                    "" if hit else " [the command had ended before the signal]"
                )
            elif fault in ("sigterm", "disk-full"):
                record, problems, compared, what, verdict_extra = _stop_round(
                    fault, rng, number, storages, base, postgres, reference, args.epochs
                )
            else:
                host_draw = draw_host_round(rng, number, fault, partition, outage, hosts is not None)
                problems, compared, hit, happened = run_host_round(
                    host_draw, base, server, hosts, reference, args.epochs
                )
                record = {**asdict(host_draw), "fault_hit": hit, "resumed_mid_array": False, **happened}
                target = "every host" if host_draw.target < 0 else f"host {host_draw.target}"
                what = (
                    f"{fault} {target} of {host_draw.hosts} ({happened.get('made', '')}), "
                    f"patience {host_draw.patience_s:g} s"
                )
                verdict_extra = (
                    f" [exits {happened.get('codes')}, {len(happened.get('taken_over', []))} taken over]"
                    + ("" if hit else " [the target held no trial when the fault came]")
                )
            record.update(
                {
                    "seconds": round(time.monotonic() - started, 1),
                    "problems": problems,
                    "compared_with_clean_run": compared,
                }
            )
            results.append(record)
            verdict = (
                f"ok ({compared} results equal a clean run's)" if not problems else "FAILED: " + "; ".join(problems)
            )
            print(f"round {number}: {what}: {verdict}{verdict_extra}", flush=True)
    if hosts is not None:
        from benchmarks._netns import leftovers

        left = leftovers()
        if left:
            print(f"chaos: left after the run (namespaces, veths): {left}", flush=True)
            notes.append(f"left after the run: {left}")
    if args.keep is None:
        shutil.rmtree(base, ignore_errors=True)
    by_fault = _summary_by_fault(results)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "seed": args.seed,
                    "epochs": args.epochs,
                    "faults": faults,
                    "partition_seconds": args.partition_seconds,
                    "outage_seconds": args.outage_seconds,
                    "heartbeat_s": float(HEARTBEAT_S),
                    "load_average_at_start": load_at_start,
                    "load_average_at_end": [round(v, 2) for v in os.getloadavg()],
                    "versions": package_versions(),
                    "notes": notes,
                    "by_fault": by_fault,
                    "rounds": results,
                },
                indent=2,
            )
            + "\n"
        )
    failed = sum(1 for r in results if r["problems"])
    hit = sum(1 for r in results if r.get("signal_hit") or r.get("fault_hit"))
    resumed = sum(1 for r in results if r["resumed_mid_array"])
    if faults != ["signals"]:
        for kind, row in by_fault.items():
            print(
                f"chaos: {kind}: {row['rounds']} rounds ({row['hit']} hit mid-run, {row['taken_over']} with a "
                f"takeover), {row['passed']} passed, {row['failed']} failed"
            )
    print(
        f"chaos: {len(results)} rounds ({hit} signalled mid-run, {resumed} continued mid-array), "
        f"{len(results) - failed} passed, {failed} failed"
    )
    return 1 if failed or any(n.startswith("left after") for n in notes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
