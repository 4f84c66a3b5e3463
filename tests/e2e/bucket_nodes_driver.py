"""The driver of test_e2e_bucket_nodes.py: a Ray Train run of 2 workers, each on its own fake autoscaled node
(one `gpu_like` unit per node), each streaming its shard of videos from a bucket through its node's cache.

    python tests/e2e/bucket_nodes_driver.py <gcs address> <work dir> <videos URI> <out.json>

A node's disk is `<work>/nodes/<its instance id>`: the worker sets RAYSTREAM_CACHE_DIR to it, as a real node's
environment points at its own disk. Each worker writes the sha256 of every batch it streamed, the node it ran on,
and what its node cache downloaded.
"""

from __future__ import annotations

import json
import os
import sys

GPU_LIKE = "gpu_like"
STREAM = dict(order="batch_along_time", batch_size=4, frames_per_clip=3, fps=15.0, clip_shift=1, resolution=32,
              dtype="uint8")


def _loop(config):
    import hashlib

    import ray.train

    from raystream.data import build_stream
    from raystream.data.config import DataConfig, StreamConfig

    node = os.environ["RAY_CLOUD_INSTANCE_ID"]  # set per node by the fake_multinode provider
    os.environ["RAYSTREAM_CACHE_DIR"] = f"{config['work']}/nodes/{node}"
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    stream = build_stream(DataConfig(videos=config["uri"], decoder="pyav"), StreamConfig(**STREAM), rank, world)
    digests = [hashlib.sha256(b.frames.numpy().tobytes()).hexdigest() for b in stream.batches()]
    log = f"{os.environ['RAYSTREAM_CACHE_DIR']}/videos/downloads.jsonl"
    downloads = [json.loads(line)["uri"] for line in open(log)] if os.path.exists(log) else []
    with open(f"{config['work']}/rank{rank}.json", "w") as f:
        json.dump({"rank": rank, "node": node, "digests": digests, "downloads": downloads}, f)


def main(gcs: str, work: str, uri: str, out: str) -> None:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(address=gcs, log_to_driver=True)
    TorchTrainer(_loop, train_loop_config={"work": work, "uri": uri},
                 scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1, GPU_LIKE: 1}),
                 run_config=RunConfig(name="bucket-nodes", storage_path=f"{work}/results")).fit()
    with open(out, "w") as f:
        json.dump([json.load(open(f"{work}/rank{r}.json")) for r in range(2)], f)


if __name__ == "__main__":
    main(*sys.argv[1:5])
