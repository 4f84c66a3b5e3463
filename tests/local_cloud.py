"""A cloud cluster's services on this machine, every one on 127.0.0.1, for the cluster tests: an S3-compatible
object store (moto's server mode, from PyPI), an MLflow tracking server whose artifact store is that bucket, and
the process-group helpers that start and stop them.

Everything is started in its own process group and stopped by that group, never by name: other people's Ray
clusters and servers on the same machine are left alone. Clients reach the object store through the standard
`AWS_ENDPOINT_URL` and dummy credentials (`LocalS3.env`): pyarrow (Ray Train / Tune storage), boto3 (MLflow's S3
artifact store) and the AWS CLI all read them, as they read a real endpoint and an instance profile on a cluster.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

from ray_env import RAY_TEST_ENV

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def outbound_ip() -> Optional[str]:
    """This machine's non-loopback address, if it has one (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") else ip


def answers_on(ip: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((ip, port)) == 0


def http(url: str, token: Optional[str] = None, method: str = "GET", timeout: float = 5.0,
         data: Optional[bytes] = None, headers: Optional[Dict[str, str]] = None):
    """(status, body) of one request; the status of an HTTP error instead of raising."""
    req = urllib.request.Request(url, method=method, data=data, headers=headers or {})
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def up(url: str, token: Optional[str] = None) -> bool:
    try:
        return http(url, token, timeout=2)[0] == 200
    except OSError:
        return False


def spawn(cmd: List[str], env: Dict[str, str], log: Path, cwd: Optional[Path] = None) -> subprocess.Popen:
    """Start `cmd` in its own process group (so that group, and only it, can be stopped)."""
    with open(log, "w") as out:
        return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen, grace_s: float = 5.0, sig: int = signal.SIGTERM) -> None:
    """`sig` to the process group `proc` leads; SIGKILL what is left of it once the leader is gone or after
    `grace_s`."""
    try:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the whole group is gone
        pass
    proc.wait(timeout=10)


def kill_processes_under(root: Path) -> List[int]:
    """SIGKILL the processes whose command line names `root` (a temp dir only this test uses): what a Ray cluster
    started below it left behind in other process groups (e.g. nodes the fake autoscaler launched). Their ids."""
    killed = []
    mine = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == mine:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(root) in cmdline:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except ProcessLookupError:
                pass
    return killed


def wait_until(check, what: str, procs: List[subprocess.Popen], logs: List[Path], timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        for proc, log in zip(procs, logs):
            if proc.poll() is not None:
                pytest.fail(f"{what}: {proc.args[0]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    pytest.fail(f"{what}: not ready after {timeout_s:.0f}s:\n" + "\n".join(log.read_text()[-1500:] for log in logs))


@dataclass
class LocalS3:
    endpoint: str  # http://127.0.0.1:<port>
    port: int
    bucket: str
    env: Dict[str, str]  # what a client needs: AWS_ENDPOINT_URL, dummy credentials, a region

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=self.env["AWS_DEFAULT_REGION"],
                            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"])

    def keys(self, prefix: str = "") -> List[str]:
        """Every object key in the bucket under `prefix`."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [obj["Key"] for page in pages for obj in page.get("Contents", [])]

    def read(self, key: str) -> bytes:
        return self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()


def s3_env(endpoint: str) -> Dict[str, str]:
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


@contextmanager
def local_s3(root: Path, bucket: str = "raystream") -> Iterator[LocalS3]:
    """moto's S3 server on 127.0.0.1 (a free port) with an empty `bucket`; stopped on exit."""
    pytest.importorskip("moto.server", reason="the local S3 server needs moto[server] (dev extras)")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = root / "moto.log"
    proc = spawn([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], dict(os.environ), log)
    try:
        wait_until(lambda: up(f"{endpoint}/moto-api/"), "moto S3 server", [proc], [log], timeout_s=60)
        s3 = LocalS3(endpoint, port, bucket, s3_env(endpoint))
        s3.client().create_bucket(Bucket=bucket)
        yield s3
    finally:
        stop(proc)


@dataclass
class MlflowServer:
    uri: str  # http://127.0.0.1:<port>
    port: int
    artifacts: str  # its --artifacts-destination


@contextmanager
def mlflow_server(root: Path, env: Dict[str, str], artifacts_destination: str) -> Iterator[MlflowServer]:
    """`mlflow server` on 127.0.0.1 (sqlite backend under `root`, artifacts proxied to `artifacts_destination`,
    `--allowed-hosts` its own address), run with `env` (the object store's endpoint and credentials); stopped on
    exit.

    Without MLflow's job execution (MLFLOW_SERVER_ENABLE_JOB_EXECUTION, on by default in MLflow 3.17): a job runner
    and seven huey consumers, each a process importing MLflow, that serve MLflow's GenAI jobs, which raystream never
    submits. On the loaded 2-core machine (2026-12-07) they doubled the server's CPU (28.7 CPU-s against 10.5 from
    its start to a minute after /health answered) and its start (120 s to /health against 63)."""
    port = free_port()
    log = root / "mlflow.log"
    proc = spawn([str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                  "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
                  "--artifacts-destination", artifacts_destination,
                  # as on the cluster (cluster/aws.yaml): only requests addressed to the server's own address
                  "--allowed-hosts", f"127.0.0.1:{port},localhost:{port}"],
                 {**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}, log)
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: up(f"{uri}/health"), "mlflow server", [proc], [log], timeout_s=120)
        yield MlflowServer(uri, port, artifacts_destination)
    finally:
        stop(proc)


def fake_cluster_config(gcs_address: str, worker_types: Dict[str, dict], max_workers: int,
                        idle_timeout_min: float) -> dict:
    """A `fake_multinode` autoscaling config in `ray up`'s format, as Ray's AutoscalingCluster writes it: a head
    that runs nothing (CPU 0) and `worker_types` ({name: {"resources": ..., "min_workers": ..., "max_workers":
    ...}})."""
    return {
        "cluster_name": "raystream-fake", "max_workers": max_workers, "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_min,
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True, "gcs_address": gcs_address},
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
            **{name: {"node_config": {}, **spec} for name, spec in worker_types.items()},
        },
        "head_node_type": "ray.head.default", "auth": {}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
        "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }


