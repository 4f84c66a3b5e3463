"""Where the test suite's CPU goes: a pytest plugin that sums, per test, the CPU time of the pytest process (an xdist
worker) and every process below it (Ray's daemons and workers, CLI subprocesses), read from /proc every 0.3 s.

    PYTHONPATH=benchmarks python -m pytest tests -n 2 -p suite_cpu          # Linux only

At the end each worker appends its rows (CPU-s, wall-s, test id) to $SUITE_CPU_OUT (default suite_cpu.tsv), and the
controller prints the modules' totals. On 2 busy cores the suite's wall time follows its CPU-seconds, not its
test-seconds (docs/suite.md). A process reaped within the tree is charged in full (its parent's cutime); an orphan
loses at most its last 0.3 s, and so does a child of a parent that ignores SIGCHLD (Ray's raylet: the kernel reaps
its workers and adds nothing to its cutime).
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from pathlib import Path

import pytest

TICKS = os.sysconf("SC_CLK_TCK")
OUT = Path(os.environ.get("SUITE_CPU_OUT", "suite_cpu.tsv")).resolve()  # before any test changes directory


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _auto_reaps(pid: int) -> bool:
    """Whether `pid` ignores SIGCHLD: then the kernel reaps its children and their CPU never reaches its cutime."""
    try:
        ignored = next(line for line in _read(f"/proc/{pid}/status").splitlines() if line.startswith("SigIgn:"))
    except (OSError, StopIteration):
        return False
    return bool(int(ignored.split()[1], 16) & (1 << (signal.SIGCHLD - 1)))


class _Tree:
    """The CPU this process and every process below it have used, as of the last read. Each process is read with
    its reaped children's CPU (utime + stime + cutime + cstime), so a child that ends and is reaped by a process of
    the tree is charged in full, however short its last moment was; one that ends where no process of the tree
    reaps it (an orphan, or a child of a parent that ignores SIGCHLD: every Ray worker below a raylet) is charged
    what it had used when last seen."""

    def __init__(self) -> None:
        self.root = os.getpid()
        self.live: dict = {}  # (pid, start time) -> (parent pid, CPU-s with its reaped children)
        self.orphaned = 0.0
        self.lock = threading.Lock()

    def scan(self) -> None:
        procs = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                stat = _read(f"/proc/{name}/stat")
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            cpu = sum(int(f) for f in fields[11:15]) / TICKS  # utime, stime, cutime, cstime
            procs[int(name)] = (int(fields[1]), cpu, fields[19])
        below, grew = {self.root}, True
        while grew:
            grew = False
            for pid, (parent, _, _) in procs.items():
                if parent in below and pid not in below:
                    below.add(pid)
                    grew = True
        now = {(pid, procs[pid][2]): procs[pid][:2] for pid in below & procs.keys()}
        with self.lock:
            alive = {pid for pid, _ in now}
            for key, (parent, cpu) in self.live.items():
                # ended with no process of the tree left to reap it, or below one that does not collect its CPU
                if key not in now and (parent not in alive or _auto_reaps(parent)):
                    self.orphaned += cpu
            self.live = now

    def total(self) -> float:
        self.scan()
        with self.lock:
            return self.orphaned + sum(cpu for _, cpu in self.live.values())


_tree = _Tree()
_rows: list = []


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist): a fresh file
        OUT.unlink(missing_ok=True)


def _scan_forever() -> None:
    while True:
        _tree.scan()
        time.sleep(0.3)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not any(t.name == "suite_cpu" for t in threading.enumerate()):  # where tests run, from the first
        threading.Thread(target=_scan_forever, daemon=True, name="suite_cpu").start()
    cpu, wall = _tree.total(), time.time()
    yield
    _rows.append((_tree.total() - cpu, time.time() - wall, item.nodeid))


def pytest_sessionfinish(session):
    if _rows:  # a worker (or a run without xdist): its rows
        with open(OUT, "a") as f:
            f.writelines(f"{cpu:.1f}\t{wall:.1f}\t{nodeid}\n" for cpu, wall, nodeid in _rows)


def pytest_terminal_summary(terminalreporter):
    if not OUT.exists() or hasattr(terminalreporter.config, "workerinput"):
        return
    modules: dict = collections.defaultdict(float)
    for line in OUT.read_text().splitlines():
        cpu, _, nodeid = line.split("\t")
        modules[nodeid.split("::")[0]] += float(cpu)
    terminalreporter.write_sep("=", f"CPU-seconds by module ({OUT}; {sum(modules.values()):.0f} in all)")
    for module, cpu in sorted(modules.items(), key=lambda kv: -kv[1])[:25]:
        terminalreporter.write_line(f"{cpu:8.1f}  {module}")
