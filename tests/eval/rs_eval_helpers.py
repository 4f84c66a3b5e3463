"""Helpers of tests/eval (imported by name: tests/ has no packages): the tiny DoRA config the probe-set tests
evaluate with, and a local S3 bucket holding a probe set's files."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator

from local_cloud import local_s3
from raystream.config import compose


def tiny_cfg(dataset, protocol: str, metrics: str, *extra):
    """A tiny DoRA (ViT tiny, 32 px; its teacher's [CLS] is probed) with `eval.dataset`, `eval.protocol` and
    `eval.metrics` (e.g. "[knn,linear]") set, extracting 8 samples per forward pass."""
    return compose(["scenario=dora", "scenario.backbone.preset=tiny", "stream.resolution=32",
                    f"eval.dataset={dataset}", f"eval.protocol={protocol}", f"eval.metrics={metrics}",
                    "eval.batch_size=8", *extra])


@contextmanager
def bucket_holding(root: Path, files: Dict[str, Path], monkeypatch) -> Iterator[str]:
    """moto's S3 server (logs under `root`) holding `files` ({key: local file}), its endpoint and credentials in
    the environment (through `monkeypatch`); yields `s3://<bucket>`."""
    with local_s3(root) as s3:
        for k, v in s3.env.items():
            monkeypatch.setenv(k, v)
        client = s3.client()
        for key, path in files.items():
            client.upload_file(str(path), s3.bucket, key)
        yield f"s3://{s3.bucket}"
