"""Orthogonal-AdamW's step as two Triton kernels (triton_kernels.py): `triton_orthogonal_adamw`, the `impl="triton"`
of `orthogonal_adamw`, and what it keeps between steps (`TritonStep`); `why_not` says where it cannot run.

Why: the eager multi-tensor step copies g and c into a flat buffer, projects, runs torch's fused AdamW on u_t and
advances c: about 19 words of memory traffic a parameter, 3.2x torch's fused AdamW on ViT-L on an H200; the compiled
step (torch.compile) was slower still there. The fused step reads and writes what Algorithm 2 needs and no more:
pass 1 reads g and c (the dot products), pass 2 reads g, c, theta, m, v and writes c, theta, m, v (11 words; torch's
fused AdamW: 7).

A step, per segment (a run of parameters of one param group, one dtype and one EMA weight: one launch each):
  1. pass 1 (`dots_kernel`): (g . c, c . c) of every block of BLOCK elements, into one fp32 buffer of partial sums;
     skipped when no EMA holds a value yet (k = 0: u_1 = g_1);
  2. k: "global" sums every partial (one reduction); "per_tensor" adds them up per tensor (`segment_kernel`, a fixed
     order: the same bits every run) and divides per tensor; k = 0 where c . c = 0 (`safe_ratio`, as the reference);
  3. the bias corrections of each tensor's step t + 1, in float64 on the device (1 - 0.999^t loses digits in fp32);
  4. pass 2 (`update_kernel`): u, the EMA, AdamW, in place; then the step counters advance (one op). A kernel that
     fails to build has changed nothing (`KernelBuildError`): the optimizer says why once and runs its eager step
     from then on (with triton=True it raises).

The kernels address every tensor through tables of offsets from a base tensor (int64) and a block table (`Plan`),
built once per layout and rebuilt when a tensor moved (a restored checkpoint, a reset EMA); the gradients' table is
refreshed when their addresses change. Every tensor must be contiguous (else the step falls back, saying why);
parameters fp32, bf16 or fp16 (their EMA fp32, m and v in the parameter's dtype: the state of the other
implementations, so checkpoints are interchangeable), on one device.

Where it runs (`why_not`): on CUDA where Triton is installed; on CPU tensors only in Triton's interpreter
(TRITON_INTERPRET=1 set before Triton is imported, as tests/optim/test_optim_triton.py does in a child process).
Importing this module does not import Triton (a CPU run never pays it); the first step does.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from dataclasses import dataclass
from itertools import chain, groupby
from typing import List, Optional, Sequence, Set, Tuple

import torch
from torch import Tensor

from raystream.optim.projection import Sums, safe_ratio

DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # parameter dtypes the kernels take
PROJECTIONS = ("global", "per_tensor")
BLOCK = 2048  # elements per program of either pass
CHUNK = 256  # partial sums per iteration of segment_kernel
NUM_WARPS = 8


@functools.lru_cache(maxsize=None)
def installed() -> bool:
    """Whether Triton can be imported (without importing it)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether Triton's interpreter is on for this process (TRITON_INTERPRET, read as Triton reads it)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def why_not(params: Sequence[Tensor], projection: str) -> Optional[str]:
    """None when the fused step takes these parameters and projection, else the reason (for an error or a bench
    row)."""
    if projection not in PROJECTIONS:
        return f"projection={projection!r} (the fused step implements {' and '.join(PROJECTIONS)})"
    if params and params[0].device.type != "cuda" and not interpreting():  # first: the CPU step pays no more
        return (f"parameters on {params[0].device}: Triton runs the fused step on CUDA (on the CPU only in its "
                "interpreter, TRITON_INTERPRET=1)")
    if not installed():
        return "Triton is not installed (pip install triton; a CUDA torch wheel brings it)"
    devices = {p.device for p in params}
    if len(devices) > 1:
        return f"parameters on several devices ({', '.join(sorted(map(str, devices)))})"
    bad = sorted({str(p.dtype) for p in params if p.dtype not in DTYPES})
    if bad:
        return f"{', '.join(bad)} parameters (the fused step takes fp32, bf16 and fp16)"
    return None


class KernelBuildError(RuntimeError):
    """The fused step cannot run this step (Triton could not build or launch a kernel, or a tensor's layout does not
    suit it), found before anything changed: the optimizer says why once and runs its eager step instead."""


@dataclass
class Segment:
    """Parameters [first, last) of the step's lists: one param group, one dtype, one EMA weight; blocks
    [block0, block1) of the block table; `vec_p` / `vec_c`: 16 bytes in elements where every theta, g, m, v / every
    c of the segment starts 16-byte aligned, else 1."""

    first: int
    last: int
    block0: int
    block1: int
    group: object  # the AdamWGroup
    ema_weight: float
    vec_p: int = 1
    vec_c: int = 1


