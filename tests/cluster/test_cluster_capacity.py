"""What the shipped launcher configs let a sweep grow to: the numbers cluster/README.md states, checked against
raystream's code."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from raystream.config import compose
from raystream.train.capacity import max_resources
from raystream.tune.concurrency import concurrent_trials
from raystream.tune.space import plan

CLUSTER = Path(__file__).resolve().parents[2] / "cluster"


@pytest.mark.parametrize("name", ["aws.yaml", "gcp.yaml"])
def test_launcher_configs_grow_to_15_gpus(name):
    """README: one gpu_8x and seven gpu_1x under `max_workers: 8` (spot / preemptible types are off)."""
    grown = max_resources(yaml.safe_load((CLUSTER / name).read_text()))
    assert grown["GPU"] == 15 and grown["CPU"] == 96 + 7 * 8
    smoke_on_gpus = plan(compose(["trainer=gpu"]), ["trainer=gpu"])  # 4 one-GPU trials
    head = {k: float(v) for k, v in yaml.safe_load((CLUSTER / name).read_text())["available_node_types"]
            ["head_cpu"]["resources"].items()}
    assert concurrent_trials(smoke_on_gpus, head) == 1  # sized from the cluster as it starts: never scales out
    assert concurrent_trials(smoke_on_gpus, grown) == 4

