"""Hosts on one machine: network namespaces joined to the root namespace by veth pairs, for the
chaos script's network faults (`python -m benchmarks.chaos --faults network,database`).

`Hosts(count)` makes `count` namespaces, each with one veth pair: the root end holds
10.231.K.(4i+1)/30, the host's end 10.231.K.(4i+2)/30 (K: a /24 no other address of this
machine uses). A host reaches a server in the root namespace at `gateway(i)`, its root end's
address; nothing is routed between hosts. Commands run in a host with `wrap(i, argv)`, under
their own host name (a UTS namespace), so a search's workers there are on another machine
as its heartbeats tell machines apart (hostname and PID namespace): their trials go stale
by their heartbeats' age, not because a PID is gone.

The faults, each undone by its pair:

- `cut(i)` / `heal(i)`: a partition. The root end of the host's veth goes down, so the host's
  packets vanish without an error (its end stays up, with its address and route). iptables
  and tc filters (matchall, u32 with a drop action) and netem are missing on the machine
  this was written on; a link going down is what the kernel offers everywhere.
- `slow(i, kbit)` / `fast(i)`: a slow link: a token bucket (tc tbf) of `kbit` each way,
  queueing up to 2 s (more is dropped: TCP retransmits). netem's delay and loss are used
  instead when the kernel has them (`slow(..., delay_ms=...)`).
- `kill(i)`: every process in the host's namespace gets SIGKILL (`ip netns pids`).

Everything made is named `hfcx<tag>…` (tag: this process's id in base 36) and removed on
`close()` (also after an error: use `with Hosts(...)`); `sweep()` removes what a crashed run
left, named for a process that is gone. `why_not()` says in one line why no namespace can be
made here (not root, no `ip`, or the kernel refused), or None.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

PREFIX = "hfcx"
LOCK = Path(tempfile.gettempdir()) / "hfta-nas-netns.lock"
SUBNETS = ipaddress.ip_network("10.231.0.0/16")
QUEUE_MS = 2000  # a slow link's queue: beyond it packets are dropped


def _base36(number: int) -> str:
    digits = ""
    while True:
        number, rest = divmod(number, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[rest] + digits
        if not number:
            return digits


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and done.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {(done.stderr or done.stdout).strip()}")
    return done


def why_not() -> str | None:
    """Why no network namespace can be made here (one line), or None when one can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (ip netns, veth pairs, tc)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing (iproute2 / util-linux)"
    probe = f"{PREFIX}{_base36(os.getpid())}probe"
    try:
        _run("ip", "netns", "add", probe)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
        return f"the kernel refused a network namespace: {error}"
    finally:
        _run("ip", "netns", "delete", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(keep: str | None = None) -> list[str]:
    """Remove the namespaces and veths a run whose process is gone left behind (not `keep`'s);
    what was removed."""
    removed = []
    pattern = re.compile(rf"^{PREFIX}([0-9a-z]+)h\d+[rn]?$")
    names = _run("ip", "netns", "list", check=False).stdout.split()
    links = re.findall(rf"^\d+: ({PREFIX}[0-9a-z]+h\d+r)[@:]", _run("ip", "-o", "link", check=False).stdout, re.M)
    for name in [n for n in names if n.startswith(PREFIX)] + links:
        match = pattern.match(name)
        tag = match.group(1) if match else None
        if tag is None or tag == keep or _alive(int(tag, 36)):
            continue
        kind = "link" if name.endswith("r") else "netns"
        if kind == "netns":
            for pid in _run("ip", "netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _run("ip", "netns", "delete", name, check=False)
        else:
            _run("ip", "link", "delete", name, check=False)
        removed.append(name)
    return removed


def leftovers() -> list[str]:
    """The namespaces and root-side veths of this process still present (none after `close()`)."""
    mine = f"{PREFIX}{_base36(os.getpid())}h"
    names = _run("ip", "netns", "list", check=False).stdout.split()
    links = re.findall(r"^\d+: ([^@:\s]+)", _run("ip", "-o", "link", check=False).stdout, re.M)
    return [n for n in [*names, *links] if n.startswith(mine)]


def link_faults_left(hosts: Hosts, count: int) -> list[str]:
    """Host links still down, or still shaped, after a fault was undone."""
    left = []
    for i in range(count):
        flags = re.search(r"<([^>]*)>", _run("ip", "-o", "link", "show", hosts.root_end(i), check=False).stdout)
        if flags is None or "UP" not in flags.group(1).split(","):
            left.append(f"{hosts.root_end(i)} is down")
        for end, inside in ((hosts.root_end(i), ()), (hosts.host_end(i), ("ip", "netns", "exec", hosts.namespace(i)))):
            for qdisc in _run(*inside, "tc", "qdisc", "show", "dev", end, check=False).stdout.splitlines():
                if qdisc.split()[1:2] in (["tbf"], ["netem"]):
                    left.append(f"{end} keeps {qdisc.strip()}")
    return left


def _free_subnet() -> ipaddress.IPv4Network:
    used = [ipaddress.ip_interface(a).ip for a in re.findall(r"inet (\S+)", _run("ip", "-o", "-4", "addr").stdout)]
    for subnet in SUBNETS.subnets(new_prefix=24):
        if subnet.network_address.packed[2] and not any(ip in subnet for ip in used):
            return subnet
    raise RuntimeError(f"no free /24 in {SUBNETS} for the hosts' links")


class Hosts:
    """`count` hosts (network namespaces) with a veth pair each to the root namespace."""

    def __init__(self, count: int) -> None:
        self.tag = _base36(os.getpid())
        self.count = count
        self.made_ns: list[str] = []
        self.made_links: list[str] = []
        sweep(keep=self.tag)
        try:
            with open(LOCK, "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # two runs starting together take different subnets
                self.subnet = _free_subnet()
                for i in range(count):
                    self._make(i)
        except BaseException:
            self.close()
            raise

    def namespace(self, i: int) -> str:
        return f"{PREFIX}{self.tag}h{i}"

    def root_end(self, i: int) -> str:
        return f"{PREFIX}{self.tag}h{i}r"

    def host_end(self, i: int) -> str:
        return f"{PREFIX}{self.tag}h{i}n"

    def gateway(self, i: int) -> str:
        """The root end's address: where host `i` reaches a server of the root namespace."""
        return str(self.subnet.network_address + 4 * i + 1)

    def address(self, i: int) -> str:
        return str(self.subnet.network_address + 4 * i + 2)

    def gateways(self) -> list[str]:
        return [self.gateway(i) for i in range(self.count)]

    def _make(self, i: int) -> None:
        ns, root, host = self.namespace(i), self.root_end(i), self.host_end(i)
        _run("ip", "netns", "add", ns)
        self.made_ns.append(ns)
        _run("ip", "link", "add", root, "type", "veth", "peer", "name", host)
        self.made_links.append(root)
        _run("ip", "link", "set", host, "netns", ns)
        _run("ip", "addr", "add", f"{self.gateway(i)}/30", "dev", root)
        _run("ip", "link", "set", root, "up")
        inside = ("ip", "netns", "exec", ns)
        _run(*inside, "ip", "addr", "add", f"{self.address(i)}/30", "dev", host)
        _run(*inside, "ip", "link", "set", host, "up")
        _run(*inside, "ip", "link", "set", "lo", "up")

    def wrap(self, i: int, argv: list[str]) -> list[str]:
        """`argv` run in host `i`, under the host name `host<i>`."""
        script = 'hostname "$0" && exec "$@"'
        return ["ip", "netns", "exec", self.namespace(i), "unshare", "--uts", "sh", "-c", script, f"host{i}", *argv]

    # ------------------------------------------------------------------ faults
    def cut(self, i: int) -> None:
        _run("ip", "link", "set", self.root_end(i), "down")

    def heal(self, i: int) -> None:
        _run("ip", "link", "set", self.root_end(i), "up")

    def slow(self, i: int, kbit: int, delay_ms: int = 0) -> str:
        """Slow host `i`'s link both ways; how (netem when the kernel has it and a delay is asked, else tbf)."""
        how = None
        if delay_ms:
            how = ["netem", "delay", f"{delay_ms}ms", "rate", f"{kbit}kbit"]
            if _run("tc", "qdisc", "add", "dev", self.root_end(i), "root", *how, check=False).returncode:
                how = None
            else:
                _run(
                    "ip",
                    "netns",
                    "exec",
                    self.namespace(i),
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    self.host_end(i),
                    "root",
                    *how,
                )
        if how is None:
            burst = max(1600, kbit * 1000 // 8 // 50)  # 20 ms worth, at least a packet
            how = ["tbf", "rate", f"{kbit}kbit", "burst", str(burst), "latency", f"{QUEUE_MS}ms"]
            _run("tc", "qdisc", "add", "dev", self.root_end(i), "root", *how)
            _run("ip", "netns", "exec", self.namespace(i), "tc", "qdisc", "add", "dev", self.host_end(i), "root", *how)
        return " ".join(how)

    def fast(self, i: int) -> None:
        _run("tc", "qdisc", "del", "dev", self.root_end(i), "root", check=False)
        _run(
            "ip", "netns", "exec", self.namespace(i), "tc", "qdisc", "del", "dev", self.host_end(i), "root", check=False
        )

    def pids(self, i: int) -> list[int]:
        return [int(p) for p in _run("ip", "netns", "pids", self.namespace(i), check=False).stdout.split()]

    def kill(self, i: int) -> int:
        """SIGKILL every process in host `i`; how many."""
        killed = 0
        for pid in self.pids(i):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        return killed

    def close(self) -> None:
        """Kill what still runs in the hosts and remove every namespace and veth (a veth's qdiscs go with it)."""
        for ns in self.made_ns:
            for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        for link in self.made_links:
            _run("ip", "link", "delete", link, check=False)
        for ns in self.made_ns:
            _run("ip", "netns", "delete", ns, check=False)
        self.made_links, self.made_ns = [], []

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def hosts(count: int) -> Iterator[Hosts]:
    with Hosts(count) as made:
        yield made
