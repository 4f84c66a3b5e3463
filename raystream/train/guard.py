"""No process of a run outlives its command: the guard of the local Ray a raystream command starts.

`ray.init()` without an address starts Ray's head processes (GCS, raylet, dashboard, monitors) as children of the
driver, each set to die with the driver's main thread (Linux's PR_SET_PDEATHSIG: Ray's "kernel fate-sharing"). The
raylet starts the workers (the Train controller and workers, Ray's agents) in process groups of their own, and
each worker exits when it finds its raylet gone: it checks about once a second, by pid, from a thread of its own.
What is left to chance (seen on 2026-11-28, issue 62):
- a clean end (finished, failed, Ctrl-C, SIGTERM): `ray.shutdown()` stops the raylet and the GCS and returns, and
  the workers notice later, after the command has ended (a `ray::TrainController` was alive 1 s after its
  SIGTERMed `raystream train` had exited 143);
- a driver that dies without `ray.shutdown()` (SIGKILL, the OOM killer), mid-run or while it shuts down: the head
  processes die with it and every worker is left to notice on its own; one `ray::TrainController` was found,
  re-parented to init, 50 minutes after its command.

The guard closes both. `guard_local_ray()`, called before `ray.init` starts a local cluster, starts this file as a
small process (standard library only, in a session of its own, so that a signal to the command's process group
does not reach it) and marks the driver's environment with a token (`RAYSTREAM_RUN_GUARD`) that every process Ray
starts inherits. The guard waits for the driver: its end of a pipe closes when the driver closes it or dies, and
its parent pid changes when the driver dies; meanwhile it notes the driver's descendants every few seconds (Ray's
agents run with a rewritten environment, found this way). Then it ends every process of the run: those with the
token, those it noted (checked by start time, so a reused pid is left alone), and whatever runs below either, by
SIGTERM, then SIGKILL after `GRACE_S`, again until none is left. At a clean end the driver, after Ray's own
`ray.shutdown()`, closes the pipe and waits for the guard (at most `RELEASE_S`), so nothing of the run is left when
the command returns; after a SIGKILL the guard ends the rest within seconds.

Only a cluster the command starts is guarded: with `RAY_ADDRESS`, or a Ray this process had already initialised
(a notebook's, a test's), the cluster is the user's and the guard is not started. Linux only (it reads /proc);
elsewhere Ray's own reaper process is all there is.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from typing import Dict, Iterable, Optional, Set

TOKEN_ENV = "RAYSTREAM_RUN_GUARD"  # in the environment of every process of a guarded run
POLL_S = 0.25  # how often the guard checks that its driver lives
NOTE_EVERY_S = 2.0  # how often it notes the driver's descendants
GRACE_S = 2.0  # from SIGTERM to SIGKILL
ROUNDS = 5  # SIGTERM, then SIGKILL rounds for what is left or new
RELEASE_S = 30.0  # how long a driver's clean exit waits for its guard

_guard = None  # this process's guard: (Popen, the pipe's write end, this process's pid)


# ---- the driver's side -------------------------------------------------------------------------------------------

def guard_local_ray() -> Optional[str]:
    """Before `ray.init` starts a local cluster in this process: start its guard (once per process; module
    docstring) and mark the environment Ray's processes inherit. The token, or None where there is no /proc."""
    global _guard
    if _guard is not None and _guard[2] == os.getpid():
        return os.environ.get(TOKEN_ENV)
    if not os.path.isdir("/proc/self"):
        return None
    token = uuid.uuid4().hex
    read_end, write_end = os.pipe()  # not inherited by what the driver starts later (O_CLOEXEC)
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), token],
                                stdin=read_end, stdout=subprocess.DEVNULL, env=env, start_new_session=True)
    finally:
        os.close(read_end)
    _guard = (proc, write_end, os.getpid())
    os.environ[TOKEN_ENV] = token
    atexit.register(release)  # before ray.init registers ray.shutdown: runs after it (atexit is last in, first out)
    return token


