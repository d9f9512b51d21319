"""Machines on one machine: network namespaces on a bridge, for tests of a job
spread over a cluster (issue 42).

A testbed of N machines is N network namespaces (`<name>-m0`, `<name>-m1`,
...), each with `lo` up and an `eth0` (a veth pair) plugged into a bridge
that lives in a namespace of its own (`<name>-sw`, the switch): the root
namespace of this machine is never touched (no interface, address or route
is added there). Addresses come from 198.18.0.0/15 (RFC 2544, benchmarking):
each testbed takes a /24 of its own, 198.18.K.0/24 or 198.19.K.0/24, and its
machine i is .(i + 1), so that several testbeds (pytest-xdist workers) run at
once. Making the switch namespace `kebtbK-sw` is what claims the /24 K
(`ip netns add` fails when it exists).

Every machine sees the same files (namespaces share the file system), so a
job directory under /tmp is a shared mount; only the network is per machine.

Faults:

- `cut(i)`: machine i's cable is pulled at the switch (its port leaves the
  bridge): every packet to or from it is dropped in silence, as in a real
  partition (calls hang until their deadlines, no connection is refused);
  `heal(i)` plugs it back.
- `partition(i, j, port=None)`: machines i and j cannot reach each other,
  both directions (blackhole routes in each; the others still reach both);
  with `port`, only the TCP traffic to `port` on j (and from it back) is
  dropped (`ip rule ... dport/sport ... blackhole`): a worker on i that
  reaches the master on j but not its parameter server, when both serve at
  j's address. `unpartition(i, j)` removes it.
- `shape(i, rate)`: machine i's link (both directions) is limited to `rate`
  with a token bucket (`tc qdisc ... tbf`); netem (delay, loss) is not in
  every kernel, tbf is.

Clean-up: `Testbed` is a context manager; `down()` kills what still runs in
its machines (by pid, from `ip netns pids`) and deletes the namespaces (the
veths and the bridge go with them); an atexit hook does the same if the
process ends without it, and `clean()` removes the testbeds whose owner
process is dead (a test run killed by SIGKILL). The owner and the machines
are recorded in STATE_DIR/<name>.json.

Example (root only):

    with Testbed(2) as bed:
        bed.run(1, ["ping", "-c1", bed.address(0)])
        bed.cut(1)
"""

from __future__ import annotations

import atexit
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

PREFIX = "kebtb"
STATE_DIR = "/run/keras_elastic_testbeds"
# 198.18.0.0/15: 512 /24s.
SUBNETS = 512
_NAME = re.compile(rf"^({PREFIX}\d+)-(sw|m\d+)$")


class TestbedError(RuntimeError):
    pass


