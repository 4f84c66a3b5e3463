"""Fixtures of the tune tests: a copy of the config tree with extra sweep files, and an MLflow store in tmp."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from raystream.config import config_dir


@pytest.fixture
def sweeps_dir(tmp_path, monkeypatch):
    """A writable copy of `sweeps/` used by compose(); `add(name, text)` writes sweeps/sweep/<name>.yaml."""
    root = tmp_path / "sweeps"
    shutil.copytree(config_dir(), root)
    monkeypatch.setenv("RAYSTREAM_CONFIG_DIR", str(root))

    def add(name: str, text: str, group: str = "sweep") -> Path:
        path = root / group / f"{name}.yaml"
        path.write_text(text)
        return path

    add.root = root
    return add


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture
def ray_by_value(request, ray_cluster):
    """The session's local Ray cluster, with the test's own module (its trainables) shipped to trials by value."""
    import ray

    module = sys.modules[request.module.__name__]
    ray.cloudpickle.register_pickle_by_value(module)
    yield
    ray.cloudpickle.unregister_pickle_by_value(module)
