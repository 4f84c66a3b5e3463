"""Videos from an object store (moto's S3 server on 127.0.0.1): listing, the node cache, the index, and streams
byte-identical to those of a local copy of the same videos."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from rs_data_helpers import BLOCK_VIDEOS, data_cfg, stream_cfg, write_block_video

from local_cloud import local_s3
from raystream.config import ConfigError, compose
from raystream.data import DataError, build_stream
from raystream.data.videos.cache import NodeCache
from raystream.data.videos.listing import resolve_videos
from raystream.data.videos.prefetch import VideoPrefetcher
from raystream.data.videos.remote import RemoteObject, stat_objects
from raystream.eval.labelled_videos import load_probe_set


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """A moto S3 server holding the block videos under `vids/` (and the same files locally, in `local`)."""
    root = tmp_path_factory.mktemp("remote")
    local = root / "local"
    local.mkdir()
    paths = [write_block_video(local / f"v{vid}.mp4", vid, n, w, h, gop) for vid, n, w, h, gop in BLOCK_VIDEOS]
    with local_s3(root) as s3, pytest.MonkeyPatch.context() as env:  # the store's env, restored afterwards
        for k, v in s3.env.items():
            env.setenv(k, v)
        client = s3.client()
        for p in paths:
            client.upload_file(str(p), s3.bucket, f"vids/{p.name}")
        yield {"s3": s3, "local": local, "uri": f"s3://{s3.bucket}/vids/", "root": root}


def _downloads(cache_dir: Path) -> list:
    log = cache_dir / "downloads.jsonl"
    return [json.loads(line)["uri"] for line in log.read_text().splitlines()] if log.exists() else []


def _all(stream, start=0):
    return [(b.step, b.frames.clone(), b.video_index.clone()) for b in stream.batches(start)]


@pytest.mark.parametrize("order", ["batch_along_time", "batch_along_video", "shuffled"])
def test_a_bucket_stream_is_byte_identical_to_a_local_copy_even_resumed_on_an_empty_cache(bucket, order, tmp_path):
    for world, rank, start in ((1, 0, 0), (2, 1, 3)):
        local = build_stream(data_cfg(str(bucket["local"])), stream_cfg(order=order), rank=rank, world_size=world)
        # a fresh node: its cache is empty
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            remote = build_stream(data_cfg(bucket["uri"], cache_dir=str(tmp_path / f"node{world}")),
                                  stream_cfg(order=order), rank=rank, world_size=world)
        assert remote.state_dict() == local.state_dict()  # same fingerprint: a checkpoint resumes on either
        a, b = _all(local, start), _all(remote, start)
        assert len(a) == len(b) == local.num_steps - start
        for (sa, fa, va), (sb, fb, vb) in zip(a, b):
            assert sa == sb and torch.equal(fa, fb) and torch.equal(va, vb)
        assert all(v.path.startswith(str(tmp_path)) for v in remote.videos)  # decoders only saw local files


def test_each_object_is_downloaded_once_per_node_even_by_concurrent_workers(bucket, tmp_path):
    obj = stat_objects([bucket["uri"] + "v1.mp4"], "data.videos")[bucket["uri"] + "v1.mp4"]
    caches = [NodeCache(str(tmp_path)) for _ in range(4)]  # four workers of one node
    paths = []
    threads = [threading.Thread(target=lambda c=c: paths.append(c.fetch(obj))) for c in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 1 and Path(paths[0]).read_bytes() == (bucket["local"] / "v1.mp4").read_bytes()
    assert _downloads(tmp_path) == [obj.uri]
    assert NodeCache(str(tmp_path)).etag_of(obj)  # the store's ETag is recorded with the copy
    assert not [p for p in Path(paths[0]).parent.iterdir() if ".part-" in p.name]  # no temporary left


def test_a_half_written_or_changed_copy_is_fetched_again(bucket, tmp_path):
    s3 = bucket["s3"]
    s3.client().upload_file(str(bucket["local"] / "v2.mp4"), s3.bucket, "changing/v.mp4")
    uri = f"s3://{s3.bucket}/changing/v.mp4"
    cache = NodeCache(str(tmp_path))
    path = cache.fetch(stat_objects([uri], "k")[uri])
    with open(path, "r+b") as f:  # a copy cut short (a crash of an older writer)
        f.truncate(100)
    cache.fetch(stat_objects([uri], "k")[uri])
    assert Path(path).read_bytes() == (bucket["local"] / "v2.mp4").read_bytes()
    s3.client().upload_file(str(bucket["local"] / "v3.mp4"), s3.bucket, "changing/v.mp4")  # a new version
    cache.fetch(stat_objects([uri], "k")[uri])
    assert Path(path).read_bytes() == (bucket["local"] / "v3.mp4").read_bytes()
    assert _downloads(tmp_path) == [uri] * 3


def test_a_failing_download_is_retried_then_names_the_object(bucket, tmp_path):
    real = stat_objects([bucket["uri"] + "v1.mp4"], "k")[bucket["uri"] + "v1.mp4"]
    wrong = RemoteObject(real.uri, real.size + 7, real.mtime_ns)  # it never reads back as listed
    cache = NodeCache(str(tmp_path), retries=2, backoff_s=0.01)
    with pytest.raises(DataError, match=r"v1\.mp4: download failed after 3 attempts \(data\.download_retries = 2\)"):
        cache.fetch(wrong)
    assert [p.name for p in tmp_path.rglob("*.mp4*")] == ["v1.mp4.lock"]  # nothing half-written left behind


def test_a_cache_dir_that_cannot_be_written_names_the_object_and_the_key(bucket, tmp_path):
    obj = stat_objects([bucket["uri"] + "v1.mp4"], "k")[bucket["uri"] + "v1.mp4"]
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # a file where the cache directory should be
    with pytest.raises(DataError, match=r"v1\.mp4: cannot keep it in the node cache .*data\.cache_dir"):
        NodeCache(str(blocker)).fetch(obj)


def test_objects_of_two_buckets_in_one_list_are_each_found(bucket):
    s3 = bucket["s3"]
    s3.client().create_bucket(Bucket="second")
    s3.client().upload_file(str(bucket["local"] / "v2.mp4"), "second", "x/v2.mp4")
    first, other, gone = bucket["uri"] + "v1.mp4", "s3://second/x/v2.mp4", "s3://second/x/nope.mp4"
    found = stat_objects([first, other, gone], "k")
    assert found[first].size == (bucket["local"] / "v1.mp4").stat().st_size
    assert found[other].size == (bucket["local"] / "v2.mp4").stat().st_size
    assert found[gone] is None


def test_the_cache_limit_evicts_passed_videos_first_and_never_a_kept_one(bucket, tmp_path):
    objs = stat_objects([f"{bucket['uri']}v{i}.mp4" for i in (1, 2, 3, 4)], "k")
    v1, v2, v3, v4 = (objs[f"{bucket['uri']}v{i}.mp4"] for i in (1, 2, 3, 4))
    cache = NodeCache(str(tmp_path), limit_bytes=v1.size + v3.size + 10)
    p1, p2 = cache.fetch(v1), cache.fetch(v2)
    cache.fetch(v3, keep=[p1], passed=[p2])
    assert os.path.exists(p1) and not os.path.exists(p2)
    with pytest.warns(UserWarning, match="data.cache_limit_gb"):  # all kept: over the limit rather than evict
        cache.fetch(v4, keep=[p1, cache.path_of(v3)])
    assert all(os.path.exists(cache.path_of(o)) for o in (v1, v3, v4))


def test_a_changed_object_is_fetched_again_within_the_limit_its_old_copy_held(bucket, tmp_path):
    s3, local = bucket["s3"], bucket["local"]
    uri = f"s3://{s3.bucket}/replaced/v.mp4"
    s3.client().upload_file(str(local / "v1.mp4"), s3.bucket, "replaced/v.mp4")
    limit = max((local / "v1.mp4").stat().st_size, (local / "v3.mp4").stat().st_size) + 10
    cache = NodeCache(str(tmp_path), limit_bytes=limit)
    path = cache.fetch(stat_objects([uri], "k")[uri])
    s3.client().upload_file(str(local / "v3.mp4"), s3.bucket, "replaced/v.mp4")  # a new version
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the old copy is replaced, not counted against the limit
        cache.fetch(stat_objects([uri], "k")[uri])
    assert Path(path).read_bytes() == (local / "v3.mp4").read_bytes()


def test_a_stream_under_a_tight_cache_limit_is_still_exact(bucket, tmp_path):
    size = max(f.stat().st_size for f in bucket["local"].iterdir())
    cfg = dict(cache_dir=str(tmp_path), cache_limit_gb=2.5 * size / (1 << 30), prefetch_videos=1)
    local = build_stream(data_cfg(str(bucket["local"])), stream_cfg(order="batch_along_video", batch_size=2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        remote = build_stream(data_cfg(bucket["uri"], **cfg), stream_cfg(order="batch_along_video", batch_size=2))
        for (_, fa, _), (_, fb, _) in zip(_all(local), _all(remote)):
            assert torch.equal(fa, fb)


def test_prefix_manifest_and_mixed_lists_resolve_in_order(bucket):
    s3, uri = bucket["s3"], bucket["uri"]
    assert [e.path for e in resolve_videos(uri)] == [f"{uri}v{i}.mp4" for i in (1, 2, 3, 4)]
    s3.client().put_object(Bucket=s3.bucket, Key="vids/lists/train.txt", Body=b"../v3.mp4\n../v1.mp4\n")
    entries = resolve_videos(f"s3://{s3.bucket}/vids/lists/train.txt")
    assert [e.path for e in entries] == [f"{uri}v3.mp4", f"{uri}v1.mp4"]
    assert all(e.source is not None for e in entries)
    mixed = resolve_videos([str(bucket["local"] / "v2.mp4"), f"{uri}v4.mp4"])
    assert mixed[0].source is None and mixed[1].source.size == (bucket["local"] / "v4.mp4").stat().st_size


def test_missing_and_empty_objects_are_named_before_any_download(bucket, tmp_path):
    s3 = bucket["s3"]
    s3.client().put_object(Bucket=s3.bucket, Key="bad/empty.mp4", Body=b"")
    s3.client().put_object(Bucket=s3.bucket, Key="bad/list.txt", Body=b"empty.mp4\nnope.mp4\n")
    with pytest.raises(DataError) as err:
        build_stream(data_cfg(f"s3://{s3.bucket}/bad/list.txt", cache_dir=str(tmp_path)), stream_cfg())
    assert "empty.mp4: empty object (0 bytes)" in str(err.value)
    assert "nope.mp4: object not found in the store" in str(err.value)
    assert not _downloads(tmp_path)
    with pytest.raises(DataError, match="no video objects under this prefix"):
        resolve_videos(f"s3://{s3.bucket}/nothing-here/")
    with pytest.raises(DataError, match="manifest object not found"):
        resolve_videos(f"s3://{s3.bucket}/vids/missing.csv")


def test_with_an_index_no_node_downloads_to_count_frames(bucket, tmp_path):
    from raystream.cli import main

    s3 = bucket["s3"]
    client = s3.client()
    for p in sorted(bucket["local"].glob("*.mp4")):
        client.upload_file(str(p), s3.bucket, f"indexed/{p.name}")
    uri = f"s3://{s3.bucket}/indexed/"
    assert main(["data", "index", uri, f"data.cache_dir={tmp_path / 'indexer'}"]) == 0
    index = json.loads(s3.read("indexed/raystream-index.json"))["videos"]
    assert index["v1.mp4"]["num_frames"] == 40 and index["v1.mp4"]["etag"]
    node = tmp_path / "node"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "probing" warning
        stream = build_stream(data_cfg(uri, cache_dir=str(node)), stream_cfg())
    assert not _downloads(node)  # the steps were counted from the index
    local = build_stream(data_cfg(str(bucket["local"])), stream_cfg())
    assert stream.state_dict() == local.state_dict()
    client.upload_file(str(bucket["local"] / "v2.mp4"), s3.bucket, "indexed/v1.mp4")  # v1 changed since indexing
    with pytest.warns(UserWarning, match="changed since their index was written"):
        stream = build_stream(data_cfg(uri, cache_dir=str(node)), stream_cfg())
    assert _downloads(node) == [f"{uri}v1.mp4"] and stream.videos[0].num_frames == 25


def test_a_labelled_probe_set_from_a_bucket_equals_the_local_one(bucket, tmp_path):
    from omegaconf import OmegaConf

    s3 = bucket["s3"]
    folder = tmp_path / "probe"
    for i, p in enumerate(sorted(bucket["local"].glob("*.mp4"))):
        (folder / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        shutil.copy(p, folder / f"c{i % 2}" / p.name)
        s3.client().upload_file(str(p), s3.bucket, f"probe/c{i % 2}/{p.name}")
    evals = [OmegaConf.create({"dataset": d, "max_probe_samples": 16}) for d in
             (str(folder), f"s3://{s3.bucket}/probe/")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = (load_probe_set(data_cfg(None, cache_dir=str(tmp_path / "cache")), stream_cfg(), e) for e in evals)
    assert a.class_names == b.class_names == ("c0", "c1")
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)


def test_bad_cache_keys_are_config_errors_naming_the_key():
    for key, value in (("data.cache_limit_gb", "0"), ("data.prefetch_videos", "-1"),
                       ("data.download_retries", "-2"), ("data.cache_dir", "s3://b/cache")):
        with pytest.raises(ConfigError, match=f"`{key}` = "):
            compose([f"{key}={value}"])


def _wait_for(check, what: str, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_videos_are_fetched_in_the_order_the_stream_reads_them_and_only_so_far_ahead(bucket, tmp_path):
    objs = stat_objects([f"{bucket['uri']}v{i}.mp4" for i in (1, 2, 3, 4)], "k")
    sources = [objs[f"{bucket['uri']}v{i}.mp4"] for i in (3, 1, 4, 2)]  # stream video v is sources[v]
    cache = NodeCache(str(tmp_path))
    uses = iter([(0, 0), (0, 1), (1, 2), (2, 3)])  # step 0 reads videos 0 and 1, step 1 video 2, step 2 video 3
    fetcher = VideoPrefetcher(cache, sources, uses, ahead=1, start_step=0,
                              paths=[cache.path_of(o) for o in sources])
    try:
        fetcher.reached(0, {0, 1})
        _wait_for(lambda: len(_downloads(tmp_path)) == 3, "step 0's videos and one ahead are fetched")
        time.sleep(1.0)  # the thread waits for the stream instead of fetching video 3
        assert _downloads(tmp_path) == [sources[0].uri, sources[1].uri, sources[2].uri]
        fetcher.reached(1, {2})
        _wait_for(lambda: len(_downloads(tmp_path)) == 4, "video 3 is fetched once step 1 is reached")
        with fetcher.local(3) as path:
            assert Path(path).read_bytes() == (bucket["local"] / "v2.mp4").read_bytes()
        assert len(_downloads(tmp_path)) == 4
    finally:
        fetcher.close()


def test_the_driver_names_a_missing_object_before_any_download(bucket, tmp_path):
    """`raystream train` counts the steps (preflight.total_steps) before it starts Ray: a missing object ends it."""
    from raystream.train.preflight import total_steps

    s3 = bucket["s3"]
    s3.client().put_object(Bucket=s3.bucket, Key="gone/list.txt", Body=b"../vids/v1.mp4\nv9.mp4\n")
    cfg = compose([f"data.videos=s3://{s3.bucket}/gone/list.txt", f"data.cache_dir={tmp_path}"])
    with pytest.raises(DataError, match=f"s3://{s3.bucket}/gone/v9.mp4: object not found in the store"):
        total_steps(cfg)
    assert not _downloads(tmp_path)  # v1 exists, but nothing is fetched once another video is missing


def test_an_unreachable_store_is_named_with_the_key(monkeypatch):
    from local_cloud import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(DataError, match=r"`data\.videos` = 's3://raystream/vids/': cannot list it .*AWS_ENDPOINT_URL"):
        resolve_videos("s3://raystream/vids/")


def test_a_download_that_is_not_the_indexed_version_is_named(bucket, tmp_path):
    from raystream.data.videos.index import write_index

    s3 = bucket["s3"]
    for p in sorted(bucket["local"].glob("*.mp4")):
        s3.client().upload_file(str(p), s3.bucket, f"tagged/{p.name}")
    uri = f"s3://{s3.bucket}/tagged/"
    write_index(uri, data_cfg(uri, cache_dir=str(tmp_path / "indexer")))
    index = json.loads(s3.read("tagged/raystream-index.json"))
    index["videos"]["v2.mp4"]["etag"] = "0123456789abcdef"  # as if v2 had been replaced by an object of equal size
    s3.client().put_object(Bucket=s3.bucket, Key="tagged/raystream-index.json", Body=json.dumps(index).encode())
    stream = build_stream(data_cfg(uri, cache_dir=str(tmp_path / "node"), download_retries=0), stream_cfg())
    with pytest.raises(DataError, match=r"tagged/v2\.mp4: download failed after 1 attempt .*ETag"):
        for _ in stream.batches():
            pass


def test_inspect_names_each_video_by_its_uri_not_its_node_cache_path(bucket, tmp_path, capsys):
    """`raystream data inspect data.videos=s3://b/p/` prints `s3://b/p/x.mp4`, as the user gave it; the clips
    (frames, order) are those of a local copy of the same videos."""
    from raystream.data.stream.inspect import main

    def inspect(videos, **kw):
        cfg = compose(["stream.batch_size=4", "stream.frames_per_clip=3", f"data.videos={videos}",
                       f"data.cache_dir={tmp_path / 'node'}"])
        assert main(cfg, batches=2, start_step=0, **kw) == 0
        return [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    for world_size in (None, 2):
        remote, local = inspect(bucket["uri"], world_size=world_size), inspect(bucket["local"], world_size=world_size)
        videos = [c["video"] for o in remote for c in o["clips"]]
        assert videos and all(v.startswith(bucket["uri"]) and v.endswith(".mp4") for v in videos)
        for o in local:
            for c in o["clips"]:
                c["video"] = bucket["uri"] + Path(c["video"]).name
        assert remote == local
