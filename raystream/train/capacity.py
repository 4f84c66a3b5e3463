"""What the Ray cluster can grow to: its resources now, or, on an autoscaling cluster, with every worker node type at
its `max_workers`. A sweep sizes its trials in flight from this (`raystream.tune.concurrency`) and a run checks its
workers against it (`preflight.check_resources`), so a cluster whose GPU nodes start at `min_workers: 0` is not
mistaken for one without GPUs: the pending requests are what makes the autoscaler add the nodes.

Where the autoscaler's limits come from, first found wins:
 1. the cluster config the autoscaler reports to the GCS (Ray's private
    `state.get_max_resources_from_cluster_config`, what Ray Train V2 itself checks worker groups against; the
    autoscaler v2 of Ray's current source reports it, 2.60's autoscalers do not);
 2. the cluster launcher's config on this node, `~/ray_bootstrap_config.yaml`: `ray up` writes it on the head, which
    is where `ray job submit` runs the sweep's driver (`available_node_types` x `max_workers`, capped by the global
    `max_workers`).
Without either (a fixed cluster, KubeRay with the v1 autoscaler) it is the resources present now; set
`sweep.max_concurrent_trials` there.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import yaml

LAUNCHER_CONFIG = Path("~/ray_bootstrap_config.yaml")  # where `ray up` puts the autoscaling config on the head


def cluster_capacity() -> Dict[str, float]:
    """The most of each resource the connected cluster can have: per resource, the larger of what it has now and
    what its autoscaler may add (see the module docstring). Needs `ray.init()` first."""
    import ray  # lazy: `max_resources` serves `raystream plan`, which never imports Ray

    now = {k: float(v) for k, v in ray.cluster_resources().items()}
    grown = autoscaler_max() or {}
    return {k: max(now.get(k, 0.0), float(grown.get(k, 0.0))) for k in set(now) | set(grown)}


def autoscaler_max() -> Optional[Dict[str, float]]:
    """The autoscaler's limits (resources with every node type at its max_workers), or None when none is known."""
    try:
        from ray._private.state import state  # inside the try: a private Ray API an older / newer Ray may lack

        reported = state.get_max_resources_from_cluster_config()
    except Exception:  # a private Ray API: an older / newer Ray without it reads the launcher config instead
        reported = None
    if reported:
        return {k: float(v) for k, v in reported.items()}
    path = LAUNCHER_CONFIG.expanduser()
    if not path.is_file():
        return None
    try:
        config = yaml.safe_load(path.read_text())
        return max_resources(config)
    except Exception as exc:  # a malformed file: fall back to the resources present, and say so
        print(f"raystream: could not read the autoscaler's node types from {path}: {exc}", file=sys.stderr)
        return None


def max_resources(config: Mapping[str, Any]) -> Dict[str, float]:
    """Resources of an autoscaling config (`ray up` / `ray.cluster_utils.AutoscalingCluster` format) with every
    worker node type at its `max_workers`, at most the global `max_workers` worker nodes in all, plus the head's.
    Per resource the nodes that carry most of it are counted first (an upper bound for each resource alone)."""
    types = dict(config.get("available_node_types") or {})
    head_type = config.get("head_node_type")
    total_nodes = config.get("max_workers")
    slots = []  # one entry per worker node the autoscaler may start: its resources
    for name, node_type in types.items():
        if name == head_type:
            continue
        count = int(node_type.get("max_workers", total_nodes if total_nodes is not None else 0) or 0)
        slots += [dict(node_type.get("resources") or {})] * count
    limit = len(slots) if total_nodes is None else min(len(slots), int(total_nodes))
    head = dict((types.get(head_type) or {}).get("resources") or {})
    keys = set(head).union(*slots) if slots else set(head)
    result = {}
    for key in keys:
        best = sorted((float(s.get(key, 0)) for s in slots), reverse=True)[:limit]
        result[key] = float(head.get(key, 0)) + sum(best)
    return result