def _offsets(xs: Sequence[Tensor], segments: List[Segment], bases: Sequence[Tensor]) -> List[int]:
    """Where each tensor starts, in elements from its segment's base tensor."""
    out = []
    for seg, base in zip(segments, bases):
        for x in xs[seg.first:seg.last]:
            diff, size = x.data_ptr() - base.data_ptr(), x.element_size()
            if diff % size or not x.is_contiguous():
                raise KernelBuildError(f"the fused step takes contiguous, element-aligned tensors, not one of shape "
                                       f"{tuple(x.shape)}, strides {x.stride()} at address {x.data_ptr():#x}")
            out.append(diff // size)
    return out


def _table(values: List[int], dtype: torch.dtype, device: torch.device) -> Tensor:
    """`values` as a tensor on `device`; to CUDA through pinned memory without waiting (a plain copy would wait for
    the queued kernels: a host sync in every step whose gradients moved)."""
    t = torch.tensor(values, dtype=dtype)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


def _vec(xs: Sequence[Tensor]) -> int:
    """16 bytes in elements when every tensor of `xs` starts 16-byte aligned (vector loads), else 1."""
    return 16 // xs[0].element_size() if xs and all(x.data_ptr() % 16 == 0 for x in xs) else 1


class Plan:
    """The tables one layout of tensors needs: where theta, c, m and v start (int64 elements from the segment's
    first parameter or EMA), each tensor's size, the block table (tensor index, start) and the segments, on the
    parameters' device. The kernels take whole tables and a segment's first block and first tensor (no sliced
    views: one compilation). `key`: the addresses and segmentation it was built for; the gradients' table is
    refreshed when their addresses change (`refresh_grads`)."""

    def __init__(self, key: tuple, params, emas, exp_avgs, exp_avg_sqs, segments: List[Segment],
                 block: int):
        device = params[0].device
        self.key, self.segments, self.block = key, segments, block
        # each segment's base: its first non-empty tensor (an empty one may have no address)
        bases = [next((i for i in range(s.first, s.last) if params[i].numel()), s.first) for s in segments]
        self.p_bases = [params[i] for i in bases]
        self.c_bases = [emas[i] for i in bases]

        def table(xs, bases):
            return _table(_offsets(xs, segments, bases), torch.int64, device)

        self.p, self.m, self.v = (table(xs, self.p_bases) for xs in (params, exp_avgs, exp_avg_sqs))
        self.c = table(emas, self.c_bases)
        self.vec_p = [_vec(params[s.first:s.last] + exp_avgs[s.first:s.last] + exp_avg_sqs[s.first:s.last])
                      for s in segments]
        for seg in segments:
            seg.vec_c = _vec(emas[seg.first:seg.last])
        sizes = [p.numel() for p in params]
        self.numel = _table(sizes, torch.int64, device)
        tensor, start, first, count = [], [], [], []
        for seg in segments:
            for i in range(seg.first, seg.last):
                nb = -(-sizes[i] // block)
                first.append(len(tensor))
                count.append(nb)
                tensor += [i] * nb
                start += range(0, nb * block, block)
        self.block_tensor = _table(tensor, torch.int32, device)
        self.block_start = _table(start, torch.int64, device)
        self.first_block = _table(first, torch.int64, device)
        self.blocks = _table(count, torch.int64, device)
        self.partial = torch.zeros(max(1, len(tensor)), 2, dtype=torch.float32, device=device)
        self.uu = torch.zeros(max(1, len(tensor)), dtype=torch.float32, device=device)
        self.sums = torch.zeros(len(sizes), 2, dtype=torch.float32, device=device)
        self.grad_ptrs: List[int] = []
        self.g = self.p

    def refresh_grads(self, grads: Sequence[Tensor], params: Sequence[Tensor]) -> None:
        """The gradients' offset table (and vector width), rebuilt when their addresses changed."""
        ptrs = list(map(Tensor.data_ptr, grads))
        if ptrs == self.grad_ptrs:
            return
        for g, p in zip(grads, params):
            if g.dtype != p.dtype or g.shape != p.shape:
                raise KernelBuildError(f"the fused step takes gradients of the parameter's dtype and shape: "
                                       f"parameter {tuple(p.shape)} {p.dtype}, gradient {tuple(g.shape)} {g.dtype}")
        self.g = _table(_offsets(grads, self.segments, self.p_bases), torch.int64, params[0].device)
        for seg, vec in zip(self.segments, self.vec_p):
            seg.vec_p = min(vec, _vec(grads[seg.first:seg.last]))
        self.grad_ptrs = ptrs


class TritonStep:
    """What one optimizer's fused steps keep: the `Plan` of the current layout, and how its steps ran
    (`steps`, and `eager_reason` once a kernel failed to build: the optimizer then runs its eager step)."""

    def __init__(self, block: int = BLOCK):
        self.block = block
        self.plan: Optional[Plan] = None
        self.steps = 0
        self.eager_reason = ""
        self.built: Set[tuple] = set()  # the variants of pass 2 compiled (or checked) so far

    def fall_back(self, reason: str) -> None:
        """A kernel failed to build: say so once on stderr; the optimizer runs its eager step from here on."""
        self.eager_reason = reason
        print(f"raystream: WARNING: OrthogonalAdamW's fused Triton step could not be built ({reason}); it runs its "
              "multi-tensor step from here on (triton=False says so quietly)", file=sys.stderr, flush=True)

    def summary(self) -> str:
        if self.eager_reason:
            return f"ran eagerly after {self.steps} fused steps: {self.eager_reason}"
        return f"ran fused (Triton, {self.steps} steps)"


def _segments(params: Sequence[Tensor], groups: Sequence, fresh: Sequence[bool], first_grad: bool,
              block: int) -> List[Segment]:
    """Runs of parameters of one param group, one dtype and one EMA weight (first_grad: a fresh EMA takes g_1)."""
    keys = [(id(group), p.dtype, new and first_grad) for group, p, new in zip(groups, params, fresh)]
    out, i, b = [], 0, 0
    for _, members in groupby(keys):
        n = len(list(members))
        nb = sum(-(-params[j].numel() // block) for j in range(i, i + n))
        out.append(Segment(i, i + n, b, b + nb, groups[i], 0.0))
        i, b = i + n, b + nb
    return out


def _plan(state: TritonStep, params, emas, exp_avgs, exp_avg_sqs, groups, fresh, first_grad) -> Plan:
    """The plan of this layout (rebuilt when a tensor moved or the groups changed), with this step's
    hyper-parameters. Its key is what a step can compute cheaply (C-level maps: a few microseconds per hundred
    tensors)."""
    key = (list(map(Tensor.data_ptr, chain(params, emas, exp_avgs, exp_avg_sqs))), list(map(Tensor.numel, params)),
           [len(list(run)) for _, run in groupby(groups, key=id)], list(fresh) if first_grad else None)
    plan = state.plan
    if plan is None or plan.key != key:
        plan = state.plan = Plan(key, params, emas, exp_avgs, exp_avg_sqs,
                                 _segments(params, groups, fresh, first_grad, state.block), state.block)
    for seg in plan.segments:  # this step's hyper-parameters (lr, weight decay, orth_beta may have moved)
        seg.group = groups[seg.first]
        seg.ema_weight = 1.0 if first_grad and fresh[seg.first] else 1.0 - seg.group.orth_beta
    return plan


def _bias_corrections(steps: Sequence[Tensor], lr: float, beta1: float, beta2: float,
                      device: torch.device) -> Tuple[Tensor, Tensor]:
    """lr / (1 - b1^t) and 1 / sqrt(1 - b2^t) of each tensor's next step t, float64 on `device`."""
    t = torch.stack(list(steps)).to(device=device, dtype=torch.float64) + 1
    return lr / (1 - beta1 ** t), torch.rsqrt(1 - beta2 ** t)


def triton_orthogonal_adamw(params: List[Tensor], grads: List[Tensor], emas: List[Tensor], exp_avgs: List[Tensor],
                            exp_avg_sqs: List[Tensor], steps: List[Tensor], groups: List, fresh: List[bool], *,
                            projection: str, orth_init: str, with_update_norm: bool,
                            state: Optional[TritonStep] = None) -> Sums:
    """Algorithm 2 as the two fused passes (the module docstring), in place; returns (sum g . c, sum c . c, sum u . u
    or None) as 0-dim fp32 tensors on the parameters' device. `groups[i]`: params[i]'s AdamWGroup; `fresh[i]`:
    emas[i] holds no value yet (zeros). The step counters advance once every kernel is queued; `KernelBuildError`:
    Triton failed before any tensor of the step changed."""
    if projection not in PROJECTIONS:
        raise ValueError(f"Invalid projection for the fused step: {projection!r} (expected one of "
                         f"{', '.join(PROJECTIONS)})")
    if not params:
        return None, None, None
    from raystream.optim import triton_kernels  # imports Triton (first step only)

    state = state if state is not None else TritonStep()
    applied: List[tuple] = []  # segments whose pass 2 was queued: a failure after the first is a partial step
    try:
        plan = _plan(state, params, emas, exp_avgs, exp_avg_sqs, groups, fresh, orth_init == "first_grad")
        plan.refresh_grads(grads, params)
        k, gc, cc = _coefficients(triton_kernels, plan, fresh, projection)
        launches = [_pass_2(plan, seg, p_base, c_base, steps, k, projection, with_update_norm)
                    for seg, p_base, c_base in zip(plan.segments, plan.p_bases, plan.c_bases)
                    if seg.block1 > seg.block0]
        _build(triton_kernels, state, launches)
        for grid, args, keywords in launches:
            triton_kernels.update_kernel[grid](*args, **keywords)
            applied.append(grid)
    except KernelBuildError:
        raise
    except Exception as e:  # Triton's compiler and launcher raise errors of their own and of the builtins
        reason = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        if applied:
            raise RuntimeError(f"the fused Orthogonal-AdamW step failed after updating {len(applied)} of "
                               f"{len(plan.segments)} segments ({reason}); the parameters are partly stepped") from e
        raise KernelBuildError(reason) from e
    torch._foreach_add_(list(steps), 1)
    state.steps += 1
    uu = plan.uu[:plan.segments[-1].block1].sum() if with_update_norm else None
    return gc, cc, uu


def _coefficients(K, plan: Plan, fresh, projection: str) -> Tuple[Tensor, Tensor, Tensor]:
    """Pass 1 and k (0-dim for "global", one per tensor for "per_tensor"), with the sums g . c and c . c."""
    device, n = plan.numel.device, len(fresh)
    if all(fresh):  # c_0 = 0 everywhere: k = 0, and the sums are 0
        zero = torch.zeros((), dtype=torch.float32, device=device)
        return (zero.expand(n).contiguous() if projection == "per_tensor" else zero), zero, zero
    for seg, p_base, c_base in zip(plan.segments, plan.p_bases, plan.c_bases):
        if seg.block1 > seg.block0:
            K.dots_kernel[(seg.block1 - seg.block0,)](
                p_base, c_base, plan.g, plan.c, plan.block_tensor, plan.block_start, plan.numel, plan.partial,
                seg.block0, VEC_P=seg.vec_p, VEC_C=seg.vec_c, BLOCK=plan.block, num_warps=NUM_WARPS)
    if projection == "per_tensor":
        K.segment_kernel[(n,)](plan.partial, plan.first_block, plan.blocks, plan.sums, CHUNK=CHUNK)
        gc, cc = plan.sums.sum(0).unbind()
        return safe_ratio(plan.sums[:, 0], plan.sums[:, 1]), gc, cc
    gc, cc = plan.partial[:plan.segments[-1].block1].sum(0).unbind()
    return safe_ratio(gc, cc), gc, cc


def _pass_2(plan: Plan, seg: Segment, p_base: Tensor, c_base: Tensor, steps, k: Tensor, projection: str,
            with_update_norm: bool) -> Tuple[tuple, tuple, dict]:
    """(grid, arguments, keywords) of one segment's pass 2, with its tensors' bias corrections."""
    group = seg.group
    step_size, inv_bc2 = _bias_corrections(steps[seg.first:seg.last], group.lr, group.beta1, group.beta2,
                                           p_base.device)
    args = (p_base, c_base, plan.p, plan.g, plan.c, plan.m, plan.v, step_size, inv_bc2, plan.block_tensor,
            plan.block_start, plan.numel, k, plan.uu, seg.block0, seg.first,
            1.0 - float(group.lr) * float(group.weight_decay), float(group.beta1), float(group.beta2),
            float(group.eps), float(seg.ema_weight))
    keywords = dict(PER_TENSOR=projection == "per_tensor", MAXIMIZE=bool(group.maximize), WITH_UU=with_update_norm,
                    VEC_P=seg.vec_p, VEC_C=seg.vec_c, BLOCK=plan.block, num_warps=NUM_WARPS)
    return (seg.block1 - seg.block0,), args, keywords


def _build(K, state: TritonStep, launches) -> None:
    """Compile every variant of pass 2 this step launches before the first runs (`warmup`: built, not run), so that
    a kernel Triton cannot build fails the step before any segment is updated."""
    for grid, args, keywords in launches:
        variant = (args[0].dtype, args[1].dtype, *sorted(keywords.items()))
        if variant not in state.built:
            K.update_kernel.warmup(*args, grid=grid, **keywords)
            state.built.add(variant)
