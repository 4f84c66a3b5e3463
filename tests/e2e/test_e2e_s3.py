"""Results on a bucket, as on a cloud cluster, with every service on 127.0.0.1: a local S3-compatible server
(moto's server mode), an MLflow tracking server whose artifact store is that bucket, and the `raystream` CLI with
`trainer.storage_path=s3://...`, reaching the bucket through AWS_ENDPOINT_URL and dummy credentials.

 - `raystream sweep`: the Tune experiment state lands in the bucket, and each trial's run (`fit`, as `raystream train`
   runs it) writes its Ray Train checkpoints, raystream's run file, its MLflow artifacts and its LoggedModel there
   (`trainer.log_checkpoint_artifact=true`); the sweep is SIGKILLed (driver and its local Ray cluster) once the
   bucket records a finished trial, everything local is deleted (working directory, HOME, Ray's temp dir), and the
   same command in a fresh directory resumes it from the bucket alone, without redoing the finished trial;
 - the MLflow server: trials logged through it, its artifacts are in the bucket, its UI's search API lists the runs,
   and it answers on loopback only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from local_cloud import answers_on, http, kill_processes_under, local_s3, mlflow_server, outbound_ip, spawn, stop
from ray_env import RAY_TEST_ENV

pytestmark = pytest.mark.slow

EXPERIMENT = "s3-e2e"
TINY = ["trainer.max_steps=2", "trainer.checkpoint_every=1", "trainer.log_every=1", "eval.metrics=[]",
        "stream.batch_size=4", "data.demo.num_videos=1", "data.demo.frames_per_video=48",
        f"mlflow.experiment={EXPERIMENT}"]
# smoke with its stream.order axis collapsed: 2 trials (AdamW, Orthogonal-AdamW), one at a time, each step slowed
# down so the second trial is still running when the first one's end has reached the bucket. Tune's state reaches
# the bucket every second (sweep.sync_period_s; 15 s by default), so each trial's 2 steps need only a few seconds.
SWEEP = ["sweep", "sweep=smoke", "stream.order=batch_along_time", "sweep.max_concurrent_trials=1",
         "sweep.sync_period_s=1", "trainer.log_checkpoint_artifact=true", *TINY]
STEP_DELAY_S = "3"


@pytest.fixture(scope="module")
def cloud():
    # A short root: Ray's unix sockets live under it (paths are limited to 107 bytes).
    root = Path(tempfile.mkdtemp(prefix="rs3", dir="/tmp"))
    try:
        with local_s3(root) as s3:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_", "AWS_"))}
            env.update(s3.env)
            with mlflow_server(root, env, f"s3://{s3.bucket}/mlflow") as server:
                # RAY_memory_monitor_refresh_ms=0: Ray's OOM killer judges the whole machine's memory, and would kill
                # these tiny trials for other processes' memory on a shared CI machine.
                env.update(MLFLOW_TRACKING_URI=server.uri, PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0",
                           RAY_memory_monitor_refresh_ms="0", **RAY_TEST_ENV)
                yield {"root": root, "s3": s3, "mlflow": server, "env": env, "client": MlflowClient(server.uri)}
    finally:
        kill_processes_under(root)
        shutil.rmtree(root, ignore_errors=True)


def _workspace(root: Path, name: str, env: dict):
    """A fresh working directory, HOME and Ray temp dir: all the local state a run has."""
    ws = root / name
    for d in ("cwd", "home", "ray"):
        (ws / d).mkdir(parents=True)
    return ws, {**env, "HOME": str(ws / "home"), "RAY_TMPDIR": str(ws / "ray")}


def _raystream(args, root: Path):
    return [sys.executable, "-m", "raystream.cli", *args, f"data.demo.cache_dir={root / 'demo'}"]


def _experiment_dirs(s3):
    """The Tune experiments under results/sweeps/ in the bucket."""
    return sorted({k.split("/")[2] for k in s3.keys("results/sweeps/")} - {""})  # "": the folder marker


def _trial_statuses_in_bucket(s3, name: str):
    """Trial statuses as the newest Tune experiment state in the bucket records them (what `Tuner.restore` reads:
    its `trial_data` holds each trial's JSON state). {} while there is none, or the one read does not parse: read
    while the running sweep wrote it, it came back cut short once (2026-12-07, a load average of 45); the next
    poll reads it whole."""
    states = sorted(k for k in s3.keys(f"results/sweeps/{name}/") if "/experiment_state-" in k)
    if not states:
        return {}
    try:
        trials = [json.loads(t[0]) for t in json.loads(s3.read(states[-1]))["trial_data"]]
    except json.JSONDecodeError:
        return {}
    return {t["trial_id"]: t["status"] for t in trials}


@pytest.fixture(scope="module")
def killed_and_resumed_sweep(cloud):
    s3, root, client = cloud["s3"], cloud["root"], cloud["client"]
    storage = [f"trainer.storage_path=s3://{s3.bucket}/results"]

    # Phase 1: run until the bucket's Tune state records a finished trial and the next one, then SIGKILL the driver's
    # process group (the driver and the Ray cluster it started) and delete every local trace of it. The state that
    # marks the first trial finished may be written before Tune adds the second (one trial at a time): on a fast
    # machine the kill came there, and the second trial was then not one "left to do" but one not yet planned.
    # The bucket is read only once the driver has printed the first trial's end ("finished:", in its output, a local
    # file): a poll of the bucket costs about 0.1 CPU-s of this process's and the S3 server's (0.06 + 0.04 at a load
    # average of 40), and polling it every 0.5 s from the sweep's start cost tens of CPU-seconds on 2 cores.
    ws1, env1 = _workspace(root, "sweep1", cloud["env"])
    log1 = ws1 / "sweep.log"
    proc = spawn(_raystream([*SWEEP, *storage], root), {**env1, "RAYSTREAM_STEP_DELAY_S": STEP_DELAY_S}, log1,
                 cwd=ws1 / "cwd")
    t0, statuses, name = time.time(), {}, None
    try:
        while time.time() - t0 < 480 and proc.poll() is None:
            time.sleep(0.5)
            if "finished:" not in log1.read_text():
                continue
            names = _experiment_dirs(s3)
            if names:
                name = names[0]
                statuses = _trial_statuses_in_bucket(s3, name)
                if "TERMINATED" in statuses.values() and len(statuses) == 2:
                    break
    finally:
        stop(proc, grace_s=0, sig=signal.SIGKILL)
        kill_processes_under(ws1)
    killed_at = time.time()
    phase1_log = log1.read_text()
    assert "TERMINATED" in statuses.values(), f"{statuses}\n{phase1_log[-4000:]}"
    shutil.rmtree(ws1)
    finished_first = [t for t, s in statuses.items() if s == "TERMINATED"]

    # Phase 2: the same command in a fresh directory, HOME and Ray temp dir.
    ws2, env2 = _workspace(root, "sweep2", cloud["env"])
    log2 = root / "sweep2.log"
    proc = spawn(_raystream([*SWEEP, *storage], root), env2, log2, cwd=ws2 / "cwd")
    try:
        proc.wait(timeout=400)
    except subprocess.TimeoutExpired:  # where the driver waits (py-spy comes with Ray), then its output
        spy = Path(sys.executable).with_name("py-spy")
        stacks = "(no py-spy)"
        if spy.exists():
            dump = subprocess.run([str(spy), "dump", "--pid", str(proc.pid)], capture_output=True, text=True,
                                  timeout=60)
            stacks = dump.stdout + dump.stderr
        stop(proc, grace_s=0, sig=signal.SIGKILL)
        printed = log2.read_text()
        found = re.search(r"Ray's and Tune's output: (\S+)", printed)
        ray_log = Path(found.group(1)) if found else None
        ray_tail = ray_log.read_text()[-6000:] if ray_log and ray_log.is_file() else ""
        raise AssertionError(f"the resumed sweep did not end within 400 s; its driver:\n{stacks}\nits output:\n"
                             f"{printed[-4000:]}\nRay's and Tune's:\n{ray_tail}") from None
    finally:
        kill_processes_under(ws2)
    out = subprocess.CompletedProcess(proc.args, proc.returncode, log2.read_text(), "")
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`raystream.sweep_run` = '{name}'")
    return {"out": out, "name": name, "statuses_at_kill": statuses, "finished_first": finished_first,
            "killed_at_ms": killed_at * 1000, "runs": runs, "phase1_log": phase1_log, "ws2": ws2}


def test_killed_sweep_resumes_from_the_bucket_alone(cloud, killed_and_resumed_sweep):
    r, s3 = killed_and_resumed_sweep, cloud["s3"]
    out = r["out"]
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "(resumed)" in out.stdout and "2 trials finished, 0 failed" in out.stdout, out.stdout[-3000:]
    assert len(r["statuses_at_kill"]) == 2 and len(r["finished_first"]) == 1, r["statuses_at_kill"]  # 1 left to do
    trials = [x for x in r["runs"] if x.data.tags.get("raystream.role") == "trial"]
    for trial_id in r["finished_first"]:  # the finished trial was not run again
        of_trial = [x for x in trials if x.data.tags["raystream.trial_id"] == trial_id]
        assert len(of_trial) == 1 and of_trial[0].info.end_time < r["killed_at_ms"], of_trial
    assert sorted(x.data.tags["raystream.trial_id"] for x in trials if x.info.status == "FINISHED") == sorted(
        r["statuses_at_kill"])
    # Tune state and every trial's checkpoints are in the bucket; nothing went to a local `s3:` folder.
    keys = s3.keys("results/")
    assert any(k.startswith(f"results/sweeps/{r['name']}/experiment_state-") for k in keys)
    assert f"results/sweeps/{r['name']}/raystream_sweep.json" in keys
    for trial_id in r["statuses_at_kill"]:
        assert any(k.startswith(f"results/{r['name']}-{trial_id}/checkpoint_") for k in keys), trial_id
    assert not any(p.name.startswith("s3:") for p in (r["ws2"] / "cwd").iterdir())


def test_mlflow_server_records_trials_with_artifacts_in_the_bucket(cloud, killed_and_resumed_sweep):
    r, s3, server = killed_and_resumed_sweep, cloud["s3"], cloud["mlflow"]
    parents = [x for x in r["runs"] if x.data.tags.get("raystream.role") == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    # The parent's report went through the server into the bucket.
    report_keys = s3.keys(f"mlflow/{parent.info.experiment_id}/{parent.info.run_id}/artifacts/report/")
    assert any(k.endswith("report.md") for k in report_keys), report_keys
    # What the UI shows: its page, and the runs its search API lists (the UI's own endpoint).
    status, page = http(f"{server.uri}/")
    assert status == 200 and "<html" in page.lower()
    status, body = http(f"{server.uri}/ajax-api/2.0/mlflow/runs/search", method="POST",
                        data=json.dumps({"experiment_ids": [parent.info.experiment_id]}).encode(),
                        headers={"Content-Type": "application/json"})
    assert status == 200, body
    listed = {run["info"]["run_id"] for run in json.loads(body)["runs"]}
    assert {x.info.run_id for x in r["runs"]} <= listed
    # --allowed-hosts: a request naming another host (a DNS-rebinding page in a browser) is refused.
    status, body = http(f"{server.uri}/ajax-api/2.0/mlflow/runs/search", method="POST",
                        data=json.dumps({"experiment_ids": [parent.info.experiment_id]}).encode(),
                        headers={"Content-Type": "application/json", "Host": f"attacker.example:{server.port}"})
    assert status == 403, (status, body[:300])
    ip = outbound_ip()
    if ip is not None:  # bound to loopback only
        assert not answers_on(ip, server.port), f"MLflow answers on {ip}:{server.port}"
        assert not answers_on(ip, s3.port), f"the S3 server answers on {ip}:{s3.port}"


def test_each_trials_checkpoints_run_file_artifacts_and_model_are_in_the_bucket(cloud, killed_and_resumed_sweep):
    """What a run writes to a bucket (each trial's `fit`, as `raystream train`'s), the resumed trial's too: its two
    checkpoints (steps 1 and 2) and run file under its run directory, its MLflow artifacts and its final checkpoint as
    a LoggedModel through the server into the bucket."""
    r, s3, client = killed_and_resumed_sweep, cloud["s3"], cloud["client"]
    trials = [x for x in r["runs"] if x.data.tags.get("raystream.role") == "trial" and x.info.status == "FINISHED"]
    assert len(trials) == 2, [(x.info.run_name, x.info.status) for x in r["runs"]]
    for run in trials:
        run_dir = f"results/{r['name']}-{run.data.tags['raystream.trial_id']}"
        assert run.data.tags["raystream.run_dir"] == f"s3://{s3.bucket}/{run_dir}"
        keys = s3.keys(f"{run_dir}/")
        assert json.loads(s3.read(f"{run_dir}/raystream_run.json"))["mlflow_run_id"] == run.info.run_id
        checkpoints = {k.split("/")[2] for k in keys if k.split("/")[2].startswith("checkpoint_0")}
        assert checkpoints == {"checkpoint_00000001", "checkpoint_00000002"}, keys
        # Artifacts go through the server to its --artifacts-destination, the bucket.
        mlflow_keys = s3.keys(f"mlflow/{run.info.experiment_id}/{run.info.run_id}/artifacts/")
        assert any(k.endswith("/config.yaml") for k in mlflow_keys), mlflow_keys
        # The final checkpoint is the run's LoggedModel: its files in the bucket too, below the experiment's models/.
        (model,) = client.search_logged_models([run.info.experiment_id],
                                               filter_string=f"source_run_id = '{run.info.run_id}'")
        model_keys = s3.keys(f"mlflow/{run.info.experiment_id}/models/{model.model_id}/artifacts/")
        assert any(k.endswith("/MLmodel") for k in model_keys), model_keys
