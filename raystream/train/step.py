"""The pure-torch pieces of one training step, shared by the Ray Train worker loop (`loop.train_step`) and
`raystream bench` (raystream/bench/), so the step a benchmark times is the step a run takes:

    autocast = autocast_for(cfg.trainer, device)
    out, grad_norm = forward_backward(model, optimizer, params, batch.model_inputs(device), autocast, grad_clip)
    ... (the caller keeps loss and norm, and checks them finite when it reads them back) ...
    metrics = optimizer_update(optimizer, cosines, report=True)

Nothing here reads a value back to the host: the loss, the norm and what `optimizer_update` reports
(grad_cos_prev, diagnostics) are device tensors, which the loop reads back once per log window
(raystream/train/window.py).
No Ray, no distributed calls: DDP's all-reduce happens inside `backward` when the model is wrapped.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Dict, Sequence, Tuple

import torch
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
