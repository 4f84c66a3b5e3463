"""Checks `raystream bench` makes before it times anything, each with a name a failure is reported under:

    device_stream   the worker's DeviceStream batches (uint8 to the device, made float there; pinned memory and
                    a side CUDA stream on a GPU) equal the stream's own float batches on the host
    bf16_step       one training step under bf16 autocast gives a finite loss, gradient norm and parameters
    compiled_step   Orthogonal-AdamW's compiled step (torch.compile: Triton on a GPU, C++ on a CPU) moves the
                    parameters as its stock step does, over 3 steps (only where the compiled step applies and
                    compiling is allowed)

They run on any device; they matter on CUDA, whose paths the CPU tests cannot reach. A failed check raises
CheckFailed naming it. Test hook: with `RAYSTREAM_BENCH_BREAK=<check name>` in the environment that check sees a
corrupted value (one pixel off by 1/255, a perturbed compiled update, a NaN loss), so the failure path is tested
on any machine.
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Any, Dict, List, Tuple

import torch
from omegaconf import OmegaConf

from raystream.bench.optimizer_timing import copy_groups
from raystream.bench.trainee import CheckFailed, Trainee, build_device_stream, build_host_stream
from raystream.optim import build_optimizer

BREAK_ENV = "RAYSTREAM_BENCH_BREAK"
BATCHES = 2  # batches compared by device_stream
FRAME_TOLERANCE = 1e-6  # the host scales by 1/255, the device divides by 255: they may differ by an ulp
UPDATE_TOLERANCE = 1e-3  # compiled vs stock update, relative to the largest stock update, plus rounding:
ROUNDING_ULPS = 16  # ulps of each parameter's largest value


def _broken(name: str) -> bool:
    return os.environ.get(BREAK_ENV) == name


def device_stream(trainee: Trainee) -> Tuple[str, List[Any]]:
    """(detail, the device batches); raises CheckFailed("device_stream", ...)."""
    cfg, device = trainee.cfg, trainee.device
    host = build_host_stream(cfg, BATCHES)
    moved = build_device_stream(cfg, device, BATCHES)
    try:
        expected = list(itertools.islice(host.batches(), BATCHES))
        got = list(itertools.islice(iter(moved), BATCHES))
    finally:
        host.close()
        moved.close()
    if len(got) != len(expected):
        raise CheckFailed("device_stream", f"{len(got)} batches from DeviceStream, {len(expected)} from the stream")
    if _broken("device_stream"):
        got[0].frames = got[0].frames.clone()
        got[0].frames.view(-1)[0] += 1.0 / 255.0
    for a, b in zip(expected, got):
        if a.step != b.step or not torch.equal(a.index, b.index.cpu()):
            raise CheckFailed("device_stream", f"step {a.step}: the clips differ (steps {a.step} / {b.step})")
        for name in ("frames", "target"):
            x, y = getattr(a, name), getattr(b, name)
            if (x is None) != (y is None):
                raise CheckFailed("device_stream", f"step {a.step}: {name} is None on one path only")
            if x is None:
                continue
            y = y.cpu()
            if x.shape != y.shape or x.dtype != y.dtype:
                raise CheckFailed("device_stream", f"step {a.step}: {name} {tuple(y.shape)} {y.dtype} on {device}, "
                                                   f"{tuple(x.shape)} {x.dtype} on the host")
            diff = float((x.float() - y.float()).abs().max())
            if diff > FRAME_TOLERANCE:
                raise CheckFailed("device_stream", f"step {a.step}: {name} differ by up to {diff:.3g} "
                                                   f"(tolerance {FRAME_TOLERANCE})")
    return f"{len(got)} batches equal", got


def bf16_step(trainee: Trainee, batch) -> str:
    """One training step of the trainee under bf16 autocast; raises CheckFailed("bf16_step", ...)."""
    autocast = lambda: torch.autocast(device_type=trainee.device.type, dtype=torch.bfloat16)  # noqa: E731
    try:
        loss = trainee.step(batch, autocast=autocast)
    except CheckFailed as exc:
        raise CheckFailed("bf16_step", str(exc).split(": ", 1)[1]) from None
    if _broken("bf16_step"):
        loss = math.nan
    finite = bool(torch.stack([torch.isfinite(p).all() for p in trainee.params]).all())
    if not (math.isfinite(loss) and finite):
        raise CheckFailed("bf16_step", f"loss {loss}, parameters {'finite' if finite else 'not finite'} after one "
                                       "step under bf16 autocast")
    return f"loss {loss:.4g}"


def compiled_step(trainee: Trainee) -> str:
    """3 steps of the stock and the compiled Orthogonal-AdamW from the same state and gradients; raises
    CheckFailed("compiled_step", ...) when the updates differ, or the compiled step does not build or runs
    eagerly."""
    groups = trainee.groups
    stock_groups, compiled_groups = copy_groups(groups), copy_groups(groups)
    before = [p.detach().clone() for g in stock_groups for p in g["params"]]
    cfg = trainee.cfg.optimizer
    stock = build_optimizer(stock_groups, OmegaConf.merge(cfg, {"compile": False}), diagnostics=True)
    compiled = build_optimizer(compiled_groups, OmegaConf.merge(cfg, {"compile": True}), diagnostics=True)
    try:
        for _ in range(3):  # the first creates the state, the second compiles
            stock.step()
            compiled.step()
    except Exception as exc:  # a compiler missing or failing: what the user must know before a run
        raise CheckFailed("compiled_step", f"the compiled step did not run: {type(exc).__name__}: "
                                           f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    if compiled.compile_trace.eager:
        raise CheckFailed("compiled_step", f"the compiled step {compiled.compile_trace.summary()}")
    flat = lambda gs: [p.detach() for g in gs for p in g["params"]]  # noqa: E731
    compiled_after = flat(compiled_groups)
    if _broken("compiled_step"):
        compiled_after[0] = compiled_after[0] + compiled_after[0].abs().max() + 1.0
    return f"{same_updates(before, flat(stock_groups), compiled_after)}; {compiled.compile_trace.summary()}"


def same_updates(before: List[torch.Tensor], stock: List[torch.Tensor], compiled: List[torch.Tensor]) -> str:
    """Detail of how closely the compiled update (`compiled` - `before`) follows the stock one, per parameter;
    raises CheckFailed("compiled_step", ...) past the tolerance: UPDATE_TOLERANCE of the largest stock update plus
    ROUNDING_ULPS of the parameter (a weight near 1 moved by lr 1e-4 keeps only ~3 significant digits of it)."""
    stock_delta = [p - b for p, b in zip(stock, before)]
    scale = float(torch.stack([d.abs().max() for d in stock_delta]).max())
    diffs = torch.stack([(c - b - d).abs().max() for c, b, d in zip(compiled, before, stock_delta)])
    ulps = torch.stack([ROUNDING_ULPS * torch.finfo(p.dtype).eps * p.abs().max() for p in stock])
    excess = diffs - (UPDATE_TOLERANCE * scale + ulps)
    if not bool((excess <= 0).all()):
        i = int(excess.argmax())
        raise CheckFailed("compiled_step", f"the compiled and stock updates of parameter {i} differ by "
                                           f"{float(diffs[i]):.3g} (largest stock update {scale:.3g}; tolerance "
                                           f"{UPDATE_TOLERANCE} of it plus {ROUNDING_ULPS} ulps of the parameter)")
    return f"updates agree to {float(diffs.max()) / scale if scale else 0.0:.1e} of the largest"


def run_checks(trainee: Trainee) -> Dict[str, str]:
    """The checks every measurement rests on, in turn: {name: 'passed: ...'}; raises CheckFailed at the first
    failure. The compiled step's check (`compiled_check`) comes after the timings: its compiling may take minutes."""
    detail, batches = device_stream(trainee)
    out = {"device_stream": f"passed: {detail}"}
    out["bf16_step"] = f"passed: {bf16_step(trainee, batches[0])}"
    return out


def compiled_check(trainee: Trainee, compiled: Tuple[bool, str]) -> str:
    """'passed: ...' or 'skipped: why' for the compiled step; raises CheckFailed. `compiled`: (whether the compiled
    step may be built, why not)."""
    allowed, why_not = compiled
    return f"passed: {compiled_step(trainee)}" if allowed else f"skipped: {why_not}"
