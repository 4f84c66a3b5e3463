"""Exactly-once metric logging into one MLflow run, across restarts of the training loop.

A restarted worker replays the steps after its last checkpoint. `StepLogger` reads, once at start, the highest
step already recorded for every metric of the run, and drops any (metric, step) at or below it, so each step
of each metric is recorded exactly once however many times the loop restarts. Metrics are buffered and written
with `log_batch` (one transaction) on `flush()`; non-finite values (e.g. a cosine at step 0) are not recorded.
"""

from __future__ import annotations

import math
import time
from typing import Dict, List, Mapping

from raystream.tracking.store import client as make_client
from raystream.tracking.store import retry

MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limit


class StepLogger:
    """Buffered `(metric, step) -> value` logging into MLflow run `run_id`, each pair at most once."""

    def __init__(self, uri: str, run_id: str):
        self.run_id = run_id
        self.client = make_client(uri)
        self._last: Dict[str, int] = self._recorded_steps()
        self._buffer: List = []

    def _recorded_steps(self) -> Dict[str, int]:
        run = retry(lambda: self.client.get_run(self.run_id), "get run")
        last: Dict[str, int] = {}
        for key in run.data.metrics:
            history = retry(lambda k=key: self.client.get_metric_history(self.run_id, k), "metric history")
            if history:
                last[key] = max(m.step for m in history)
        return last

    def last_step(self, key: str) -> int:
        """The highest step recorded (or buffered) for `key`; -1 when none."""
        return self._last.get(key, -1)

    def log(self, metrics: Mapping[str, float], step: int) -> int:
        """Buffer `metrics` at `step`, skipping pairs already recorded and non-finite values. Returns how many."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        kept = 0
        for key, value in metrics.items():
            value = float(value)
            if not math.isfinite(value) or step <= self._last.get(key, -1):
                continue
            self._buffer.append(Metric(key=key, value=value, timestamp=now, step=int(step)))
            self._last[key] = int(step)
            kept += 1
        return kept

    def flush(self) -> None:
        while self._buffer:
            chunk = self._buffer[:MAX_METRICS_PER_BATCH]
            retry(lambda: self.client.log_batch(self.run_id, metrics=chunk), "log metrics")
            del self._buffer[:len(chunk)]