@contextmanager
def fake_autoscaling_cluster(root: Path, env: Dict[str, str], config) -> Iterator[tuple]:
    """A Ray head on 127.0.0.1 started as `ray up` starts one (`--autoscaling-config ~/ray_bootstrap_config.yaml`,
    HOME = `root/home`), whose autoscaler adds fake nodes (local Ray nodes) on demand. `config(gcs_address)` gives
    the autoscaling config (fake_cluster_config). Yields (gcs address, the env a driver runs with); on exit the head
    and every node below `root` are stopped.

    AutoscalingCluster itself is not used: its `start()` runs `ray stop --force`, which kills every Ray process on
    the machine, and Ray 2.60's wheel lacks the example.yaml its constructor reads."""
    import yaml

    home = root / "home"
    home.mkdir(exist_ok=True)
    port = free_port()
    gcs = f"127.0.0.1:{port}"
    (home / "ray_bootstrap_config.yaml").write_text(yaml.safe_dump(config(gcs)))
    env = {k: v for k, v in env.items() if not k.startswith(("RAY_", "MLFLOW_"))}
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1", **RAY_TEST_ENV,
               # Ray's OOM killer judges the whole machine's memory: on a shared CI machine it would kill these
               # tiny trials for other processes' memory (the kernel's OOM killer still guards the machine).
               RAY_memory_monitor_refresh_ms="0",
               # What AutoscalingCluster.start sets: the fake provider, and an autoscaler update every second.
               RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1")
    head_log = root / "head.log"
    head = spawn([
        str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
        f"--autoscaling-config={home / 'ray_bootstrap_config.yaml'}", "--num-cpus=0", "--num-gpus=0",
        f"--object-store-memory={100 * 1024 ** 2}", f"--temp-dir={root / 'ray'}", "--include-dashboard=false",
        f"--dashboard-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}", "--disable-usage-stats",
    ], env, head_log)
    try:
        wait_until(lambda: "--block" in head_log.read_text(), "ray head", [head], [head_log], timeout_s=180)
        yield gcs, env
    finally:
        # SIGTERM reaches every process of the head's group at once, but `ray start --block` itself outlived a 10 s
        # grace (teardown took 10.3 s). Nothing of the head is kept (root is removed): what is left after 2 s is
        # killed.
        stop(head, grace_s=2)
        kill_processes_under(root)  # nodes the autoscaler started, in their own process groups
