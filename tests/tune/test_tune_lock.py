"""A running sweep holds a lock on its directory: a second sweep of the same name refuses at once, naming the first
(its pid and host) and how to start a separate sweep; the lock of a sweep that died is taken over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from raystream.config import compose
from raystream.train import storage
from raystream.tune.lock import LOCK_FILE, STALE_AFTER_S, SweepLock, SweepLocked

SWEEP = """name: tiny_lock
grid:
  optimizer.name: [adamw]
fixed:
  trainer.max_steps: 2
"""

HOLD = ("import sys, time; from raystream.train import storage; from raystream.tune.lock import SweepLock; "
        "SweepLock(storage.resolve(sys.argv[1]).child('sweeps', sys.argv[2]), sys.argv[2]).acquire(); "
        "print('locked', flush=True); time.sleep(600)")


def test_a_second_sweep_of_the_same_name_refuses_naming_the_running_one(sweeps_dir, mlflow_uri, tmp_path,
                                                                        monkeypatch, capfd):
    import tune_tiny_fit
    from raystream.tune.sweep import run_sweep

    monkeypatch.chdir(tmp_path)
    sweeps_dir("tiny_lock", SWEEP)
    results = tmp_path / "results"
    overrides = ["sweep=tiny_lock", "sweep.run_name=same", f"trainer.storage_path={results}"]
    first = subprocess.Popen([sys.executable, "-c", HOLD, str(results), "same"], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ))
    try:
        assert first.stdout.readline().strip() == "locked"
        with pytest.raises(SweepLocked) as refused:
            run_sweep(compose(overrides), overrides, fit=tune_tiny_fit.fit, verbose=0)
        text = str(refused.value)
        assert f"pid {first.pid}" in text and "already running" in text and "sweep.run_name=same-2" in text
        assert str(results / "sweeps" / "same") in text
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # the first sweep died without giving the lock back: its pid is gone, so the next sweep takes the lock over
    where = storage.resolve(str(results)).child("sweeps", "same")
    lock = SweepLock(where, "same").acquire()
    assert f"taking over the lock of sweep same (its process {first.pid} on this host is gone)" in capfd.readouterr().err
    assert json.loads((results / "sweeps" / "same" / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (results / "sweeps" / "same" / LOCK_FILE).exists()


def test_a_lock_from_another_host_holds_until_its_heartbeat_stops(tmp_path):
    where = storage.resolve(str(tmp_path)).child("sweeps", "s")
    os.makedirs(where.path)
    record = {"pid": 1, "host": "other-node", "started": time.time(), "heartbeat": time.time(), "token": "x"}
    (tmp_path / "sweeps" / "s" / LOCK_FILE).write_text(json.dumps(record))
    with pytest.raises(SweepLocked, match="pid 1 on host other-node"):
        SweepLock(where, "s").acquire()
    record["heartbeat"] = time.time() - STALE_AFTER_S - 5  # that node died: nobody refreshes it any more
    (tmp_path / "sweeps" / "s" / LOCK_FILE).write_text(json.dumps(record))
    lock = SweepLock(where, "s").acquire()
    assert json.loads((tmp_path / "sweeps" / "s" / LOCK_FILE).read_text())["token"] == lock.record["token"]
    lock.release()
