"""What the shipped launcher configs let a sweep grow to, and what Ray's AWS launcher opens for SSH: the numbers
and mechanisms cluster/README.md states, checked against raystream's code and the installed Ray."""

from __future__ import annotations

import copy
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


def test_rays_aws_launcher_opens_ssh_to_everyone_and_extra_rules_do_not_narrow_it():
    from ray.autoscaler._private.aws.config import _create_default_inbound_rules

    mine = [{"FromPort": 22, "ToPort": 22, "IpProtocol": "tcp", "IpRanges": [{"CidrIp": "203.0.113.7/32"}]}]
    rules = _create_default_inbound_rules({"sg-1"}, mine)
    ssh_ranges = [r["CidrIp"] for rule in rules if rule.get("FromPort") == 22 for r in rule.get("IpRanges", [])]
    assert "0.0.0.0/0" in ssh_ranges and "203.0.113.7/32" in ssh_ranges


def test_own_security_groups_on_every_node_type_make_ray_create_none():
    """The documented fix: with SecurityGroupIds on every node type (the commented lines of aws.yaml), Ray's
    launcher configures no security group of its own (it returns before any AWS call)."""
    from ray.autoscaler._private.aws.config import _configure_security_group

    text = (CLUSTER / "aws.yaml").read_text()
    commented = "# SecurityGroupIds: [sg-0123456789abcdef0]"
    assert text.count(commented) == 3  # head, gpu_1x, gpu_8x (the spot types merge these node_configs)
    cfg = yaml.safe_load(text.replace(commented, "SecurityGroupIds: [sg-0123456789abcdef0]"))
    assert all(t["node_config"]["SecurityGroupIds"] == ["sg-0123456789abcdef0"]
               for t in cfg["available_node_types"].values())
    assert _configure_security_group(copy.deepcopy(cfg)) == cfg
