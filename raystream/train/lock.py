"""The lock a running sweep holds on its directory (`<storage>/sweeps/<run name>`, local or in a bucket), so that a
second sweep with the same name refuses at once instead of "resuming" the first one's fresh state and training its
trials into the same folders; and the same lock a single run (`raystream train`) holds on its run directory
(`<storage>/<run name>`, `RunLock`), so that a second `raystream train` of the same run (a second terminal, a job
scheduler's retry) refuses instead of writing into the same MLflow run and pruning the first one's checkpoints. A
sweep's trials run under their sweep's lock and take none of their own.

The lock is a file (`.raystream_sweep.lock`, `.raystream_run.lock`) holding the owner's pid, host, start time and a
heartbeat that a background thread of the owner rewrites every `HEARTBEAT_S`. A lock is stale, and taken over with a
note on stderr, when its heartbeat is older than `STALE_AFTER_S` (a crashed sweep on any host: a bucket lock
included) or, at once, when its owner ran on this host and its pid is gone. On a local disk the file is created
atomically (O_EXCL); in a bucket (pyarrow filesystem, no create-if-absent) the lock is written with a random token
and read back after `SETTLE_S`: of two sweeps that started together the later write wins and the other refuses. The
limit (no conditional write through pyarrow): a sweep whose read and write of the lock are more than `SETTLE_S`
apart (a client stalled for a second between them) can overwrite a lock taken in between, and both run; a strict
guarantee would need the store's create-if-absent (S3 `If-None-Match`), which pyarrow's filesystems do not offer.
The lock is released at the end of the sweep (the run), and at exit of the process otherwise.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import socket
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any, Dict, Optional

from raystream.config import ConfigError
from raystream.uris import read_file, write_bytes

LOCK_FILE = ".raystream_sweep.lock"
RUN_LOCK_FILE = ".raystream_run.lock"
HEARTBEAT_S = 30.0
STALE_AFTER_S = 120.0
SETTLE_S = 1.0


class Locked(ConfigError):
    """Another process holds the lock of a sweep or run directory; the message names it and what to do."""


class SweepLocked(Locked):
    """Another sweep with the same name runs in the same directory; the message names it and what to do."""


class RunLocked(Locked):
    """Another `raystream train` of the same run is running; the message names it and what to do."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


class SweepLock:
    """The lock of sweep directory `where` (a `raystream.train.storage.Storage`), held by this process."""

    KIND, FILE, LOCKED, NAME_KEY = "sweep", LOCK_FILE, SweepLocked, "sweep.run_name"

    def __init__(self, where, run_name: str):
        self.where, self.run_name = where, run_name
        self.path = f"{where.path.rstrip('/')}/{self.FILE}"
        self.uri = f"{where.uri.rstrip('/')}/{self.FILE}"
        now = time.time()
        self.record = {"pid": os.getpid(), "host": socket.gethostname(), "started": now, "heartbeat": now,
                       "token": secrets.token_hex(8), "run_name": run_name}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # ---- reading and judging the lock file ----------------------------------------------------------------------
    def _read(self) -> Optional[Dict[str, Any]]:
        fs = self.where.filesystem
        try:
            data = read_file(fs, self.path)
            return None if data is None else json.loads(data.decode())
        except (OSError, ValueError):  # cut short: treat as absent (its owner died while writing it)
            return None

    def _stale(self, held: Dict[str, Any]) -> Optional[str]:
        """Why the lock `held` no longer protects a running sweep (run), or None when it does."""
        if held.get("host") == socket.gethostname():
            pid = int(held.get("pid", -1))
            if pid == os.getpid():
                return "this process took it earlier"
            if not _alive(pid):
                return f"its process {pid} on this host is gone"
        age = time.time() - float(held.get("heartbeat", 0))
        if age > STALE_AFTER_S:
            return f"its heartbeat is {age:.0f} s old"
        return None

    def _refuse(self, held: Dict[str, Any]) -> Locked:
        started = datetime.fromtimestamp(float(held.get("started", 0)), timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        return self.LOCKED(
            f"{self.KIND} {self.run_name} is already running in {self.where.uri} (pid {held.get('pid')} on host "
            f"{held.get('host')}, started {started}; lock {self.uri}). Wait for it to end (running this command "
            f"again then resumes it), or start a separate {self.KIND}: add {self.NAME_KEY}={self.run_name}-2")

    # ---- taking and giving back ---------------------------------------------------------------------------------
    def _write(self, exclusive: bool) -> bool:
        data = json.dumps(self.record, sort_keys=True).encode()
        if self.where.local:
            os.makedirs(self.where.path, exist_ok=True)
            if exclusive:
                try:
                    fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    return False
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                return True
            tmp = f"{self.path}.{os.getpid()}.tmp"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, self.path)
            except OSError:  # a full disk: no temp file left behind (the heartbeat says so and tries again)
                if os.path.exists(tmp):
                    os.remove(tmp)
                raise
            return True
        self.where.filesystem.create_dir(self.where.path, recursive=True)
        write_bytes(self.where.filesystem, self.path, data)
        return True

    def acquire(self) -> "SweepLock":
        """Take the lock or raise SweepLocked (RunLocked) naming the running sweep (run); a stale lock is taken
        over."""
        for _ in range(3):
            held = self._read()
            if held is not None:
                why = self._stale(held)
                if why is None:
                    raise self._refuse(held)
                if held.get("pid") != os.getpid():
                    print(f"raystream: taking over the lock of {self.KIND} {self.run_name} ({why}): {self.uri}",
                          file=sys.stderr, flush=True)
                self._remove()
            if not self._write(exclusive=True):
                continue  # another sweep created it between our read and our write: judge that one
            if not self.where.local:
                time.sleep(SETTLE_S)
                mine = self._read()
                if mine is None or mine.get("token") != self.record["token"]:
                    if mine is not None:
                        raise self._refuse(mine)
                    continue
            self._start_heartbeat()
            atexit.register(self.release)
            return self
        held = self._read()
        raise self._refuse(held or {"pid": "?", "host": "?", "started": 0})

    def _start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(HEARTBEAT_S):
                held = self._read()
                if held is not None and held.get("token") != self.record["token"]:
                    return  # taken over (we were thought dead): leave it to the new owner
                self.record["heartbeat"] = time.time()
                try:
                    self._write(exclusive=False)
                except OSError as exc:
                    print(f"raystream: could not refresh the {self.KIND} lock {self.uri}: {exc}", file=sys.stderr)

        self._thread = threading.Thread(target=beat, name=f"raystream-{self.KIND}-lock", daemon=True)
        self._thread.start()

    def _remove(self) -> None:
        try:
            self.where.filesystem.delete_file(self.path)
        except (OSError, FileNotFoundError):
            pass

    def release(self) -> None:
        """Give the lock back (only when this process still holds it)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        held = self._read()
        if held is not None and held.get("token") == self.record["token"]:
            self._remove()
        atexit.unregister(self.release)


class RunLock(SweepLock):
    """The lock of a run directory (`raystream train`; a sweep's trials hold their sweep's instead)."""

    KIND, FILE, LOCKED, NAME_KEY = "run", RUN_LOCK_FILE, RunLocked, "trainer.run_name"
