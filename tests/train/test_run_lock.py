"""One writer per run (issue 51): a run holds a lock on its run directory, as a sweep does on its own; a second
`raystream train` of the same run refuses within seconds, before Ray starts, exit 2, naming the first (host, pid,
since when); the lock of a process that died on this host is taken over, said once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

from raystream.config import compose
from raystream.train import commands, storage
from raystream.train.lock import RUN_LOCK_FILE, RunLock

HOLD = ("import sys, time; from raystream.train import storage; from raystream.train.lock import RunLock; "
        "RunLock(storage.resolve(sys.argv[1]).child(sys.argv[2]), sys.argv[2]).acquire(); "
        "print('locked', flush=True); time.sleep(600)")


def test_a_second_train_of_the_same_run_refuses_naming_the_first(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    results = tmp_path / "results"
    first = subprocess.Popen([sys.executable, "-c", HOLD, str(results), "same"], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "locked"
        overrides = ["trainer.run_name=same", f"trainer.storage_path={results}", "trainer.max_steps=2"]
        began = time.monotonic()
        assert commands.main(compose(overrides), overrides) == 2
        assert time.monotonic() - began < 30  # refused before Ray starts (seconds; a loaded machine: more)
        err = capsys.readouterr().err
        assert f"run same is already running in {results / 'same'}" in err
        assert f"pid {first.pid} on host {socket.gethostname()}, started 20" in err
        assert "trainer.run_name=same-2" in err
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # the first run died holding the lock: its pid is gone on this host, so the next run takes it over, said once
    lock = RunLock(storage.resolve(str(results)).child("same"), "same").acquire()
    err = capsys.readouterr().err
    assert err.count(f"taking over the lock of run same (its process {first.pid} on this host is gone)") == 1
    assert json.loads((results / "same" / RUN_LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (results / "same" / RUN_LOCK_FILE).exists()
