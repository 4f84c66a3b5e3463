"""An autoscaling sweep on Ray's own fake multi-node cluster: the autoscaler (the `fake_multinode` node provider
that `ray.cluster_utils.AutoscalingCluster` configures) starts real Ray nodes as local processes when demand is
pending and removes them after `idle_timeout_minutes`.

As on `cluster/aws.yaml`: a head that trains nothing (CPU 0, none of the GPU-like resource) and one worker type
with a custom `gpu_like` resource standing in for a GPU, `min_workers: 0`, `max_workers: 3`. The autoscaling
config sits where `ray up` puts it on a head, `~/ray_bootstrap_config.yaml` (HOME is a temp dir), and the head is
started with `--autoscaling-config` pointing at it, as aws.yaml's `head_start_ray_commands` do.
A 4-trial sweep whose Train workers each need one `gpu_like` unit runs on it (tests/e2e/autoscaling_driver.py):
the sweep sizes its trials in flight from what the cluster can grow to (3), the pending trials make the autoscaler
add nodes, at least 2 trials run at once, every trial finishes, and the nodes are removed after the idle timeout.
The timeline (GPU-like nodes alive over time) is printed.

AutoscalingCluster itself is not used: its `start()` runs `ray stop --force`, which kills every Ray process on the
machine, and Ray 2.60's wheel lacks the example.yaml its constructor reads. Its config and environment are built
here instead, and the cluster is stopped by its own process groups.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from local_cloud import BIN, free_port, kill_processes_under, spawn, stop, wait_until

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
IDLE_TIMEOUT_MIN = 0.25  # 15 s
MAX_WORKERS = 3
DRIVER_TIMEOUT_S = 600


def autoscaling_config(gcs_address: str) -> dict:
    """A fake_multinode cluster config, as AutoscalingCluster writes it, in `ray up`'s format."""
    return {
        "cluster_name": "raystream-fake", "max_workers": MAX_WORKERS, "upscaling_speed": 1.0,
        "idle_timeout_minutes": IDLE_TIMEOUT_MIN,
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True, "gcs_address": gcs_address},
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
            "gpu_like_1x": {"resources": {"CPU": 1, "gpu_like": 1, "object_store_memory": 100 * 1024 ** 2},
                            "node_config": {}, "min_workers": 0, "max_workers": MAX_WORKERS},
        },
        "head_node_type": "ray.head.default", "auth": {}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
        "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }


@pytest.fixture(scope="module")
def autoscaling_sweep():
    # A short root: Ray's unix sockets live under it (paths are limited to 107 bytes).
    root = Path(tempfile.mkdtemp(prefix="rsa", dir="/tmp"))
    home = root / "home"
    home.mkdir()
    port = free_port()
    gcs = f"127.0.0.1:{port}"
    (home / "ray_bootstrap_config.yaml").write_text(yaml.safe_dump(autoscaling_config(gcs)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))}
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1",
               RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.25",
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
        out, driver_log = root / "out.json", root / "driver.log"
        driver = spawn([sys.executable, str(HERE / "autoscaling_driver.py"), gcs, str(root), str(out)], env,
                       driver_log, cwd=root)
        try:
            rc = driver.wait(timeout=DRIVER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            stop(driver)
        timeline = (root / "timeline.json").read_text() if (root / "timeline.json").exists() else "none"
        assert rc == 0 and out.exists(), (f"driver exit {rc}; timeline {timeline}\n"
                                          f"{driver_log.read_text()[-6000:]}")
        yield json.loads(out.read_text())
    finally:
        stop(head, grace_s=10)
        kill_processes_under(root)  # nodes the autoscaler started, in their own process groups
        shutil.rmtree(root, ignore_errors=True)


def _max_overlap(trials) -> int:
    ran = [t for t in trials if t["started"] is not None]
    events = sorted([(t["started"], 1) for t in ran] + [(t["ended"], -1) for t in ran])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def test_sweep_scales_the_cluster_out_and_back_in(autoscaling_sweep, capsys):
    r = autoscaling_sweep
    with capsys.disabled():
        print(f"\nautoscaling sweep: {r['in_flight']} trials in flight, sweep done at {r['sweep_done_s']} s, "
              f"watched until {r['end_s']} s")
        for point in r["timeline"]:
            print(f"  t={point['t']:7.1f} s  gpu_like nodes alive: {len(point['gpu_like_nodes'])} "
                  f"{point['gpu_like_nodes']}")
        for t in r["trials"]:
            when = f"{t['started']:.1f}-{t['ended']:.1f} s" if t["started"] is not None else t["error"]
            print(f"  trial {t['id']}: {t['status']}, training {when}")
    # Sized from what the cluster can grow to (3 nodes of 1 gpu_like), not from the head's 0 at the start.
    assert r["in_flight"] == MAX_WORKERS
    assert r["timeline"][0]["gpu_like_nodes"] == []  # the cluster starts without a GPU-like node
    assert [t["status"] for t in r["trials"]] == ["finished"] * 4, r["trials"]
    peak = max(len(p["gpu_like_nodes"]) for p in r["timeline"])
    assert 2 <= peak <= MAX_WORKERS, r["timeline"]
    assert _max_overlap(r["trials"]) >= 2, r["trials"]
    # Removed after the idle timeout, once the sweep is done.
    assert r["timeline"][-1]["gpu_like_nodes"] == [], r["timeline"]
    assert r["timeline"][-1]["t"] >= r["sweep_done_s"]