def _ip(*args: str, ns: str | None = None, check: bool = True
        ) -> subprocess.CompletedProcess:
    argv = ["ip", *(("-n", ns) if ns else ()), *args]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise TestbedError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def _tc(ns: str, *args: str) -> subprocess.CompletedProcess:
    argv = ["ip", "netns", "exec", ns, "tc", *args]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise TestbedError(f"{' '.join(argv)}: {proc.stderr.strip()}")
    return proc


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can). Makes and
    removes a namespace to find out."""
    if os.geteuid() != 0:
        return "network namespaces need root (this process's euid is " \
               f"{os.geteuid()})"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) on PATH"
    name = f"{PREFIX}probe{os.getpid()}"
    proc = _ip("netns", "add", name, check=False)
    if proc.returncode != 0:
        return f"`ip netns add` fails here: {proc.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


def has_tbf(bed: Testbed) -> bool:
    """Whether the kernel has the tbf qdisc (tried on the switch)."""
    proc = subprocess.run(["ip", "netns", "exec", bed.switch, "tc", "qdisc", "add",
                           "dev", "lo", "root", "tbf", "rate", "1gbit", "burst",
                           "64kb", "latency", "50ms"], capture_output=True)
    if proc.returncode != 0:
        return False
    subprocess.run(["ip", "netns", "exec", bed.switch, "tc", "qdisc", "del", "dev",
                    "lo", "root"], capture_output=True)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    proc = _ip("netns", "list", check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


class Testbed:
    """N machines (network namespaces) on a switch; see the module docstring.
    `owner`: the pid whose death makes the testbed a leftover for `clean()`
    (default: this process; 0: kept until `down`, for the command line)."""

    def __init__(self, n: int, owner: int | None = None) -> None:
        if not 1 <= n <= 250:
            raise ValueError(f"a testbed has 1 to 250 machines, not {n}")
        self.n = n
        self.owner = os.getpid() if owner is None else owner
        self.index: int | None = None
        self.name = ""
        self._cut: set[int] = set()
        self._partitions: list[tuple[int, int, int | None]] = []
        self._downed = False

    # -- naming --------------------------------------------------------
    @property
    def switch(self) -> str:
        return f"{self.name}-sw"

    def machine(self, i: int) -> str:
        """The namespace of machine i."""
        self._check(i)
        return f"{self.name}-m{i}"

    def address(self, i: int) -> str:
        self._check(i)
        assert self.index is not None
        return f"198.{18 + self.index // 256}.{self.index % 256}.{i + 1}"

    @property
    def subnet(self) -> str:
        assert self.index is not None
        return f"198.{18 + self.index // 256}.{self.index % 256}.0/24"

    def _check(self, i: int) -> None:
        if not 0 <= i < self.n:
            raise IndexError(f"machine {i}: the testbed has machines 0..{self.n - 1}")

    # -- life ----------------------------------------------------------
    def up(self) -> Testbed:
        reason = None if os.geteuid() == 0 else "needs root"
        if reason:
            raise TestbedError(reason)
        start = random.Random(os.getpid() ^ time.monotonic_ns()).randrange(SUBNETS)
        for k in range(SUBNETS):
            index = (start + k) % SUBNETS
            name = f"{PREFIX}{index}"
            if _ip("netns", "add", f"{name}-sw", check=False).returncode == 0:
                self.index, self.name = index, name
                break
        else:
            raise TestbedError(f"all {SUBNETS} testbed subnets are taken "
                               f"(`{__name__} clean` removes dead ones)")
        self._save()
        atexit.register(self.down)
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        sw = self.switch
        _ip("link", "set", "lo", "up", ns=sw)
        _ip("link", "add", "br0", "type", "bridge", ns=sw)
        _ip("link", "set", "br0", "up", ns=sw)
        for i in range(self.n):
            m = self.machine(i)
            _ip("netns", "add", m)
            # Both ends are made in the switch's namespace, then one moves:
            # the root namespace never holds either.
            _ip("link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0",
                "netns", m, ns=sw)
            _ip("link", "set", f"p{i}", "master", "br0", "up", ns=sw)
            _ip("link", "set", "lo", "up", ns=m)
            _ip("addr", "add", f"{self.address(i)}/24", "dev", "eth0", ns=m)
            _ip("link", "set", "eth0", "up", ns=m)

    def _state_file(self) -> str:
        return os.path.join(STATE_DIR, f"{self.name}.json")

    def _save(self) -> None:
        os.makedirs(STATE_DIR, exist_ok=True)
        with open(self._state_file() + ".tmp", "w") as f:
            json.dump({"name": self.name, "index": self.index, "n": self.n,
                       "owner": self.owner, "subnet": self.subnet,
                       "machines": [self.address(i) for i in range(self.n)]}, f)
        os.replace(self._state_file() + ".tmp", self._state_file())

    @classmethod
    def attach(cls, name: str) -> Testbed:
        """The testbed `name` made by another process (the command line)."""
        with open(os.path.join(STATE_DIR, f"{name}.json")) as f:
            state = json.load(f)
        bed = cls(state["n"], owner=state["owner"])
        bed.index, bed.name = state["index"], state["name"]
        return bed

    def down(self) -> None:
        """Kills what runs in the machines, removes the namespaces."""
        if self._downed or not self.name:
            return
        self._downed = True
        atexit.unregister(self.down)
        remove_testbed(self.name)

    def __enter__(self) -> Testbed:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # -- running -------------------------------------------------------
    def argv(self, i: int, argv: list[str]) -> list[str]:
        """`argv` run in machine i."""
        return ["ip", "netns", "exec", self.machine(i), *argv]

    def popen(self, i: int, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.argv(i, argv), **kwargs)

    def run(self, i: int, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.argv(i, argv), **kwargs)

    def pids(self, i: int) -> list[int]:
        """The processes running in machine i."""
        proc = _ip("netns", "pids", self.machine(i), check=False)
        return [int(p) for p in proc.stdout.split()]

    def commands(self, i: int) -> dict[int, list[str]]:
        """The processes running in machine i: {pid: argv} (those that ended
        while read are left out)."""
        found = {}
        for pid in self.pids(i):
            try:
                with open(f"/proc/{pid}/cmdline") as f:
                    found[pid] = f.read().split("\0")
            except OSError:
                continue
        return found

    def reaches(self, i: int, j: int, port: int = 9, timeout: float = 1.0) -> bool:
        """Whether machine i gets an answer from machine j: a TCP connection
        to `port` is accepted or refused (an answer either way) within
        `timeout`, not dropped or unroutable."""
        code = ("import socket, sys\n"
                "s = socket.socket(); s.settimeout(float(sys.argv[3]))\n"
                "try: s.connect((sys.argv[1], int(sys.argv[2])))\n"
                "except ConnectionRefusedError: pass\n"
                "except OSError: sys.exit(1)\n")
        return self.run(i, [sys.executable, "-c", code, self.address(j), str(port),
                            str(timeout)]).returncode == 0

    # -- faults --------------------------------------------------------
    def cut(self, i: int) -> None:
        """Pulls machine i's cable: its switch port leaves the bridge."""
        _ip("link", "set", f"p{self._port(i)}", "nomaster", ns=self.switch)
        self._cut.add(i)

    def heal(self, i: int) -> None:
        """Plugs machine i back in (and ends its partitions)."""
        _ip("link", "set", f"p{self._port(i)}", "master", "br0", ns=self.switch)
        self._cut.discard(i)
        for a, b, port in list(self._partitions):
            if i in (a, b):
                self.unpartition(a, b, port)

    def _port(self, i: int) -> int:
        self._check(i)
        return i

    def partition(self, i: int, j: int, port: int | None = None) -> None:
        """i and j cannot reach each other (both directions); with `port`,
        only TCP to `port` on j (and its answers) is dropped."""
        self.rules("add", i, j, port)
        self._partitions.append((i, j, port))

    def unpartition(self, i: int, j: int, port: int | None = None) -> None:
        self.rules("del", i, j, port)
        self._partitions.remove((i, j, port))

    def rules(self, op: str, i: int, j: int, port: int | None) -> None:
        a, b = self.address(i), self.address(j)
        if port is None:
            _ip("route", op, "blackhole", f"{b}/32", ns=self.machine(i))
            _ip("route", op, "blackhole", f"{a}/32", ns=self.machine(j))
            return
        _ip("rule", op, "to", b, "ipproto", "tcp", "dport", str(port), "blackhole",
            ns=self.machine(i))
        _ip("rule", op, "to", a, "ipproto", "tcp", "sport", str(port), "blackhole",
            ns=self.machine(j))

    def shape(self, i: int, rate: str = "1gbit", burst: str = "256kb",
              latency: str = "100ms") -> None:
        """Machine i's link, both directions, at most `rate` (tbf)."""
        for ns, dev in ((self.machine(i), "eth0"), (self.switch, f"p{i}")):
            _tc(ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                "burst", burst, "latency", latency)

    def unshape(self, i: int) -> None:
        for ns, dev in ((self.machine(i), "eth0"), (self.switch, f"p{i}")):
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev",
                            dev, "root"], capture_output=True)


