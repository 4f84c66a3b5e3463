"""Two autoscaled nodes that share nothing but a bucket train on videos they have never seen.

A fake autoscaling cluster (tests/local_cloud.py: a head that runs nothing, nodes of one `gpu_like` unit added on
demand) and a moto S3 server on 127.0.0.1 holding the videos and their index (`raystream data index`). A Ray
Train run of 2 workers needs 2 nodes; each worker streams its shard from the bucket through its own node's cache
(tests/e2e/bucket_nodes_driver.py). The batches equal a local copy's, byte for byte, and each node downloaded each
video its rank reads exactly once, and nothing else: no node probed a video to count its frames.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from local_cloud import fake_autoscaling_cluster, fake_cluster_config, local_s3, spawn, stop

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "data"))
from rs_data_helpers import BLOCK_VIDEOS, write_block_video  # noqa: E402

sys.path.insert(0, str(HERE))
from bucket_nodes_driver import STREAM  # noqa: E402


def test_two_nodes_with_their_own_caches_stream_a_local_copys_batches_from_the_bucket():
    from raystream.data import build_stream
    from raystream.data.config import DataConfig, StreamConfig
    from raystream.data.videos.index import write_index

    root = Path(tempfile.mkdtemp(prefix="rsb", dir="/tmp"))  # short: Ray's unix sockets live under it
    try:
        local = root / "local"
        local.mkdir()
        paths = [write_block_video(local / f"v{vid}.mp4", vid, n, w, h, gop) for vid, n, w, h, gop in BLOCK_VIDEOS]
        with local_s3(root) as s3:
            for p in paths:
                s3.client().upload_file(str(p), s3.bucket, f"videos/{p.name}")
            uri = f"s3://{s3.bucket}/videos/"
            saved = dict(os.environ)
            os.environ.update(s3.env)
            try:  # the index, written once from this machine (it reads every video once)
                write_index(uri, DataConfig(cache_dir=str(root / "indexer"), decoder="pyav"))
            finally:
                os.environ.clear()
                os.environ.update(saved)

            def config(gcs):
                return fake_cluster_config(gcs, {"gpu_like_1x": {
                    "resources": {"CPU": 1, "gpu_like": 1, "object_store_memory": 100 * 1024 ** 2},
                    "min_workers": 0, "max_workers": 2}}, 2, 0.25)

            with fake_autoscaling_cluster(root, {**os.environ, **s3.env}, config) as (gcs, env):
                out, log = root / "out.json", root / "driver.log"
                driver = spawn([sys.executable, str(HERE / "bucket_nodes_driver.py"), gcs, str(root), uri, str(out)],
                               env, log, cwd=root)
                try:
                    rc = driver.wait(timeout=400)
                except subprocess.TimeoutExpired:
                    rc = None
                finally:
                    stop(driver)
                assert rc == 0 and out.exists(), f"driver exit {rc}:\n{log.read_text()[-6000:]}"
                ranks = json.loads(out.read_text())
        assert ranks[0]["node"] != ranks[1]["node"]  # two nodes, two disks
        for r in ranks:
            expected = build_stream(DataConfig(videos=str(local), decoder="pyav"), StreamConfig(**STREAM),
                                    r["rank"], 2)
            assert r["digests"] == [hashlib.sha256(b.frames.numpy().tobytes()).hexdigest()
                                    for b in expected.batches()]
            reads = {os.path.basename(ref.video) for t in range(expected.num_steps)
                     for _, _, ref in expected.clip_refs(t)}
            assert sorted(r["downloads"]) == sorted(f"{uri}{name}" for name in reads)  # once each, nothing else
    finally:
        shutil.rmtree(root, ignore_errors=True)
