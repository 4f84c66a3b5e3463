"""Structured config of MLflow tracking (`mlflow` key). Plain data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class TrackingConfig:
    """`tracking_uri` None means: `MLFLOW_TRACKING_URI` when set, else an embedded sqlite store in the cwd."""

    tracking_uri: Optional[str] = None
    experiment: str = "raystream"