def remove_testbed(name: str) -> None:
    """Removes testbed `name`: kills its machines' processes (by pid), deletes
    its namespaces and its state file."""
    spaces = [ns for ns in _namespaces() if (m := _NAME.match(ns)) and m[1] == name]
    machines = [ns for ns in spaces if not ns.endswith("-sw")]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [int(p) for ns in machines
                for p in _ip("netns", "pids", ns, check=False).stdout.split()]
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 3
        while pids and time.monotonic() < deadline and any(map(_alive, pids)):
            time.sleep(0.05)
    for ns in machines + [ns for ns in spaces if ns.endswith("-sw")]:
        _ip("netns", "del", ns, check=False)
    try:
        os.remove(os.path.join(STATE_DIR, f"{name}.json"))
    except FileNotFoundError:
        pass


def testbeds() -> dict[str, dict]:
    """The testbeds present: name -> state (owner, machines; {} when its state
    file is missing)."""
    found: dict[str, dict] = {}
    for ns in _namespaces():
        m = _NAME.match(ns)
        if m:
            found.setdefault(m[1], {})
    if os.path.isdir(STATE_DIR):
        for entry in os.listdir(STATE_DIR):
            if entry.endswith(".json"):
                try:
                    with open(os.path.join(STATE_DIR, entry)) as f:
                        state = json.load(f)
                except (OSError, ValueError):
                    continue
                found[state["name"]] = state
    return found


def clean(everything: bool = False) -> list[str]:
    """Removes the testbeds whose owner process is dead (all of them with
    `everything`; a command line's, owner 0, only then). Returns their
    names."""
    removed = []
    for name, state in sorted(testbeds().items()):
        owner = state.get("owner")
        if everything or owner is None or (owner and not _alive(owner)):
            remove_testbed(name)
            removed.append(name)
    return removed
