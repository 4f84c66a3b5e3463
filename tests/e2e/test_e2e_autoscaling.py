"""An autoscaling sweep on Ray's own fake multi-node cluster: the autoscaler (the `fake_multinode` node provider
that `ray.cluster_utils.AutoscalingCluster` configures) starts real Ray nodes as local processes when demand is
pending and removes them after `idle_timeout_minutes`.

As on `cluster/aws.yaml`: a head that trains nothing (CPU 0, none of the GPU-like resource) and one worker type
with a custom `gpu_like` resource standing in for a GPU, `min_workers: 0`, `max_workers: 2`. The autoscaling
config sits where `ray up` puts it on a head, `~/ray_bootstrap_config.yaml` (HOME is a temp dir), and the head is
started with `--autoscaling-config` pointing at it, as aws.yaml's `head_start_ray_commands` do.
A 2-trial sweep whose Train workers each need one `gpu_like` unit runs on it (tests/e2e/autoscaling_driver.py):
the sweep sizes its trials in flight from what the cluster can grow to (2, where the head alone gives 1), the
pending trials make the autoscaler add nodes, 2 trials run at once, every trial finishes, and the nodes are removed
after the idle timeout (6 s: no node is idle before its trial, each trial having a node of its own). 2 nodes and
2 trials show each of these as 3 did, for one node's Ray start and one trial's Train run less.
The timeline (GPU-like nodes alive over time) is printed.
The cluster is started by tests/local_cloud.py's `fake_autoscaling_cluster` (AutoscalingCluster's config and
environment, without its `ray stop --force`).
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

from local_cloud import fake_autoscaling_cluster, fake_cluster_config, spawn, stop

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
IDLE_TIMEOUT_MIN = 0.1  # 6 s
MAX_WORKERS = 2
DRIVER_TIMEOUT_S = 600


def autoscaling_config(gcs_address: str) -> dict:
    """A fake_multinode cluster config, as AutoscalingCluster writes it, in `ray up`'s format."""
    return fake_cluster_config(gcs_address, {
        "gpu_like_1x": {"resources": {"CPU": 1, "gpu_like": 1, "object_store_memory": 100 * 1024 ** 2},
                        "min_workers": 0, "max_workers": MAX_WORKERS}}, MAX_WORKERS, IDLE_TIMEOUT_MIN)


@pytest.fixture(scope="module")
def autoscaling_sweep():
    # A short root: Ray's unix sockets live under it (paths are limited to 107 bytes).
    root = Path(tempfile.mkdtemp(prefix="rsa", dir="/tmp"))
    try:
        with fake_autoscaling_cluster(root, dict(os.environ), autoscaling_config) as (gcs, env):
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
    # Sized from what the cluster can grow to (2 nodes of 1 gpu_like), not from the head's 0 at the start (1).
    assert r["in_flight"] == MAX_WORKERS
    assert r["timeline"][0]["gpu_like_nodes"] == []  # the cluster starts without a GPU-like node
    assert [t["status"] for t in r["trials"]] == ["finished"] * MAX_WORKERS, r["trials"]
    peak = max(len(p["gpu_like_nodes"]) for p in r["timeline"])
    assert 2 <= peak <= MAX_WORKERS, r["timeline"]
    assert _max_overlap(r["trials"]) >= 2, r["trials"]
    # Removed after the idle timeout, once the sweep is done.
    assert r["timeline"][-1]["gpu_like_nodes"] == [], r["timeline"]
    assert r["timeline"][-1]["t"] >= r["sweep_done_s"]
