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
from cli_driver import in_process

import raystream.tune.sweep
from raystream.config import compose
from raystream.train import storage
from raystream.train.lock import LOCK_FILE, STALE_AFTER_S, SweepLock, SweepLocked

SWEEP = """name: tiny_lock
grid:
  optimizer.name: [adamw]
fixed:
  trainer.max_steps: 2
"""

HOLD = ("import sys, time; from raystream.train import storage; from raystream.train.lock import SweepLock; "
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


# ---- the lock in a bucket (trainer.storage_path=s3://...): moto's S3 server on 127.0.0.1 -------------------------

RACE = ("import sys; from raystream.config import ConfigError; from raystream.train import storage; "
        "from raystream.train.lock import SweepLock; where = storage.resolve(sys.argv[1]).child('sweeps', 'raced'); "
        "print('ready', flush=True); sys.stdin.readline()\n"
        "try:\n    SweepLock(where, 'raced').acquire(); print('locked', flush=True)\n"
        "except ConfigError as exc:\n    print('refused', exc, flush=True)\n"
        "sys.stdin.read()")  # holds the lock until the test closes its stdin


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """moto's S3 server with an empty bucket; its endpoint and dummy credentials in this process's env (restored
    afterwards) and in `env` for subprocesses."""
    from local_cloud import local_s3

    root = tmp_path_factory.mktemp("lock_s3")
    with local_s3(root) as s3, pytest.MonkeyPatch.context() as env:
        for k, v in s3.env.items():
            env.setenv(k, v)
        yield {"s3": s3, "root": root, "uri": f"s3://{s3.bucket}/results", "env": {**os.environ, **s3.env}}


def _bucket_lock(bucket, name):
    return storage.resolve(bucket["uri"]).child("sweeps", name)


def _lock_record(bucket, name):
    keys = bucket["s3"].keys(f"results/sweeps/{name}/")
    key = f"results/sweeps/{name}/{LOCK_FILE}"
    return json.loads(bucket["s3"].read(key)) if key in keys else None


def test_a_second_sweep_on_a_bucket_refuses_before_ray_and_a_dead_holders_lock_is_taken_over(bucket, sweeps_dir,
                                                                                             tmp_path, monkeypatch,
                                                                                             capfd):
    """`raystream sweep trainer.storage_path=s3://...` while another process holds that sweep's lock in the bucket:
    exit 2 at once, naming the holder, the lock's URI and `sweep.run_name=<name>-2`, before Ray starts (the sweep's
    start of Ray fails the test, and no Ray session appears under RAY_TMPDIR). The command runs in this process
    (`in_process`, which also fails it if Ray was started): a CLI process of its own would import torch, Ray and
    MLflow for an exit 2. Once the holder is killed (pid gone on this host) the next sweep takes the lock over;
    released, it leaves the bucket, and the next takes it without a note."""
    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started before the refusal")

    sweeps_dir("tiny_lock", SWEEP)
    env = {**bucket["env"], "RAYSTREAM_CONFIG_DIR": str(sweeps_dir.root), "RAY_TMPDIR": str(tmp_path / "ray")}
    env.pop("RAY_ADDRESS", None)
    first = subprocess.Popen([sys.executable, "-c", HOLD, bucket["uri"], "held"], stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        assert first.stdout.readline().strip() == "locked"
        assert _lock_record(bucket, "held")["pid"] == first.pid
        monkeypatch.setattr(raystream.tune.sweep, "start_ray", no_ray)
        with in_process(tmp_path, monkeypatch, capfd) as run:
            out = run("sweep", "sweep=tiny_lock", "sweep.run_name=held", f"trainer.storage_path={bucket['uri']}",
                      f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db", env={"RAY_TMPDIR": str(tmp_path / "ray")})
        assert out.returncode == 2, out.stdout + out.stderr[-3000:]
        assert f"pid {first.pid} on host" in out.stderr and "already running" in out.stderr, out.stderr[-3000:]
        assert f"{bucket['uri']}/sweeps/held/{LOCK_FILE}" in out.stderr and "sweep.run_name=held-2" in out.stderr
        assert not (tmp_path / "ray").exists(), "Ray was started before the refusal"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    capfd.readouterr()
    lock = SweepLock(_bucket_lock(bucket, "held"), "held").acquire()
    assert f"(its process {first.pid} on this host is gone)" in capfd.readouterr().err
    assert _lock_record(bucket, "held")["token"] == lock.record["token"]
    lock.release()
    assert _lock_record(bucket, "held") is None
    SweepLock(_bucket_lock(bucket, "held"), "held").acquire().release()
    assert "taking over" not in capfd.readouterr().err


def test_a_bucket_lock_from_another_host_holds_until_its_heartbeat_stops(bucket):
    s3, key = bucket["s3"], f"results/sweeps/remote/{LOCK_FILE}"
    record = {"pid": 1, "host": "other-node", "started": time.time(), "heartbeat": time.time(), "token": "x"}
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=json.dumps(record).encode())
    with pytest.raises(SweepLocked, match="pid 1 on host other-node"):
        SweepLock(_bucket_lock(bucket, "remote"), "remote").acquire()
    assert _lock_record(bucket, "remote") == record  # the refusal leaves the holder's lock alone
    record["heartbeat"] = time.time() - STALE_AFTER_S - 5  # that node died: nobody refreshes it any more
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=json.dumps(record).encode())
    lock = SweepLock(_bucket_lock(bucket, "remote"), "remote").acquire()
    assert _lock_record(bucket, "remote")["token"] == lock.record["token"]
    lock.release()
    assert _lock_record(bucket, "remote") is None


def test_two_sweeps_taking_a_bucket_lock_at_the_same_moment_one_wins(bucket):
    """No create-if-absent in a bucket: both write, read back after SETTLE_S, and only the later write's owner
    runs; the other refuses naming it."""
    procs = [subprocess.Popen([sys.executable, "-c", RACE, bucket["uri"]], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=bucket["env"]) for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for p in procs:  # both imported: go at the same moment
            p.stdin.write("go\n")
            p.stdin.flush()
        said = [p.stdout.readline().strip() for p in procs]  # both answer while both still run
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=60)
    assert sorted(line.split(" ", 1)[0] for line in said) == ["locked", "refused"], said
    winner = procs[said.index("locked")]
    refusal = next(line for line in said if line.startswith("refused"))
    assert f"pid {winner.pid} on host" in refusal and "sweep.run_name=raced-2" in refusal
    assert _lock_record(bucket, "raced") is None  # the winner released it at exit
