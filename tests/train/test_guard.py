"""The guard of a command's local Ray (raystream/train/guard.py), on plain processes shaped as Ray's are: a driver
that starts its guard, then a worker in a session of its own (Ray's workers lead their own process groups), an
orphan re-parented to init (a worker whose raylet died), and a process whose environment was rewritten (Ray's
agents). However the driver ends (it exits, or it is SIGKILLed), none of them is left; a process of the user's that
is no part of the run is left alone. The same through real `raystream train` commands: tests/train/test_run_exit.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from raystream.train import guard

DRIVER = """
import os, subprocess, sys, time
from raystream.train.guard import guard_local_ray
guard_local_ray()
sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
worker = subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); print(flush=True); time.sleep(600)"],
                          stdout=subprocess.PIPE)
worker.stdout.readline()
parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; print(subprocess.Popen(sys.argv[1:]).pid)",
                           *sleep], stdout=subprocess.PIPE, text=True)
orphan = int(parent.stdout.readline())
parent.wait()
agent = subprocess.Popen(sleep, env={})
print(worker.pid, orphan, agent.pid, flush=True)
if sys.stdin.readline().strip() == "exit":
    sys.exit(0)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    return guard._table_entry_start(pid) is not None


@pytest.fixture
def bystander():
    """A process of the user's that the run did not start (their own Ray, say): it must outlive the run."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()


def start_driver(tmp_path):
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=tmp_path)
    pids = [int(p) for p in driver.stdout.readline().split()]
    assert len(pids) == 3 and all(alive(p) for p in pids), pids
    assert os.getsid(pids[0]) == pids[0]  # the worker leads a session of its own: no process-group kill finds it
    time.sleep(guard.NOTE_EVERY_S + 1)  # the guard has noted the driver's descendants (the agent among them)
    return driver, pids


def gone_within(pids, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def test_a_driver_that_exits_leaves_nothing_when_it_returns(tmp_path, bystander):
    driver, pids = start_driver(tmp_path)
    try:
        driver.stdin.write("exit\n")
        driver.stdin.flush()
        assert driver.wait(timeout=60) == 0
        assert [p for p in pids if alive(p)] == []  # at once: the driver waited for its guard
        assert alive(bystander.pid)
    finally:
        driver.kill()
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_a_driver_killed_leaves_nothing_within_seconds(tmp_path, bystander):
    driver, pids = start_driver(tmp_path)
    try:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        assert gone_within(pids, 30) == []
        assert alive(bystander.pid)
    finally:
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_run_processes_spare_the_guard_its_ancestors_and_the_driver():
    """Nothing the guard runs under (this test process: it stands for the driver here) is ever the run's."""
    table = guard._table()
    me = os.getpid()
    noted = {me: table[me][1], os.getppid(): table[os.getppid()][1]}
    ancestry, pid = {me}, me
    while pid > 1 and pid in table:
        ancestry.add(pid)
        pid = table[pid][0]
    # what runs below the noted parent besides this process (pytest-xdist's other worker, its Ray) may be taken: a
    # real guard notes only the driver's descendants; the driver and everything above the guard never are
    assert not set(guard.run_processes(me, "no-such-token", noted, table)) & ancestry