def release(timeout_s: float = RELEASE_S) -> None:
    """At the driver's clean exit: shut Ray down (if Ray's own exit hook has not), let the guard end what is left of
    the run and wait for it (at most `timeout_s`)."""
    global _guard
    if _guard is None or _guard[2] != os.getpid():  # none, or a forked child's copy: the parent's to release
        return
    proc, write_end, _ = _guard
    _guard = None
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    os.close(write_end)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:  # it goes on alone
        pass


# ---- the guard's side (standard library only: it runs as `python -I -S guard.py <driver pid> <token>`) ----------

def _table() -> Dict[int, tuple]:
    """{pid: (parent pid, start time)} of every live process in /proc (a zombie has ended already)."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in (b"Z", b"X"):  # fields 3 (state), 4 (ppid) and 22 (starttime) of stat
            table[int(name)] = (int(fields[1]), int(fields[19]))
    return table


def _below(roots: Iterable[int], table: Dict[int, tuple]) -> Set[int]:
    """Every descendant of `roots` in `table`."""
    children: Dict[int, list] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _marked(pid: int, mark: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return mark in f.read().split(b"\0")
    except OSError:  # gone, or another user's
        return False


def run_processes(driver: int, token: str, noted: Dict[int, int], table: Dict[int, tuple]) -> Dict[int, int]:
    """{pid: start time} of the run's live processes: those whose environment holds the token, those `noted`
    (the driver's descendants seen earlier, still with the same start time), and everything below them; never this
    process, its ancestors or the driver."""
    mark = f"{TOKEN_ENV}={token}".encode()
    roots = {pid for pid in table if _marked(pid, mark)}
    roots |= {pid for pid, start in noted.items() if table.get(pid, (0, None))[1] == start}
    spared, pid = {driver}, os.getpid()
    for _ in range(len(table)):  # up this process's ancestry to init
        if pid <= 1:
            break
        spared.add(pid)
        pid = table.get(pid, (0, 0))[0]
    return {p: table[p][1] for p in (roots | _below(roots, table)) - spared if p in table}


def _signal(pid: int, start: int, sig: int) -> None:
    """`sig` to `pid` if it is still the process that started at `start` (through a pidfd where there is one)."""
    try:
        fd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
    except OSError:
        return
    try:
        if _table_entry_start(pid) != start:
            return
        if fd is not None and hasattr(signal, "pidfd_send_signal"):
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
    except OSError:
        pass
    finally:
        if fd is not None:
            os.close(fd)


def _table_entry_start(pid: int) -> Optional[int]:
    """The start time of live process `pid`; None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return None if fields[0] in (b"Z", b"X") else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def end_run(driver: int, token: str, noted: Dict[int, int]) -> int:
    """End every process of the run (`run_processes`): SIGTERM, SIGKILL after GRACE_S, again while any is left. The
    number of processes signalled."""
    ended: Set[int] = set()
    for round_ in range(ROUNDS):
        victims = run_processes(driver, token, noted, _table())
        if not victims:
            break
        for pid, start in victims.items():
            _signal(pid, start, signal.SIGTERM if round_ == 0 else signal.SIGKILL)
        ended |= set(victims)
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and any(_table_entry_start(p) == s for p, s in victims.items()):
            time.sleep(0.05)
    return len(ended)


def watch(driver: int, token: str) -> int:
    """The guard: wait until the driver closes its end of the pipe (stdin) or dies, noting its descendants, then
    end the run's processes."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    noted: Dict[int, int] = {}
    next_note = 0.0
    while os.getppid() == driver:
        if time.monotonic() >= next_note:
            table = _table()
            noted = {p: s for p, s in noted.items() if table.get(p, (0, None))[1] == s}
            noted.update({p: table[p][1] for p in _below([driver], table) if p != os.getpid()})
            next_note = time.monotonic() + NOTE_EVERY_S
        readable, _, _ = select.select([0], [], [], POLL_S)
        if readable and not os.read(0, 4096):
            break  # the driver closed the pipe (a clean exit) or died
    end_run(driver, token, noted)
    return 0


if __name__ == "__main__":
    sys.exit(watch(int(sys.argv[1]), sys.argv[2]))
