"""`raystream.train.capacity`: what the Ray cluster can grow to, read from the autoscaler's config."""

from __future__ import annotations

import pytest
import yaml

from raystream.config import ConfigError, compose
from raystream.train.capacity import autoscaler_max, cluster_capacity, max_resources
from raystream.train.preflight import check_resources

LAUNCHER = {
    "max_workers": 4,
    "head_node_type": "head",
    "available_node_types": {
        "head": {"resources": {"CPU": 2}, "max_workers": 0},
        "gpu_1x": {"resources": {"CPU": 8, "GPU": 1}, "min_workers": 0, "max_workers": 3},
        "gpu_4x": {"resources": {"CPU": 32, "GPU": 4}, "min_workers": 0, "max_workers": 2},
        "gpu_1x_spot": {"resources": {"CPU": 8, "GPU": 1}, "min_workers": 0, "max_workers": 0},
    },
}


def test_every_node_type_at_its_max_workers_capped_by_the_global_max():
    # 5 GPU nodes allowed by type, 4 in all: per resource the 4 nodes that carry most of it, plus the head.
    assert max_resources(LAUNCHER) == {"CPU": 2 + 32 + 32 + 8 + 8, "GPU": 4 + 4 + 1 + 1}
    uncapped = {**LAUNCHER, "max_workers": 10}
    assert max_resources(uncapped)["GPU"] == 3 + 8
    # A node type without max_workers may take the global max (Ray's default for the field).
    open_type = {"max_workers": 2, "head_node_type": "h",
                 "available_node_types": {"h": {"resources": {}}, "w": {"resources": {"gpu_like": 1}}}}
    assert max_resources(open_type) == {"gpu_like": 2.0}


def test_launcher_config_on_this_node_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert autoscaler_max() is None  # no autoscaler: the resources present decide
    (tmp_path / "ray_bootstrap_config.yaml").write_text(yaml.safe_dump(LAUNCHER))
    assert autoscaler_max() == {"CPU": 82.0, "GPU": 10.0}


def test_malformed_launcher_config_falls_back_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "ray_bootstrap_config.yaml").write_text("available_node_types: [not, a, mapping\n")
    assert autoscaler_max() is None
    assert "ray_bootstrap_config.yaml" in capsys.readouterr().err


def test_a_gpu_run_on_a_cluster_that_can_add_gpu_nodes_passes_the_resource_check(ray_cluster, tmp_path,
                                                                                 monkeypatch):
    """The local cluster has 2 CPUs and no GPU; its (launcher) autoscaler may add GPU nodes. The run's check uses
    what the cluster can grow to, so it waits for a node instead of failing; the resources present would fail it."""
    import ray

    cfg = compose(["trainer.use_gpu=true", "trainer.num_workers=2", "stream.batch_size=8"])
    with pytest.raises(ConfigError, match="needs 2 GPUs but the Ray cluster has 0"):
        check_resources(cfg.trainer, ray.cluster_resources())
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "ray_bootstrap_config.yaml").write_text(yaml.safe_dump(LAUNCHER))
    capacity = cluster_capacity()
    assert capacity["GPU"] == 10 and capacity["CPU"] == 82 and capacity["memory"] == ray.cluster_resources()["memory"]
    check_resources(cfg.trainer, capacity)
    cfg.trainer.num_workers = 11
    with pytest.raises(ConfigError, match="needs 11 GPUs but the Ray cluster has 10"):
        check_resources(cfg.trainer, capacity)
