"""Exactly-once metric logging into one MLflow run, across restarts of the training loop and tracking outages.

A restarted worker replays the steps after its last checkpoint; `StepLogger` drops any (metric, step) at or below
the highest step it already took for that metric, and its writer drops any at or below the highest step MLflow
holds (read when it first reaches the store, and again after a failed write, which may have been committed before
the connection dropped): each step of each metric is recorded exactly once, in order.

Tracking never stops training: `log` only appends to an in-memory buffer (bounded: `MAX_BUFFERED` values, beyond
which new values are counted and dropped), and a background thread writes it with `log_batch` (explicit step and
timestamp). When the store does not answer, the thread retries with backoff and, after `WARN_AFTER_S`, prints a
warning naming the tracking URI; when it answers again the buffer is written and that is printed too. With an HTTP
store, MLflow's own retries are turned off in this process (`MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`, unless set) so a
dead server costs one refused connection per attempt, not minutes of urllib3 retries.

`flush()` asks the thread to write now; during an outage it also saves what is buffered to `unsent` (the run
directory's `unsent_metrics.jsonl`, `raystream.tracking.unsent`), so a worker or driver that dies loses nothing.
A new `StepLogger` reads that file back first. `close(timeout_s)` waits for the buffer to drain (only `OUTAGE_CLOSE_TIMEOUT_S`
while the store fails): then the file is removed; else it is left in place, holding every unsent value.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections import deque
from typing import Any, Deque, Dict, List, Mapping, Optional

from raystream.tracking import unsent as unsent_file
from raystream.tracking.store import client as make_client
from raystream.uris import first_line

MAX_METRICS_PER_BATCH = unsent_file.MAX_METRICS_PER_BATCH
MAX_BUFFERED = 500_000  # metric values held during an outage (~100 MB); beyond it new ones are dropped and counted
WARN_AFTER_S = 20.0  # an outage is reported once the store has failed this long (plus one request timeout)
HTTP_TIMEOUT_S = "10"  # MLflow's request timeout in this process (its default, 120 s, would delay the warning)
MAX_BACKOFF_S = 10.0
CLOSE_TIMEOUT_S = 60.0  # at the end of a run: time to write what is buffered while the store answers
OUTAGE_CLOSE_TIMEOUT_S = 10.0  # ... and while it does not (one more try)
ERROR_CHARS = 300  # of a store's error message in a warning


class StepLogger:
    """`(metric, step) -> value` logging into MLflow run `run_id`, each pair at most once, never blocking the caller.

    `unsent`: where to save the values the store has not taken (a local path or a bucket URI), or None."""

    def __init__(self, uri: str, run_id: str, unsent: Optional[str] = None, *, warn_after_s: float = WARN_AFTER_S):
        self.uri, self.run_id, self.unsent = uri, run_id, unsent
        self.warn_after_s = warn_after_s
        if uri.startswith(("http://", "https://")):
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", HTTP_TIMEOUT_S)
        self.client = make_client(uri)
        self._last: Dict[str, int] = {}  # highest step taken into the buffer, per metric
        self._pending: Deque[Any] = deque()  # Metric values not yet written, in order
        self._dropped = 0
        self._cond = threading.Condition()
        self._closing = False
        self._wake = False
        self._recorded: Optional[Dict[str, int]] = None  # highest step MLflow holds; None: read it first
        self._failing_since: Optional[float] = None
        self._warned = False
        self._error = ""
        self._spilled = 0  # values in the unsent file at the last save (0: none saved by this logger)
        self._load_unsent()
        self._thread = threading.Thread(target=self._write_loop, name="raystream-mlflow-writer", daemon=True)
        self._thread.start()

    # ---- the caller's side -------------------------------------------------------------------------------------
    def last_step(self, key: str) -> int:
        """The highest step taken for `key` by this logger; -1 when none."""
        return self._last.get(key, -1)

    def log(self, metrics: Mapping[str, float], step: int) -> int:
        """Buffer `metrics` at `step`, skipping pairs already taken and non-finite values. Returns how many."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        kept = 0
        with self._cond:
            for key, value in metrics.items():
                value = float(value)
                if not math.isfinite(value) or step <= self._last.get(key, -1):
                    continue
                self._last[key] = int(step)
                if len(self._pending) >= MAX_BUFFERED:
                    self._dropped += 1
                    continue
                self._pending.append(Metric(key=key, value=value, timestamp=now, step=int(step)))
                kept += 1
        return kept

    @property
    def pending(self) -> int:
        """Values buffered and not yet written."""
        with self._cond:
            return len(self._pending)

    @property
    def outage(self) -> bool:
        """The last write (or the first read) failed."""
        return self._failing_since is not None

    def flush(self) -> None:
        """Ask the writer to write now (returns at once); during an outage, save the buffer to the unsent file."""
        with self._cond:
            self._wake = True
            self._cond.notify_all()
        if self.outage:
            self._save_unsent()

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> int:
        """Write what is buffered, waiting at most `timeout_s` for the store. Returns how many values are left
        unsent: 0 (the unsent file, if any, removed) or the number saved in the unsent file."""
        deadline = time.monotonic() + timeout_s
        outage_deadline = time.monotonic() + min(timeout_s, OUTAGE_CLOSE_TIMEOUT_S)
        with self._cond:
            self._wake = True
            self._cond.notify_all()
            while self._pending and time.monotonic() < (outage_deadline if self.outage else deadline):
                self._cond.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=15.0)  # at most one request in flight
        left = self.pending
        if left:
            self._save_unsent()
        if self._dropped:
            print(f"raystream: WARNING: {self._dropped} metric values of MLflow run {self.run_id} were dropped: "
                  f"more than {MAX_BUFFERED} waited for the tracking store at {self.uri}", file=sys.stderr, flush=True)
        return left

    # ---- the unsent file ----------------------------------------------------------------------------------------
    def _load_unsent(self) -> None:
        """Values an earlier attempt saved: they go first, and steps at or below theirs are not taken again."""
        if not self.unsent:
            return
        try:
            found = unsent_file.read(self.unsent)
        except Exception as exc:
            print(f"raystream: WARNING: cannot read {self.unsent}: {first_line(exc, ERROR_CHARS)}", file=sys.stderr,
                  flush=True)
            return
        if found is None:
            return
        _, metrics = found
        self._pending.extend(metrics)
        for m in metrics:
            self._last[m.key] = max(self._last.get(m.key, -1), m.step)
        self._spilled = len(metrics)

    def _save_unsent(self) -> None:
        if not self.unsent:
            return
        with self._cond:
            metrics = list(self._pending)
        if not metrics:
            return
        try:
            unsent_file.write(self.unsent, {"mlflow_run_id": self.run_id, "tracking_uri": self.uri}, metrics)
            self._spilled = len(metrics)
        except Exception as exc:  # the storage too: keep them in memory
            print(f"raystream: WARNING: cannot save unsent metrics to {self.unsent}: {first_line(exc, ERROR_CHARS)}",
                  file=sys.stderr, flush=True)

    # ---- the writer thread --------------------------------------------------------------------------------------
    def _write_loop(self) -> None:
        backoff = 0.5
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    if self._spilled and self._failing_since is None:
                        break  # all written: remove the file below
                    self._cond.wait(timeout=5.0)
                if self._closing and (not self._pending or self._failing_since is not None):
                    return
                chunk = list(self._pending)[:MAX_METRICS_PER_BATCH]
            try:
                self._write(chunk)
            except Exception as exc:  # connection refused, timeout, HTTP 5xx, sqlite locked: the store is away
                self._failed(exc)
                with self._cond:
                    if not self._closing:
                        self._wake = False
                        self._cond.wait_for(lambda: self._closing or self._wake, timeout=backoff)
                backoff = min(MAX_BACKOFF_S, backoff * 2)
                continue
            backoff = 0.5
            with self._cond:
                for _ in chunk:
                    self._pending.popleft()
                drained = not self._pending
                self._cond.notify_all()
            self._recovered(len(chunk))
            if drained and self._spilled:
                self._remove_unsent()

    def _write(self, chunk: List[Any]) -> None:
        if self._recorded is None:  # first contact, or after a failed write that may have been committed
            self._recorded = unsent_file.recorded_steps(self.client, self.run_id)
        todo = unsent_file.new_values(chunk, self._recorded)
        if todo:
            try:
                self.client.log_batch(self.run_id, metrics=todo)
            except Exception:
                self._recorded = None
                raise
            for m in todo:
                self._recorded[m.key] = max(self._recorded.get(m.key, -1), m.step)

    def _failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        self._error = first_line(exc, ERROR_CHARS)
        if not self._warned and now - self._failing_since >= self.warn_after_s:
            self._warned = True
            where = f"; saved to {self.unsent} at each flush" if self.unsent else ""
            print(f"raystream: WARNING: the MLflow tracking store at {self.uri} has not answered for "
                  f"{now - self._failing_since:.0f} s ({self._error}). Training goes on; {self.pending} metric "
                  f"values are buffered{where} and will be written when it answers.", file=sys.stderr, flush=True)

    def _recovered(self, written: int) -> None:
        if self._failing_since is None:
            return
        if self._warned:
            print(f"raystream: the MLflow tracking store at {self.uri} answers again after "
                  f"{time.monotonic() - self._failing_since:.0f} s; writing the buffered metric values",
                  file=sys.stderr, flush=True)
        self._failing_since, self._warned = None, False

    def _remove_unsent(self) -> None:
        try:
            unsent_file.remove(self.unsent)
            self._spilled = 0
        except Exception as exc:
            print(f"raystream: WARNING: cannot remove {self.unsent}: {first_line(exc, ERROR_CHARS)}", file=sys.stderr,
                  flush=True)
            self._spilled = 0
