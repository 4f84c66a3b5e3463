"""AdamW on a given gradient: torch.optim.AdamW's maths as functions of plain tensor lists, run by OrthogonalAdamW on
u_t (orthogonal_adamw.py, multi_tensor_step.py) and by SlowerAdamW on g_t with a scaled lr (slower_adamw.py).

Three implementations of one update, kept in agreement by the tests: `adamw_single` (the reference, one tensor at a
time), `adamw_foreach` (torch._foreach_ ops) and `adamw_fused` (torch's fused kernel, one pass, no temporaries: the
default wherever torch supports it); with them the state they update (`init_adamw_state`), a param group's
hyper-parameters as the step functions take them (`AdamWGroup`) and where the fused kernel runs (`resolve_fused`).
"""

from __future__ import annotations

import math
from typing import List, NamedTuple, Tuple

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

from raystream.optim.base import check_hparam


class AdamWGroup(NamedTuple):
    """The hyper-parameters of one param group, as the step functions take them: one object per group, listed once
    per parameter of the group (`fused`: the group runs torch's fused kernel)."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    orth_beta: float
    maximize: bool
    fused: bool

    @classmethod
    def of(cls, group: dict) -> "AdamWGroup":
        beta1, beta2 = group["betas"]
        return cls(group["lr"], beta1, beta2, group["eps"], group["weight_decay"], group.get("orth_beta", 0.0),
                   group["maximize"], bool(group["fused"]))

    def kwargs(self) -> dict:
        """The keyword arguments of `adamw_single` / `adamw_foreach` / `adamw_fused`."""
        return dict(lr=self.lr, beta1=self.beta1, beta2=self.beta2, eps=self.eps, weight_decay=self.weight_decay,
                    maximize=self.maximize)


def check_adamw_hparams(lr: float, betas: Tuple[float, float], eps: float, weight_decay: float) -> None:
    check_hparam("lr", lr, lr >= 0, ">= 0")
    check_hparam("eps", eps, eps >= 0, ">= 0")
    check_hparam("weight_decay", weight_decay, weight_decay >= 0, ">= 0")
    check_hparam("betas[0]", betas[0], 0 <= betas[0] < 1, "in [0, 1)")
    check_hparam("betas[1]", betas[1], 0 <= betas[1] < 1, "in [0, 1)")


def resolve_fused(group: dict, strict: bool) -> None:
    """fused=None: whether torch's fused kernel runs on the group; `strict`: fused=True where it cannot is an error."""
    if group["fused"] is None:
        group["fused"] = group["foreach"] is not False and fused_supported(group["params"])
    elif strict and group["fused"] and not fused_supported(group["params"]):
        raise ValueError("Invalid fused: True (torch's fused AdamW does not support these parameters' devices "
                         "or dtypes)")


def fused_supported(params: List[Tensor]) -> bool:
    """Whether torch's fused AdamW kernel (torch._fused_adamw_) runs on every parameter's device and dtype."""
    devices = _get_fused_kernels_supported_devices()
    return all(p.device.type in devices and torch.is_floating_point(p) for p in params)


def init_adamw_state(state: dict, p: Tensor, fused: bool = False) -> None:
    """torch.optim.AdamW's per-parameter state: a float32 step counter (on the parameter's device for the fused
    kernel, else on the CPU) and two moments shaped like p."""
    if "step" not in state:
        state["step"] = torch.zeros((), dtype=torch.float32, device=p.device if fused else "cpu")  # no host copy
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def adamw_single(params: List[Tensor], grads: List[Tensor], exp_avgs: List[Tensor], exp_avg_sqs: List[Tensor],
                 steps: List[Tensor], *, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                 maximize: bool, scratch: bool = False) -> None:
    """Reference path, one tensor at a time (`scratch` is ignored); reads its CPU step counters as Python numbers,
    as torch's. theta <- theta (1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps), as the Adam paper's equivalent
    theta (1 - lr wd) - (lr sqrt(1 - b2^t) / (1 - b1^t)) m / (sqrt(v) + eps sqrt(1 - b2^t)): a pass less over v."""
    for p, g, m, v, step in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        if maximize:
            g = -g
        step += 1
        t = step.item()
        if weight_decay != 0:
            p.mul_(1 - lr * weight_decay)
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        bc2_sqrt = math.sqrt(1 - beta2 ** t)
        denom = v.sqrt().add_(eps * bc2_sqrt)
        p.addcdiv_(m, denom, value=-lr * bc2_sqrt / (1 - beta1 ** t))


