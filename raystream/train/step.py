"""The pure-torch pieces of one training step and the window its values wait in, shared by the Ray Train worker
loop (raystream/train/loop.py) and `raystream bench` (raystream/bench/), so the step a benchmark times is the step
a run takes (and the benchmark imports no Ray):

    autocast = autocast_for(cfg.trainer, device)
    out, grad_norm = forward_backward(model, optimizer, params, batch.model_inputs(device), autocast, grad_clip)
    metrics = optimizer_update(optimizer, cosines, report=True)
    window.add(t, {"loss": out["loss"]}, {"grad_norm": grad_norm, **metrics}, host)    # a StepWindow
    if read_back_due(cfg, t, total): for t, scalars, metrics in window.read(): ...  # checked finite by the caller

Nothing but `StepWindow.read` reads a value back to the host: the loss, the norm and what `optimizer_update`
reports (grad_cos_prev, diagnostics) are device tensors until the window is read.
No Ray: DDP's all-reduce happens inside `backward` when the model is wrapped, the window's in `read`.

The window (`StepWindow`): the steps since the last read-back, kept on the device and read back to the host in one
transfer. A host read of a device value (`float(t)`, `.item()`, `.tolist()`) waits for every kernel queued before
it: one per step would stall the GPU's queue once per step and undo the optimizer's sync-free step. So the loop
keeps each step's values (loss and in-stream metrics, gradient norm, grad_cos_prev and the optimizer's
diagnostics) as 0-dim device tensors, and `read()` stacks the whole window, averages the loss and in-stream metrics
over the workers in one all-reduce, and copies it to the host in one transfer (labelled `READ_BACK` for the
profiler).

When (`read_back_due`): after every `trainer.log_every`-th step, and after any step where the loop needs host values
anyway: a Ray Train report or checkpoint (`trainer.report_every`, `trainer.checkpoint_every`, the last step) or
an evaluation (`eval.every`). Those boundaries are the log windows' in the presets (report_every = log_every,
checkpoint_every and eval.every multiples of it); where they are not, they add a read-back of their own.
A checkpoint therefore never holds the state of a diverged step: the window is read and checked first.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Dict, List, Sequence, Tuple

import torch
import torch.distributed as dist
from torch.nn.utils import clip_grad_norm_, get_total_norm

from raystream.tracking import names


def autocast_for(trainer_cfg, device: torch.device) -> Callable[[], ContextManager]:
    """bf16 autocast on `device` when `trainer.bf16` is true, or null (auto) and the device is a GPU; else none.
    (On most CPUs bf16 autocast is slower than fp32, hence off there unless asked for.)"""
    wanted = trainer_cfg.bf16 if trainer_cfg.bf16 is not None else device.type == "cuda"
    if not wanted:
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def forward_backward(model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor],
                     inputs: Dict[str, Any], autocast: Callable[[], ContextManager],
                     grad_clip: float) -> Tuple[Dict[str, torch.Tensor], torch.Tensor]:
    """Forward `inputs` (under `autocast`), zero the gradients, backward, and the gradient norm of `params`
    (clipped to `grad_clip` when it is > 0). Returns (the model's output dict, the norm as a device tensor)."""
    with autocast():
        out = model(inputs)
    optimizer.zero_grad(set_to_none=True)
    out["loss"].backward()
    grad_norm = (clip_grad_norm_(params, grad_clip) if grad_clip > 0
                 else get_total_norm([p.grad for p in params if p.grad is not None]))
    return out, grad_norm


def optimizer_update(optimizer: torch.optim.Optimizer, cosines: Any, report: bool) -> Dict[str, torch.Tensor]:
    """The optimizer step after a checked backward. `cosines`: what gives grad_cos_prev (the optimizer itself
    when it has diagnostics, a GradCosineTracker, or None). Returns grad_cos_prev from a tracker, and the
    optimizer's own diagnostics when `report` (rank 0), as 0-dim device tensors."""
    metrics: Dict[str, torch.Tensor] = {}
    own = cosines is optimizer
    if cosines is not None and not own:
        metrics[names.GRAD_COS_PREV] = cosines.update_on_device()
    optimizer.step()
    if own and report:
        metrics.update(optimizer.diagnostics())
    return metrics

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
