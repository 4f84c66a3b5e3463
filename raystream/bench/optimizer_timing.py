"""The optimizer step alone on the model's parameters: the configured optimizer (as a run builds it, diagnostics
on), the stock and compiled Orthogonal-AdamW where the compiled step applies, and torch's AdamW with `foreach=True`
and `fused=True` (the baselines of benchmarks/optimizer_step.py). Where Orthogonal-AdamW's fused Triton step runs
(CUDA: the default there), `orthogonal_adamw` is that step and `orthogonal_adamw_eager` the multi-tensor one
(triton=False), so a run on the device shows both beside torch's fused AdamW.

Each optimizer steps its own copy of the model's param groups with the same fixed random gradients, one optimizer
at a time (so the memory of one copy is held at once): warm-up steps (the compiled step compiles in its second),
then the median of the timed steps, between device synchronisations. Of a compiled optimizer it also reports
whether its steps ran compiled (`CompileTrace.summary()`: a fallback to eager would time the eager step), of one
that runs the fused step whether they ran fused (`TritonStep.summary()`).
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
from omegaconf import OmegaConf
from torch.optim import Optimizer

from raystream.bench.trainee import Budget, sync
from raystream.optim import build_optimizer
from raystream.optim.factory import COMPILED_PROJECTIONS
from raystream.optim.triton_step import why_not


def compile_applies(opt_cfg) -> bool:
    """Whether the configured optimizer has a compiled step (optimizer.compile can be true)."""
    return opt_cfg.name == "orthogonal_adamw" and opt_cfg.projection in COMPILED_PROJECTIONS


def label(opt_cfg) -> str:
    return f"{opt_cfg.name}_compiled" if opt_cfg.compile is True else str(opt_cfg.name)


def copy_groups(groups: List[dict], seed: int = 0) -> List[dict]:
    """`groups` with each parameter copied (detached) and given a fixed random gradient (1e-3 x N(0, 1))."""
    out = []
    gen: Dict[torch.device, torch.Generator] = {}
    for group in groups:
        params = []
        for p in group["params"]:
            g = gen.setdefault(p.device, torch.Generator(device=p.device).manual_seed(seed))
            q = torch.nn.Parameter(p.detach().clone())
            q.grad = 1e-3 * torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype)
            params.append(q)
        out.append({**group, "params": params})
    return out


def fused_step_applies(opt_cfg, groups: List[dict]) -> bool:
    """Whether Orthogonal-AdamW runs its fused Triton step on these parameters by default (CUDA)."""
    return (opt_cfg.name == "orthogonal_adamw"
            and why_not([p for g in groups for p in g["params"]], str(opt_cfg.projection)) is None)


def builders(opt_cfg, with_compiled: bool, fused: bool = False) -> Dict[str, Callable[[List[dict]], Optimizer]]:
    """label -> how to build it: the configured optimizer first, then the stock Orthogonal-AdamW (`fused`: the
    fused Triton step, the default where it runs, and `orthogonal_adamw_eager`, the multi-tensor step), torch AdamW
    foreach and fused, and the compiled Orthogonal-AdamW last (only `with_compiled`; its compiling may spend what
    is left of the budget)."""
    def make(cfg, triton=None):
        def build(groups):
            opt = build_optimizer(groups, cfg, diagnostics=True)
            if triton is not None:
                opt.triton = triton  # read at every step
            return opt
        return build

    variants = ([OmegaConf.merge(opt_cfg, {"compile": c}) for c in (False, True) if with_compiled or not c]
                if compile_applies(opt_cfg) else [])
    out = {label(opt_cfg): make(opt_cfg)}
    hyper = dict(lr=float(opt_cfg.lr), betas=tuple(opt_cfg.betas), eps=float(opt_cfg.eps),
                 weight_decay=float(opt_cfg.weight_decay))
    for cfg in variants[:1]:
        out.setdefault(label(cfg), make(cfg))
        if fused:
            out[f"{label(cfg)}_eager"] = make(cfg, triton=False)
    out["adamw_foreach"] = lambda groups: torch.optim.AdamW(groups, foreach=True, **hyper)
    out["adamw_fused"] = lambda groups: torch.optim.AdamW(groups, fused=True, **hyper)
    for cfg in variants[1:]:
        out.setdefault(label(cfg), make(cfg))
    return out


def step_ms(make: Callable[[List[dict]], Optimizer], groups: List[dict], warmup: int, steps: int,
            budget: Budget) -> Tuple[float, Optional[str]]:
    """(median milliseconds of one `step()` of the optimizer `make` builds on a copy of `groups`, whether its steps
    ran compiled: None for an optimizer without a compiled step)."""
    copies = copy_groups(groups)
    device = copies[0]["params"][0].device
    opt = make(copies)
    for _ in range(max(2, warmup)):  # at least 2: the compiled step compiles in the second
        opt.step()
    times: List[float] = []
    for _ in range(steps):
        sync(device)
        t0 = time.perf_counter()
        opt.step()
        sync(device)
        times.append(time.perf_counter() - t0)
        if budget.left() <= 0:
            break
    ran = opt.compile_trace.summary() if getattr(opt, "compile", False) else None
    if getattr(opt, "fused_step", None) is not None and (opt.fused_step.steps or opt.fused_step.eager_reason):
        ran = opt.fused_step.summary()
    del opt, copies
    gc.collect()
    return 1e3 * statistics.median(times), ran


def time_optimizers(groups: List[dict], opt_cfg, warmup: int, steps: int, budget: Budget,
                    with_compiled: bool) -> Tuple[Dict[str, float], Dict[str, str], Dict[str, str]]:
    """({label: median step ms}, {label: why it was not timed}, {label of a compiled one: whether it ran
    compiled}). Once the budget is spent the rest are skipped."""
    ms: Dict[str, float] = {}
    skipped: Dict[str, str] = {}
    ran: Dict[str, str] = {}
    for name, make in builders(opt_cfg, with_compiled, fused_step_applies(opt_cfg, groups)).items():
        if budget.left() <= 0:
            skipped[name] = "time budget spent"
            continue
        ms[name], how = step_ms(make, groups, warmup, steps, budget)
        if how is not None:
            ran[name] = how
    return ms, skipped, ran