def adamw_foreach(params: List[Tensor], grads: List[Tensor], exp_avgs: List[Tensor], exp_avg_sqs: List[Tensor],
                  steps: List[Tensor], *, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                  maximize: bool, scratch: bool = False) -> None:
    """The same update with multi-tensor ops, per (device, dtype) bucket. `scratch=True`: the caller owns `grads`
    (e.g. u_t), negated in place for `maximize` and reused as the sqrt(v) workspace, so the step allocates nothing
    (CPU: no page faults) and its peak memory is that of torch's foreach AdamW."""
    if not params:
        return
    buckets = Optimizer._group_tensors_by_device_and_dtype([params, grads, exp_avgs, exp_avg_sqs, steps])
    for (d_params, d_grads, d_m, d_v, d_steps), _ in buckets.values():
        if maximize:
            if scratch:
                torch._foreach_neg_(d_grads)
            else:
                d_grads = torch._foreach_neg(d_grads)
        torch._foreach_add_(d_steps, 1.0)
        if weight_decay != 0:
            torch._foreach_mul_(d_params, 1 - lr * weight_decay)
        torch._foreach_lerp_(d_m, d_grads, 1 - beta1)
        torch._foreach_mul_(d_v, beta2)
        torch._foreach_addcmul_(d_v, d_grads, d_grads, 1 - beta2)
        if scratch and d_v[0].device.type == "cpu":  # CPU foreach is a loop anyway: skip the copy pass
            denom = [torch.sqrt(v, out=w) for v, w in zip(d_v, d_grads)]
        elif scratch:
            denom = d_grads
            torch._foreach_copy_(denom, d_v)
            torch._foreach_sqrt_(denom)
        else:
            denom = torch._foreach_sqrt(d_v)
        del d_grads
        ts = [s.item() for s in d_steps]
        bc2_sqrt = [math.sqrt(1 - beta2 ** t) for t in ts]
        torch._foreach_add_(denom, [eps * b for b in bc2_sqrt])
        torch._foreach_addcdiv_(d_params, d_m, denom, [-lr * b / (1 - beta1 ** t) for b, t in zip(bc2_sqrt, ts)])


def adamw_fused(params: List[Tensor], grads: List[Tensor], exp_avgs: List[Tensor], exp_avg_sqs: List[Tensor],
                steps: List[Tensor], *, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                maximize: bool, scratch: bool = False) -> None:
    """torch's fused multi-tensor AdamW kernel (what torch.optim.AdamW(fused=True) runs): one pass over p, g, m, v
    per step, no temporaries. It does not write into `grads` (no grad_scale is passed). `lr` may also be a 0-dim
    tensor on the parameters' device (SlowerAdamW's lambda_t * lr), read by the kernel without a host sync."""
    if not params:
        return
    buckets = Optimizer._group_tensors_by_device_and_dtype([params, grads, exp_avgs, exp_avg_sqs, steps])
    for (d_params, d_grads, d_m, d_v, d_steps), _ in buckets.values():
        torch._foreach_add_(d_steps, 1)
        torch._fused_adamw_(d_params, d_grads, d_m, d_v, [], d_steps, lr=lr, beta1=beta1, beta2=beta2,
                            weight_decay=weight_decay, eps=eps, amsgrad=False, maximize=maximize)


__all__ = ["AdamWGroup", "check_adamw_hparams", "resolve_fused", "fused_supported", "init_adamw_state",
           "adamw_single", "adamw_foreach", "adamw_fused"]
