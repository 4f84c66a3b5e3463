"""A diverging run ends at the step where its loss or gradient stops being finite (`DivergedError`).

The loop checks the step's loss (averaged over the workers) and the total gradient norm (computed anyway for the
`grad_norm` metric and for clipping) when it reads its log window back (raystream/train/step.py: once every
`trainer.log_every` steps, and before any report, checkpoint or evaluation): no extra host sync. The run is named
diverged at the first non-finite step of the window; the up to `trainer.log_every - 1` steps trained after it are
neither recorded nor checkpointed. Every worker sees the same numbers (the loss is all-reduced, the gradients are
DDP's all-reduced ones), so all of them stop at the same step.

Divergence is not a machine fault, so no Ray Train retry is spent on it: the workers do not raise. Rank 0 returns
`{'diverged': message, 'diverged_step': t}` (Ray's `Result.return_value`) and `fit` raises `DivergedError` on the
driver after marking the MLflow run FAILED with the message (tag `raystream.error`).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional

DIVERGED_KEY = "diverged"
DIVERGED_STEP_KEY = "diverged_step"


class DivergedError(RuntimeError):
    """The loss or the gradient became non-finite at `step`; the message names both, e.g. 'loss is nan at step 17'."""

    def __init__(self, message: str, step: Optional[int] = None):
        super().__init__(message)
        self.step = step


def check_finite(step: int, values: Mapping[str, float]) -> None:
    """Raise DivergedError naming the first non-finite value of step `step` (`values`: e.g. loss, gradient norm)."""
    for what, value in values.items():
        if not math.isfinite(value):
            raise DivergedError(f"{what} is {value} at step {step}: the run diverged (lower optimizer.lr, or set "
                                "optimizer.grad_clip)", step)


def as_result(exc: DivergedError) -> Dict[str, Any]:
    """What rank 0 returns to the driver instead of raising (a raise would be retried as a worker failure)."""
    return {DIVERGED_KEY: str(exc), DIVERGED_STEP_KEY: exc.step}


def raise_if_diverged(final: Optional[Mapping[str, Any]]) -> None:
    """On the driver: raise the DivergedError a worker returned (`as_result`)."""
    if final and final.get(DIVERGED_KEY):
        raise DivergedError(str(final[DIVERGED_KEY]), final.get(DIVERGED_STEP_KEY))
