"""The DINO/DoRA teacher: an exponential moving average of the student, held in BUFFERS, not parameters.

`frozen_copy(student)` deep-copies the student and turns every parameter of the copy into a buffer of the same
name. So the teacher
- is in the model's `state_dict` (`teacher.*`, same names as `student.*`): checkpoints save and restore it;
- is not in `model.parameters()`: no optimizer (nor DDP's gradient all-reduce) ever sees it, and it can get no
  gradient (its forward also runs under `torch.no_grad`);
- moves only by `ema_update`: teacher <- m * teacher + (1 - m) * student, after each optimizer step, with
  m = `cosine_momentum(step)` rising from 0.996 to 1 (DINO's cosine schedule).

DDP broadcasts a module's buffers from rank 0 before every forward; `ddp_ignore_teacher` tells DDP to skip the
teacher's (tens of millions of values at paper scale): every rank computes the same EMA of the same all-reduced
student, so the copies agree without it (they start equal because the model is built from the same seed, or
restored from the same checkpoint).
"""

from __future__ import annotations

import copy
import math
from typing import List, Tuple

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def frozen_copy(module: nn.Module) -> nn.Module:
    """A deep copy of `module` whose parameters are buffers (same names), detached and without grad."""
    teacher = copy.deepcopy(module)
    for sub in teacher.modules():
        for name, param in list(sub._parameters.items()):
            del sub._parameters[name]
            if param is not None:
                sub.register_buffer(name, param.detach().clone())
    return teacher


def ema_pairs(student: nn.Module, teacher: nn.Module) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """(student tensors, teacher buffers) matched by name. Looked up on every call: `module.to(device)` replaces
    buffer tensors, so references must not be cached."""
    buffers = dict(teacher.named_buffers())
    pairs = [(p, buffers[name]) for name, p in student.named_parameters()]
    pairs += [(b, buffers[name]) for name, b in student.named_buffers()]
    missing = [name for name, _ in student.named_parameters() if name not in buffers]
    if missing:
        raise RuntimeError(f"teacher lacks buffers for student parameters {missing[:5]}")
    return [s for s, _ in pairs], [t for _, t in pairs]


@torch.no_grad()
def ema_update(student: nn.Module, teacher: nn.Module, momentum: float) -> None:
    """teacher <- momentum * teacher + (1 - momentum) * student, for every parameter and buffer."""
    src, dst = ema_pairs(student, teacher)
    moving = [(s, t) for s, t in zip(src, dst) if t.is_floating_point()]
    if moving:
        targets = [t for _, t in moving]
        torch._foreach_lerp_(targets, [s.detach().to(t.dtype) for s, t in moving], 1.0 - momentum)
    for s, t in zip(src, dst):
        if not t.is_floating_point():  # integer buffers (counters) are copied
            t.copy_(s)


def cosine_momentum(step: int, total_steps: int, base: float = 0.996, final: float = 1.0) -> float:
    """DINO's `cosine_scheduler(base, final)` at iteration `step` of `total_steps`: base at 0, final at the end."""
    if total_steps <= 0:
        return base
    progress = min(max(step, 0), total_steps) / total_steps
    return final + 0.5 * (base - final) * (1.0 + math.cos(math.pi * progress))


def ddp_ignore_teacher(model: nn.Module, prefix: str = "teacher.") -> None:
    """Tell DistributedDataParallel not to broadcast the teacher's buffers (names starting with `prefix`)."""
    names = [name for name, _ in model.named_buffers() if name.startswith(prefix)]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
