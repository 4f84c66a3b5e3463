"""End to end on one machine: the cluster workflow of cluster/README.md with every service on 127.0.0.1.

`ray start --head` (token authentication on, dashboard / job API on loopback, free ports, its own temp dir),
an MLflow tracking server with a sqlite backend, a sweep sent through Ray's job submission with the repository
as the job's working_dir and MLFLOW_TRACKING_URI pointing at the server, then the runs read back through the
MLflow client from that server. Everything the test starts is stopped in `finally` blocks, by process group.

The dashboard / job API and MLflow are checked to answer on loopback only. Ray's GCS and raylet listen on the
machine's address whatever `--node-ip-address` says (Ray swaps 127.0.0.1 for a reachable address by design);
with token auth on they refuse calls without the token.

Never `ray stop` here: it kills every Ray process of the machine, other people's clusters included.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

import pytest

from local_cloud import BIN, answers_on, free_port, http, outbound_ip, spawn, stop, up, wait_until
from ray_env import RAY_TEST_ENV

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXPERIMENT = "cluster-e2e"
JOB_TIMEOUT_S = 240

# What the job runs: the smoke sweep (grid optimizer.name x stream.order) with both axes collapsed by command-line
# values, so 1 trial (Orthogonal-AdamW along time): one Ray Train run of 2 steps on a 4-clip stream over one short
# demo video, without the final probes. What is tested is the workflow (the job, the token, the MLflow server), which
# a second trial would only repeat; trials at once on a cluster: tests/e2e/test_e2e_autoscaling.py.
TINY = [
    "trainer.max_steps=2", "trainer.checkpoint_every=2", "trainer.log_every=1", "eval.metrics=[]",
    "stream.batch_size=4", "data.demo.num_videos=1", "data.demo.frames_per_video=48",
]
SWEEP = ["raystream", "sweep", "sweep=smoke", "stream.order=batch_along_time", "optimizer.name=orthogonal_adamw",
         f"mlflow.experiment={EXPERIMENT}", *TINY]


@dataclass
class LocalCluster:
    dashboard: str  # http://127.0.0.1:<port>: dashboard and job API
    dashboard_port: int
    mlflow: str  # http://127.0.0.1:<port>: MLflow tracking server
    mlflow_port: int
    token: str
    env: Dict[str, str]  # the environment a client of this cluster runs with (token auth on)
    root: Path


@pytest.fixture(scope="module")
def local_cluster():
    try:
        import ray.dashboard.optional_deps  # noqa: F401  (aiohttp & co: the dashboard and its job API)
    except ImportError as exc:
        reason = f"Ray job submission needs ray[default] (the dashboard's dependencies): {exc}"
        if os.environ.get("CI") == "true":  # a fresh install from pyproject.toml must have them
            pytest.fail(reason)
        pytest.skip(reason)

    # A short root: Ray's unix sockets live under it (paths are limited to 107 bytes).
    root = Path(tempfile.mkdtemp(prefix="rsc", dir="/tmp"))
    procs: List[subprocess.Popen] = []
    try:
        token = secrets.token_hex(32)
        token_path = root / "auth_token"
        token_path.write_text(token)
        token_path.chmod(0o600)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))}
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_path), RAY_USAGE_STATS_ENABLED="0",
                   PYTHONUNBUFFERED="1", **RAY_TEST_ENV)
        # As on a cluster node where raystream is installed: its console scripts are on the PATH the job's
        # entrypoint (`raystream sweep ...`) is run with, even when pytest runs from an unactivated venv.
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"

        mlflow_port, dash_port = free_port(), free_port()
        mlflow_log, ray_log = root / "mlflow.log", root / "ray.log"
        procs.append(spawn([
            str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(mlflow_port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{root}/mlflow.db", "--artifacts-destination", f"file://{root}/artifacts",
        ], {**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}, mlflow_log))  # no GenAI job runner (local_cloud.py)
        procs.append(spawn([
            str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
            f"--port={free_port()}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash_port}",
            f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}",
            "--num-cpus=2", "--num-gpus=0", f"--object-store-memory={300 * 1024 ** 2}",
            f"--temp-dir={root}/ray", "--disable-usage-stats", "--include-dashboard=true",
        ], env, ray_log))

        dashboard, mlflow = f"http://127.0.0.1:{dash_port}", f"http://127.0.0.1:{mlflow_port}"

        logs = [mlflow_log, ray_log]
        wait_until(lambda: up(f"{dashboard}/api/version", token), "ray head", procs, logs)
        wait_until(lambda: up(f"{mlflow}/health"), "mlflow server", procs, logs)
        yield LocalCluster(dashboard, dash_port, mlflow, mlflow_port, token, env, root)
    finally:
        # Both outlived stop()'s 5 s grace after SIGTERM (teardown took 10.6 s); nothing of them is kept (root is
        # removed), so what is left of each after 2 s is killed.
        for proc in reversed(procs):
            stop(proc, grace_s=2)
        shutil.rmtree(root, ignore_errors=True)


def test_job_api_requires_the_token_and_listens_on_loopback_only(local_cluster):
    c = local_cluster
    assert http(f"{c.dashboard}/api/jobs/")[0] == 401
    assert http(f"{c.dashboard}/api/jobs/", token="not-the-token")[0] == 403
    assert http(f"{c.dashboard}/api/jobs/", token=c.token)[0] == 200
    ip = outbound_ip()
    if ip is None:
        pytest.skip("no non-loopback address to probe")
    for port in (c.dashboard_port, c.mlflow_port):
        assert not answers_on(ip, port), f"port {port} answers on {ip}, not only on loopback"


def _job(c: LocalCluster, submission_id: str) -> Dict:
    status, body = http(f"{c.dashboard}/api/jobs/{submission_id}", c.token)
    assert status == 200, body
    return json.loads(body)


def _job_logs(c: LocalCluster, submission_id: str) -> str:
    status, body = http(f"{c.dashboard}/api/jobs/{submission_id}/logs", c.token)
    return json.loads(body).get("logs", "") if status == 200 else body


def test_sweep_submitted_as_a_ray_job_is_recorded_on_the_mlflow_server(local_cluster):
    from mlflow.tracking import MlflowClient

    c = local_cluster
    submission_id = f"raystream-e2e-{secrets.token_hex(4)}"
    submit = [
        str(BIN / "ray"), "job", "submit", "--address", c.dashboard, "--submission-id", submission_id,
        "--working-dir", str(REPO),
        "--runtime-env-json", json.dumps({"env_vars": {"MLFLOW_TRACKING_URI": c.mlflow}}),
        "--no-wait", "--",
        *SWEEP, f"trainer.storage_path={c.root}/results", f"data.demo.cache_dir={c.root}/demo",
    ]
    done = subprocess.run(submit, env=c.env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while _job(c, submission_id)["status"] in ("PENDING", "RUNNING") and time.monotonic() < deadline:
            time.sleep(0.5)
        job = _job(c, submission_id)
        assert job["status"] == "SUCCEEDED", f"job {job['status']}: {job.get('message')}\n" \
                                             f"{_job_logs(c, submission_id)[-6000:]}"
    finally:  # a job still running (timeout, failed assertion) is stopped before the cluster goes down
        status, body = http(f"{c.dashboard}/api/jobs/{submission_id}", c.token)
        if status == 200 and json.loads(body)["status"] in ("PENDING", "RUNNING"):
            http(f"{c.dashboard}/api/jobs/{submission_id}/stop", c.token, method="POST")

    client = MlflowClient(tracking_uri=c.mlflow)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None, f"no MLflow experiment {EXPERIMENT!r} on {c.mlflow}"
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    parents = {r.info.run_id: r for r in runs if "mlflow.parentRunId" not in r.data.tags}
    # One parent run for the sweep, one child run for its trial, with the grid's command-line values.
    assert len(parents) == 1, [r.info.run_name for r in runs]
    (parent_id,) = parents
    assert len(children) == 1, [r.info.run_name for r in runs]
    for child in children:
        assert child.data.tags["mlflow.parentRunId"] == parent_id
        assert child.info.status == "FINISHED", child.info.run_name
        assert math.isfinite(child.data.metrics["loss"]), child.data.metrics
        assert child.data.params["trainer.max_steps"] == "2"
        history = client.get_metric_history(child.info.run_id, "loss")
        assert len(history) >= 1
    assert {r.data.params["optimizer.name"] for r in children} == {"orthogonal_adamw"}
    assert {r.data.params["stream.order"] for r in children} == {"batch_along_time"}
    # Artifacts go through the server to its --artifacts-destination (the bucket, on a cloud cluster).
    assert any(client.list_artifacts(r.info.run_id) for r in runs), "no run logged an artifact"
    assert any(p.is_file() for p in (c.root / "artifacts").rglob("*")), "nothing under --artifacts-destination"
