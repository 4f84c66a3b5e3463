"""`raystream.train.storage`: one place decides where results live, a local directory or a bucket URI.

Bucket cases run against a real S3-compatible server (moto's server mode on 127.0.0.1, `tests/local_cloud.py`),
reached through AWS_ENDPOINT_URL as pyarrow and Ray reach a real endpoint.
"""

from __future__ import annotations

import json
import time

import pytest

from local_cloud import free_port, local_s3, s3_env
from raystream.config import ConfigError, compose
from raystream.train import storage


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with local_s3(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture
def s3_env_set(s3, monkeypatch):
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    return s3


def test_local_paths_are_made_absolute_and_default_to_raystream_results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert storage.uri(None) == str(tmp_path / "raystream_results")
    assert storage.uri("out/runs") == str(tmp_path / "out" / "runs")
    assert storage.uri(f"file://{tmp_path}/x") == str(tmp_path / "x")
    assert storage.uri("s3://bucket/prefix/") == "s3://bucket/prefix"
    local = storage.resolve("out")
    assert local.local and local.path == local.uri == str(tmp_path / "out")
    run = local.child("run-1")
    run.write_json("info.json", {"a": 1})
    assert json.loads((tmp_path / "out" / "run-1" / "info.json").read_text()) == {"a": 1}
    assert run.read_json("info.json") == {"a": 1} and run.read_json("missing.json") is None
    assert run.uri_of("/some/local/path") == "/some/local/path"


@pytest.mark.parametrize("value, message", [
    ("s3://", "a bucket after the scheme"),
    ("nosuchfs://bucket/x", "cannot open it"),
])
def test_a_bad_uri_names_the_key(value, message):
    with pytest.raises(ConfigError, match=f"trainer.storage_path` = '{value}'.*{message}"):
        storage.resolve(value)


def test_bucket_uri_resolves_to_the_object_store(s3_env_set):
    s3 = s3_env_set
    root = storage.resolve(f"s3://{s3.bucket}/results")
    assert not root.local and root.uri == f"s3://{s3.bucket}/results" and root.path == f"{s3.bucket}/results"
    assert type(root.filesystem).__name__ == "S3FileSystem"
    sweep = root.child("sweeps", "smoke-abc")
    assert sweep.uri == f"s3://{s3.bucket}/results/sweeps/smoke-abc"
    sweep.write_json("raystream_sweep.json", {"parent_run_id": "p"})
    assert json.loads(s3.read("results/sweeps/smoke-abc/raystream_sweep.json")) == {"parent_run_id": "p"}
    assert sweep.read_json("raystream_sweep.json") == {"parent_run_id": "p"}
    checkpoint = f"{s3.bucket}/results/run/checkpoint_000001"
    assert root.uri_of(checkpoint) == f"s3://{checkpoint}"


def test_missing_bucket_fails_before_ray_naming_the_key(s3_env_set):
    with pytest.raises(ConfigError, match=r"trainer.storage_path` = 's3://no-such-bucket/r'.*does not exist"):
        storage.resolve("s3://no-such-bucket/r")


def test_unreachable_endpoint_fails_fast_naming_the_key(monkeypatch):
    for k, v in s3_env(f"http://127.0.0.1:{free_port()}").items():  # nothing listens there
        monkeypatch.setenv(k, v)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"trainer.storage_path` = 's3://b/r': cannot reach bucket 'b'"):
        storage.resolve("s3://b/r")
    assert time.monotonic() - t0 < 60


def test_sweep_on_a_bucket_does_not_write_a_local_s3_folder(s3_env_set, tmp_path, monkeypatch):
    """Issue 14: the sweep took `s3://bucket/...` for a local path (it wrote `./s3:/bucket/...`). It now resolves
    the URI like `raystream train` does: a missing bucket fails on the driver, before Ray starts, and nothing named
    `s3:` appears in the working directory."""
    from raystream.tune.sweep import run_sweep

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    cfg = compose(["trainer.storage_path=s3://no-such-bucket/sweeps"])
    with pytest.raises(ConfigError, match="bucket 'no-such-bucket' does not exist"):
        run_sweep(cfg)  # fails on the driver before Ray starts
    assert not (tmp_path / "s3:").exists()


def test_a_record_in_a_bucket_is_copied_there_and_read_back_on_another_node(s3_env_set, tmp_path, monkeypatch):
    """A run directory in a bucket: its record (raystream/tracking/events.py) is appended on this machine, copied
    whole to the bucket with how far it is mirrored, and another node starts from the bucket's copy."""
    import tempfile

    from raystream.tracking import events

    where = events.path_in(f"s3://{s3_env_set.bucket}/results/run-1")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "node-a"))
    here = events.Record(where)
    here.append([events.metrics("r", 0, {"loss": 1.0}, 0), events.metrics("r", 1, {"loss": 0.5}, 0)])
    here.flush()
    here.set_mirrored(here.read()[0][1])  # the first value is in MLflow
    here.close()
    assert {"results/run-1/events.jsonl", "results/run-1/events.jsonl.mirrored"} <= set(s3_env_set.keys("results/"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "node-b"))
    there = events.Record(where)
    assert there.local != here.local and there.last_steps("r") == {"loss": 1}
    assert [e["step"] for e in there.pending()] == [1]
