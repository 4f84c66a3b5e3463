"""The steps since the last read-back, kept on the device and read back to the host in one transfer (`StepWindow`).

A host read of a device value (`float(t)`, `.item()`, `.tolist()`) waits for every kernel queued before it: one per
step would stall the GPU's queue once per step and undo the optimizer's sync-free step. So the loop keeps each
step's values (loss and in-stream metrics, gradient norm, grad_cos_prev and the optimizer's diagnostics) as 0-dim
device tensors, and `read()` stacks the whole window, averages the loss and in-stream metrics over the workers in
one all-reduce, and copies it to the host in one transfer (labelled `READ_BACK` for the profiler).

When (`read_back_due`): after every `trainer.log_every`-th step, and after any step where the loop needs host values
anyway: a Ray Train report or checkpoint (`trainer.report_every`, `trainer.checkpoint_every`, the last step) or
an evaluation (`eval.every`). Those boundaries are the log windows' in the presets (report_every = log_every,
checkpoint_every and eval.every multiples of it); where they are not, they add a read-back of their own.
A checkpoint therefore never holds the state of a diverged step: the window is read and checked first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch
import torch.distributed as dist

from raystream.tracking import names

READ_BACK = "raystream.read_back"  # the profiler label of the one transfer per window


def read_back_due(cfg, t: int, total: int) -> bool:
    """Whether the loop reads its window back after global step `t` (see the module docstring)."""
    done, tcfg, every = t + 1, cfg.trainer, cfg.eval.every
    return (done >= total or done % tcfg.log_every == 0 or done % tcfg.report_every == 0
            or done % tcfg.checkpoint_every == 0 or (every > 0 and done % every == 0))


@dataclass
class _Step:
    t: int
    mean_keys: List[str]
    means: torch.Tensor  # 1-D, on the device: averaged over the workers at read-back
    local: Dict[str, torch.Tensor]  # 0-dim device tensors: this worker's own values
    host: Dict[str, float]


class StepWindow:
    """`add` each step's device values; `read` returns every step's values as floats, in one host transfer."""

    def __init__(self, world_size: int, device: torch.device):
        self.world, self.device = world_size, device
        self._steps: List[_Step] = []

    def __len__(self) -> int:
        return len(self._steps)

    def add(self, t: int, means: Dict[str, torch.Tensor], local: Dict[str, torch.Tensor],
            host: Dict[str, float]) -> None:
        """Keep step `t`'s values: `means` (the loss and in-stream metrics, averaged over the workers at read-back),
        `local` (this worker's values as they are) and `host` (floats: lr, wd, clips/s). Reads nothing back."""
        keys = list(means)
        vec = torch.stack([means[k].detach().float().reshape(()) for k in keys])
        self._steps.append(_Step(t, keys, vec, {k: v.detach().reshape(()) for k, v in local.items()}, dict(host)))

    def read(self) -> List[Tuple[int, Dict[str, float], Dict[str, float]]]:
        """(t, the loss and in-stream metrics averaged over the workers, the step's other metrics) of every step
        added since the last read, in order; empties the window. Every worker calls it at the same steps (the
        all-reduce is collective)."""
        steps, self._steps = self._steps, []
        if not steps:
            return []
        with torch.profiler.record_function(READ_BACK):
            means = torch.cat([s.means for s in steps]).to(device=self.device, dtype=torch.float64)
            if self.world > 1 and dist.is_available() and dist.is_initialized():
                dist.all_reduce(means, op=dist.ReduceOp.SUM)
                means /= self.world
            # float64 on the device (a NaN placeholder of a diagnostic may be a CPU tensor)
            local = [v.to(means) for s in steps for v in s.local.values()]
            if local:
                means = torch.cat([means, torch.stack(local)])
            values = means.cpu().tolist()
        out, i, j = [], 0, sum(len(s.mean_keys) for s in steps)
        for s in steps:
            scalars = dict(zip(s.mean_keys, values[i:i + len(s.mean_keys)]))
            i += len(s.mean_keys)
            metrics = {**dict(zip(s.local, values[j:j + len(s.local)])), **s.host}
            j += len(s.local)
            out.append((s.t, scalars, metrics))
        return out


def finite_check_values(scalars: Dict[str, float], metrics: Dict[str, float]) -> Dict[str, float]:
    """What `divergence.check_finite` checks of a step: its loss (over the workers) and its gradient norm."""
    return {"loss": scalars[names.LOSS], "gradient norm": metrics[names.GRAD_NORM]}
