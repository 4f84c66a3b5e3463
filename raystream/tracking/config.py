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
    its parent's experiment).
    """

    tracking_uri: Optional[str] = None
    experiment: str = "raystream"


CHECKS = [Check("experiment", lambda v: bool(v), "a non-empty MLflow experiment name")]
