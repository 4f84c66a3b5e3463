"""Structured config of MLflow tracking (`mlflow` key). Plain data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raystream.checks import Check


@dataclass
class TrackingConfig:
    """Where runs are recorded.

    `tracking_uri` None means: `MLFLOW_TRACKING_URI` when set, else the embedded store MLflow 3 itself defaults to,
    pinned to the cwd: `sqlite:///<cwd>/mlflow.db` with artifacts under `<cwd>/mlruns` (`mlflow ui` run in that
    directory shows them). `experiment` is the MLflow experiment runs are created in (a nested child run goes into
    its parent's experiment). `system_metrics_interval_s`: every how many seconds each node of a run logs its
    system metrics (GPU utilisation and memory, CPU, memory, network) to the run's "System metrics" tab; null or 0:
    none (raystream/tracking/system_metrics.py).
    """

    tracking_uri: Optional[str] = None
    experiment: str = "raystream"
    system_metrics_interval_s: Optional[float] = None


CHECKS = [Check("experiment", lambda v: bool(v), "a non-empty MLflow experiment name"),
          Check("system_metrics_interval_s", lambda v: v is None or v == 0 or v >= 0.5,
                "null or 0 (no system metrics), or an interval of at least 0.5 seconds")]
