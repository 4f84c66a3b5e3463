"""The console progress line of a run (rank 0), one line every `trainer.log_every` steps:

    [run-name] step 120/1000 | 38.5 clips/s | loss 0.8123 | lr 9.8e-04 | cos_prev +0.412 | cos_ema +0.031

Written to the process's real stdout (Ray forwards it to the driver's console) rather than through Ray Train's
print patch, which would log it twice.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Dict, Mapping, Optional, TextIO

from raystream.tracking import names

_SHOWN = ((names.GRAD_COS_PREV, "cos_prev"), (names.GRAD_COS_EMA, "cos_ema"))


class Progress:
    def __init__(self, run_name: str, total_steps: int, batch_size: int, every: int, out: Optional[TextIO] = None):
        self.run_name, self.total, self.batch_size, self.every = run_name, total_steps, batch_size, max(1, every)
        self.out = out or sys.__stdout__
        self._t0 = time.perf_counter()
        self._n = 0
        self._sums: Dict[str, float] = {}

    def say(self, message: str) -> None:
        self.out.write(f"[{self.run_name}] {message}\n")
        self.out.flush()

    def update(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record step `step`'s metrics; print the window's means after every `every`-th step and the last."""
        self._n += 1
        for key, value in metrics.items():
            if math.isfinite(value):
                self._sums[key] = self._sums.get(key, 0.0) + float(value)
        if (step + 1) % self.every == 0 or step + 1 == self.total:
            self.out.write(self.line(step) + "\n")
            self.out.flush()
            self._t0, self._n, self._sums = time.perf_counter(), 0, {}

    def line(self, step: int) -> str:
        elapsed = max(time.perf_counter() - self._t0, 1e-9)
        mean = {k: v / self._n for k, v in self._sums.items()} if self._n else {}
        parts = [f"[{self.run_name}] step {step + 1}/{self.total}",
                 f"{self._n * self.batch_size / elapsed:.1f} clips/s"]
        if names.LOSS in mean:
            parts.append(f"loss {mean[names.LOSS]:.4f}")
        if names.LR in mean:
            parts.append(f"lr {mean[names.LR]:.1e}")
        parts += [f"{label} {mean[key]:+.3f}" for key, label in _SHOWN if key in mean]
        return " | ".join(parts)
