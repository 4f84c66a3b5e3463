"""Exactly-once metric logging into one MLflow run, across restarts of the training loop and tracking outages.

Rank 0's metric values are appended to the run's record (`raystream.tracking.events`, `<run dir>/events.jsonl`)
and a background thread mirrors the record into MLflow (`raystream.tracking.mirror`): `log` never waits for the
store. A restarted worker replays the steps after its last checkpoint; `StepLogger` drops any (metric, step) at or
below the highest step the record holds for that metric, and the mirror drops any at or below the highest step
MLflow holds: each step of each metric is recorded exactly once, in order.

When the store does not answer, the thread retries with backoff and, after `WARN_AFTER_S`, prints a warning naming
the tracking URI; when it answers again the mirror catches up and that is printed too. With an HTTP store, MLflow's
own retries are turned off in this process (`MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`, unless set) so a dead server costs
one refused connection per attempt, not minutes of urllib3 retries. `close(timeout_s)` waits for the mirror to
catch up (only `OUTAGE_CLOSE_TIMEOUT_S` while the store fails); what it did not write stays in the record, marked as
not yet mirrored, for the driver (or `raystream tracking upload`) to write.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from typing import Dict, Mapping, Optional

from raystream.tracking import events
from raystream.tracking.mirror import Mirror
from raystream.uris import first_line

WARN_AFTER_S = 20.0  # an outage is reported once the store has failed this long (plus one request timeout)
HTTP_TIMEOUT_S = "10"  # MLflow's request timeout in this process (its default, 120 s, would delay the warning)
MAX_BACKOFF_S = 10.0
WRITE_PERIOD_S = 5.0  # the writer looks at the record at least this often (a flush wakes it at once)
CLOSE_TIMEOUT_S = 60.0  # at the end of a run: time to write what is pending while the store answers
OUTAGE_CLOSE_TIMEOUT_S = 10.0  # ... and while it does not (one more try)
ERROR_CHARS = 300  # of a store's error message in a warning


class StepLogger:
    """`(metric, step) -> value` logging into MLflow run `run_id` through the record `record` (a path or a URI:
    `events.path_in(run_dir)`), each pair at most once, never blocking the caller."""

    def __init__(self, uri: str, run_id: str, record: str, *, warn_after_s: float = WARN_AFTER_S):
        self.uri, self.run_id, self.warn_after_s = uri, run_id, warn_after_s
        if uri.startswith(("http://", "https://")):
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", HTTP_TIMEOUT_S)
        self.record = events.Record(record)
        self._last: Dict[str, int] = self.record.last_steps(run_id)  # highest step in the record, per metric
        self.record.append([events.opened(run_id, uri)])
        self.record.flush()
        self.record.sync(force=True)  # a bucket holds the record from its first line on
        self._mirror = Mirror(self.record)
        self._cond = threading.Condition()
        self._closing = False
        self._wake = False
        self._failing_since: Optional[float] = None
        self._warned = False
        self._error = ""
        self._thread = threading.Thread(target=self._write_loop, name="raystream-mlflow-writer", daemon=True)
        self._thread.start()

    # ---- the caller's side -------------------------------------------------------------------------------------
    def last_step(self, key: str) -> int:
        """The highest step taken for `key`; -1 when none."""
        return self._last.get(key, -1)

    def log(self, metrics: Mapping[str, float], step: int) -> int:
        """Append `metrics` at `step` to the record, skipping pairs already taken and non-finite values. Returns
        how many."""
        kept: Dict[str, float] = {}
        for key, value in metrics.items():
            value = float(value)
            if not math.isfinite(value) or step <= self._last.get(key, -1):
                continue
            self._last[key] = int(step)
            kept[key] = value
        if kept:
            self.record.append([events.metrics(self.run_id, int(step), kept, int(time.time() * 1000))])
            self.record.flush()  # one line a step: the writer sees it at its next look, flushed or not
        return len(kept)

    @property
    def pending(self) -> int:
        """Events in the record the mirror has not written yet."""
        return len(self.record.pending())

    @property
    def outage(self) -> bool:
        """The last write (or the first read) failed."""
        return self._failing_since is not None

    def flush(self) -> None:
        """Ask the writer to write now (returns at once); a record in a bucket is copied there (at most every
        `events.SYNC_PERIOD_S`)."""
        with self._cond:
            self._wake = True
            self._cond.notify_all()
        try:
            self.record.sync()
        except Exception as exc:  # the bucket too: the local record holds it, and the next sync copies it
            print(f"raystream: WARNING: cannot copy {self.record.local} to {self.record.where}: "
                  f"{first_line(exc, ERROR_CHARS)}", file=sys.stderr, flush=True)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> int:
        """Write what is pending, waiting at most `timeout_s` for the store. Returns how many events the record
        holds that the mirror did not write (0 when MLflow has it all)."""
        deadline = time.monotonic() + timeout_s
        outage_deadline = time.monotonic() + min(timeout_s, OUTAGE_CLOSE_TIMEOUT_S)
        self.record.flush()
        with self._cond:
            self._wake = True
            self._cond.notify_all()
            while self.record.pending() and time.monotonic() < (outage_deadline if self.outage else deadline):
                self._cond.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=15.0)  # at most one request in flight
        self.record.close()
        return len(self.record.pending())

    # ---- the writer thread --------------------------------------------------------------------------------------
    def _write_loop(self) -> None:
        backoff = 0.5
        while True:
            with self._cond:
                if self._closing:
                    return
                if not self._wake:
                    self._cond.wait(timeout=WRITE_PERIOD_S)
                self._wake = False
            try:
                self._mirror.run()
            except Exception as exc:  # connection refused, timeout, HTTP 5xx, sqlite locked: the store is away
                self._failed(exc)
                with self._cond:
                    if not self._closing:
                        self._cond.wait_for(lambda: self._closing or self._wake, timeout=backoff)
                backoff = min(MAX_BACKOFF_S, backoff * 2)
                continue
            backoff = 0.5
            self._recovered()
            with self._cond:
                self._cond.notify_all()

    def _failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        self._error = first_line(exc, ERROR_CHARS)
        if not self._warned and now - self._failing_since >= self.warn_after_s:
            self._warned = True
            print(f"raystream: WARNING: the MLflow tracking store at {self.uri} has not answered for "
                  f"{now - self._failing_since:.0f} s ({self._error}). Training goes on; "
                  f"{len(self.record.pending())} events wait in {self.record.where} and will be written when it "
                  "answers.", file=sys.stderr, flush=True)

    def _recovered(self) -> None:
        if self._failing_since is None:
            return
        if self._warned:
            print(f"raystream: the MLflow tracking store at {self.uri} answers again after "
                  f"{time.monotonic() - self._failing_since:.0f} s; writing the events that waited",
                  file=sys.stderr, flush=True)
        self._failing_since, self._warned = None, False
