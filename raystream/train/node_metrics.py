"""Which worker samples its node's system metrics: the worker of local rank 0 on each node, so a node is sampled
once whatever its number of workers (raystream/tracking/system_metrics.py logs them to the run's MLflow run)."""

from __future__ import annotations

from typing import Any, Dict, Optional

import ray.train

from raystream.tracking.system_metrics import NodeMonitor, node_label


class NoMonitor:
    """What the other workers (and every worker when `mlflow.system_metrics_interval_s` is off) hold."""

    def stop(self) -> None:
        pass


def start_node_monitor(cfg, run: Dict[str, Any], gpus: bool) -> "NodeMonitor | NoMonitor":
    """On the worker of local rank 0: its node's monitor, sampling every `mlflow.system_metrics_interval_s` seconds
    into the run's MLflow run (`run`: tracking_uri, mlflow_run_id); elsewhere, or when the interval is null or 0,
    `NoMonitor`. `gpus`: the workers use GPUs."""
    interval: Optional[float] = cfg.mlflow.system_metrics_interval_s
    if not interval:
        return NoMonitor()
    ctx = ray.train.get_context()
    if ctx.get_local_rank() != 0:
        return NoMonitor()
    node = node_label(ctx.get_node_rank(), several_nodes=ctx.get_local_world_size() < ctx.get_world_size())
    return NodeMonitor.start(run["tracking_uri"], run["mlflow_run_id"], float(interval), node=node,
                             gpus=gpus) or NoMonitor()
