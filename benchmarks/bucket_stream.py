"""Clips per second of a stream whose videos are in a bucket, cold cache (every video downloaded on the way) vs warm
cache (a node's second run) vs a local copy, and the bytes a node fetches per run (its egress). No
Ray.

    python benchmarks/bucket_stream.py [--videos 4] [--frames 600] [--canvas 256] [--resolution 112] [--repeat 2]

The videos are the hidden-style pan videos of benchmarks/stream_decode.py (walking_tour: scikit-image photos panned
at 60 fps, x264 crf 23), the same clip to each of --videos objects, uploaded to a moto S3 server on 127.0.0.1 with
their index (`raystream data index`; the local copy has one too, so no run probes). One stream (VideoMAE's setting: 16 frames at
12 fps, shift 8; B=8, batch_along_time, decord, 1 decode worker) runs over:
- local:  the local copy (baseline);
- cold:   the bucket with an empty node cache (data.prefetch_videos = 2): downloads go ahead of the stream;
- warm:   the bucket again with the cache the cold run left;
- node2:  two ranks (world size 2) of one node at once, sharing one empty cache: bytes fetched by the node.
Each row is the fastest of --repeat runs (the cold ones each on a fresh cache). A loopback server is far faster
than a real store, so `cold` here shows the cost of the cache machinery, not a network's; the bytes are exact.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from stream_decode import SETTINGS, make_video  # noqa: E402


def _cfgs(videos, cache_dir=None):
    from raystream.data.config import DataConfig, StreamConfig

    return (DataConfig(videos=videos, decoder="decord", decode_timeout_s=600.0, decode_workers=1,
                       cache_dir=cache_dir),
            StreamConfig(order="batch_along_time", batch_size=8, resolution=ARGS.resolution, dtype="uint8",
                         **SETTINGS["videomae"]))


def run(videos, cache_dir=None, rank=0, world=1) -> dict:
    """One pass: clips delivered, seconds (from build_stream, listing and index included, to the last batch)."""
    from raystream.data.stream.build import build_stream

    data, stream_cfg = _cfgs(videos, cache_dir)
    t0 = time.perf_counter()
    stream = build_stream(data, stream_cfg, rank=rank, world_size=world)
    clips, first = 0, None
    for batch in stream.batches():
        clips += batch.frames.shape[0]
        first = first if first is not None else time.perf_counter() - t0
    return {"clips": clips, "seconds": time.perf_counter() - t0, "first_batch_s": first}


def fetched(cache_dir: str) -> int:
    log = Path(cache_dir) / "downloads.jsonl"
    return sum(json.loads(line)["bytes"] for line in log.read_text().splitlines()) if log.exists() else 0


def main() -> int:
    import torch

    from local_cloud import local_s3
    from raystream.data.videos.index import write_index

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="rsbench"))
    try:
        video = make_video(root / "src", ARGS.frames, ARGS.canvas)
        local = root / "local"
        local.mkdir()
        for i in range(ARGS.videos):
            shutil.copy(video, local / f"pan{i}.mp4")
        total = sum(p.stat().st_size for p in local.iterdir())
        with local_s3(root) as s3:
            os.environ.update(s3.env)
            for p in sorted(local.iterdir()):
                s3.client().upload_file(str(p), s3.bucket, f"pan/{p.name}")
            uri = f"s3://{s3.bucket}/pan/"
            data, _ = _cfgs(uri, str(root / "indexer"))
            write_index(uri, data)
            write_index(str(local), data)  # the baseline reads its index too: no probing in any timed run
            rows = {"local": min((run(str(local)) for _ in range(ARGS.repeat)), key=lambda r: r["seconds"])}
            colds = []
            for i in range(ARGS.repeat):
                cache = str(root / f"node-cold{i}")
                colds.append({**run(uri, cache), "bytes": fetched(cache)})
            rows["cold"] = min(colds, key=lambda r: r["seconds"])
            cache = str(root / "node-cold0")
            rows["warm"] = min(({**run(uri, cache), "bytes": fetched(cache) - colds[0]["bytes"]}
                                for _ in range(ARGS.repeat)), key=lambda r: r["seconds"])
            node = str(root / "node2")
            results = [None, None]
            threads = [threading.Thread(target=lambda r=r: results.__setitem__(r, run(uri, node, r, 2)))
                       for r in range(2)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            rows["node2"] = {"clips": sum(r["clips"] for r in results), "seconds": time.perf_counter() - t0,
                             "first_batch_s": max(r["first_batch_s"] for r in results), "bytes": fetched(node)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = rows["local"]["clips"] / rows["local"]["seconds"]
    print(f"bucket stream, {ARGS.videos} pan videos x {ARGS.frames} frames ({ARGS.canvas}px, {total / 2**20:.1f} "
          f"MiB in all), VideoMAE clips at {ARGS.resolution}px, B=8, decord, 1 decode worker, moto on 127.0.0.1")
    print(f"{'run':<7}{'clips/s':>9}{'x local':>9}{'1st batch s':>13}{'MiB fetched':>13}{'x dataset':>11}")
    for name, r in rows.items():
        rate = r["clips"] / r["seconds"]
        got = r.get("bytes")
        print(f"{name:<7}{rate:>9.1f}{rate / base:>9.2f}{r['first_batch_s']:>13.2f}"
              f"{'' if got is None else f'{got / 2**20:.2f}':>13}{'' if got is None else f'{got / total:.2f}':>11}")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--videos", type=int, default=4)
    p.add_argument("--frames", type=int, default=600)
    p.add_argument("--canvas", type=int, default=256)
    p.add_argument("--resolution", type=int, default=112)
    p.add_argument("--repeat", type=int, default=2)
    ARGS = p.parse_args()
    sys.exit(main())
