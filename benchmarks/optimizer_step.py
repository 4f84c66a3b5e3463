"""Claim (issue 15): the orthogonal step costs little more than AdamW's. Targets: OrthogonalAdamW (global
projection) within 1.8x of torch.optim.AdamW(fused=True) on CPU; on GPU within 1.3x of AdamW(foreach=True) and 2x
of AdamW(fused=True) on ViT-B/16; exactly one extra state buffer per parameter.

    python benchmarks/optimizer_step.py [--models vit_s16 vit_b16 vit_l16] [--steps 8] [--device cpu|cuda]
                                        [--optimizers SUBSTRING ...]

Imports torch and raystream.optim only (no Ray, MLflow or Hydra), so it runs as is on a bare GPU machine.
Rows: torch AdamW foreach=True and fused=True (the baselines); OrthogonalAdamW's multi-tensor step (triton=False: the
projection as a few whole-model ops on a flat [g; c] buffer, then torch's fused AdamW kernel on u_t) with the global
and the per-tensor projection, and with diagnostics on (as the training loop builds it); OrthogonalAdamW's fused
Triton step (triton=True: two passes over memory, raystream/optim/triton_step.py; the default on CUDA; listed as not
timed where Triton does not run, e.g. on a CPU); OrthogonalAdamW as a run builds it by default (`optimizer.compile:
auto`: on a CPU the compiled step from `compile_min_params` trainable parameters, which the ViT sets are; on CUDA
the fused Triton step); OrthogonalAdamW(compile=True) (the
whole step fused by torch.compile, global and per-tensor; compiled during the warm-up steps, which takes a minute
or two per model on a CPU the first time); OrthogonalAdamW(fused=False) (torch._foreach_ AdamW ops);
Orthogonal(AdamW(foreach=True)) (the generic wrapper).
One process, one set of ViT-S/16- or ViT-B/16-shaped fp32 parameters and fixed random gradients shared by every
optimizer; the optimizers are stepped in interleaved rounds (so load from other processes hits all of them alike)
and each row is the median step time, as a ratio to torch AdamW foreach=True and fused=True measured in the same
run. Peak memory = parameters + gradients + the most the optimizer holds above them during its first steps (its
state, its scratch buffers, the transients of a step), measured in a fresh child process per optimizer (CUDA:
max_memory_allocated; CPU: the peak RSS, with glibc forced to mmap large blocks so that freed temporaries are
returned and each step's peak is visible); a compiled optimizer is first compiled on a throwaway copy of the
parameters, so its peak is what the optimizer holds and not the compiler's own memory.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from raystream.optim import Orthogonal, OrthogonalAdamW, build_optimizer  # noqa: E402
from raystream.optim.factory import OptimizerConfig  # noqa: E402
from raystream.optim.triton_step import why_not  # noqa: E402

MiB = 2 ** 20


def vit_shapes(dim: int, depth: int, mlp: int, patch: int = 16, tokens: int = 197, classes: int = 1000) -> List[tuple]:
    """Parameter shapes of a timm-style ViT (patch embedding, cls token, position embedding, blocks, head)."""
    shapes = [(dim, 3, patch, patch), (dim,), (1, 1, dim), (1, tokens, dim)]
    for _ in range(depth):
        shapes += [(dim,), (dim,), (3 * dim, dim), (3 * dim,), (dim, dim), (dim,),
                   (dim,), (dim,), (mlp, dim), (mlp,), (dim, mlp), (dim,)]
    return shapes + [(dim,), (dim,), (classes, dim), (classes,)]


MODELS = {"vit_s16": ("ViT-S/16", vit_shapes(384, 12, 1536)), "vit_b16": ("ViT-B/16", vit_shapes(768, 12, 3072))}

MODELS["vit_l16"] = ("ViT-L/16", vit_shapes(1024, 24, 4096))  # 304M: for a GPU (every optimizer's state at once)
MODELS["vit_tiny"] = ("ViT-tiny", vit_shapes(64, 2, 128, classes=10))  # 0.14M: a dry run (the tests)

OPTIMIZERS: Dict[str, Callable] = {
    "AdamW foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.05, foreach=True),
    "AdamW fused": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.05, fused=True),
    "OrthogonalAdamW global": lambda ps: OrthogonalAdamW(ps, lr=1e-3, weight_decay=0.05, projection="global",
                                                         triton=False),
    "OrthogonalAdamW per_tensor": lambda ps: OrthogonalAdamW(ps, lr=1e-3, weight_decay=0.05,
                                                             projection="per_tensor", triton=False),
    "OrthogonalAdamW diagnostics": lambda ps: OrthogonalAdamW(ps, lr=1e-3, weight_decay=0.05, diagnostics=True,
                                                              triton=False),
    "OrthogonalAdamW Triton global": lambda ps: OrthogonalAdamW(ps, lr=1e-3, weight_decay=0.05, triton=True),
    "OrthogonalAdamW Triton per_tensor": lambda ps: OrthogonalAdamW(ps, lr=1e-3, weight_decay=0.05,
                                                                    projection="per_tensor", triton=True),
    "OrthogonalAdamW Triton diagnostics": lambda ps: OrthogonalAdamW(ps, lr=1e-3, weight_decay=0.05,
                                                                     diagnostics=True, triton=True),
    "OrthogonalAdamW default (auto)": lambda ps: build_optimizer(ps, OptimizerConfig(lr=1e-3, weight_decay=0.05)),
    "OrthogonalAdamW compiled": lambda ps: OrthogonalAdamW(ps, lr=1e-3, weight_decay=0.05, compile=True),
    "OrthogonalAdamW compiled per_tensor": lambda ps: OrthogonalAdamW(ps, lr=1e-3, weight_decay=0.05,
                                                                      projection="per_tensor", compile=True),
    "OrthogonalAdamW fused=False": lambda ps: OrthogonalAdamW(ps, lr=1e-3, weight_decay=0.05, fused=False),
    "Orthogonal(AdamW foreach)": lambda ps: Orthogonal(torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.05,
                                                                         foreach=True)),
}


class PeakMemory:
    """Transient bytes allocated during a block, above what was allocated when it started.

    On CPU this switches glibc to mmap every block >= 64 KiB (returned to the OS on free, so the peak RSS sees
    every temporary); it slows allocations, so it is only used in the memory-measuring child process.
    """

    def __init__(self, device: torch.device):
        self.device = device
        if device.type == "cpu":  # M_MMAP_THRESHOLD = -3
            ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)

    @staticmethod
    def _rss(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"{field} not in /proc/self/status")

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS to the current RSS
            self.base = self._rss("VmRSS:")

    def stop(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - self.base
        return max(0, self._rss("VmHWM:") - self.base)


def reuse_freed_memory() -> None:
    """CPU timing: glibc keeps freed blocks for reuse (no mmap, no trimming), as the CUDA caching allocator does, so
    step times measure the optimizer's arithmetic and memory traffic rather than the kernel's page-fault handling
    (which otherwise swings a step that allocates by 2x depending on the heap's history)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-4, 0)  # M_MMAP_MAX = 0
    libc.mallopt(-1, 2 ** 30)  # M_TRIM_THRESHOLD = 1 GiB


def device_is_cpu(name: str) -> bool:
    return torch.device(name).type == "cpu"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def state_buffers(opt: torch.optim.Optimizer, params: List[torch.Tensor]) -> int:
    """Number of parameter-sized state tensors per parameter."""
    big = sum(torch.is_tensor(v) and v.numel() == p.numel() for p in params for v in opt.state[p].values())
    return big // len(params)


def make_params(key: str, device: torch.device) -> List[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter((0.02 * torch.randn(s, generator=gen)).to(device)) for s in MODELS[key][1]]
    for p in params:
        p.grad = (1e-3 * torch.randn(p.shape, generator=gen)).to(device)
    return params


def held_bytes(key: str, label: str, device: torch.device) -> int:
    """The most one optimizer holds above parameters and gradients during its first steps, measured in a fresh
    process (clean heap)."""
    code = (f"import sys; sys.argv = ['x']; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"import optimizer_step as b, torch; print(b._held_in_this_process({key!r}, {label!r}, "
            f"torch.device({str(device)!r})))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return int(out.stdout.strip().splitlines()[-1])


def _held_in_this_process(key: str, label: str, device: torch.device) -> int:
    peak = PeakMemory(device)  # first, so that every block of this process is mmapped
    if "compiled" in label or "auto" in label:  # compile on a throwaway copy: the optimizer's peak, not the compiler's
        spare = make_params(key, device)
        warm = OPTIMIZERS[label](spare)
        for _ in range(2):
            warm.step()
        del spare, warm
    params = make_params(key, device)
    opt = OPTIMIZERS[label](params)
    peak.start()
    for _ in range(3):  # the first creates the state and scratch buffers
        opt.step()
    return peak.stop()


def runs_here(label: str, params: List[torch.Tensor]) -> Optional[str]:
    """None when the row can be timed on these parameters, else why not (the Triton rows where Triton does not
    run)."""
    if "Triton" not in label:
        return None
    return why_not(params, "per_tensor" if "per_tensor" in label else "global")


def bench_model(key: str, device: torch.device, steps: int, warmup: int, memory: bool = True,
                labels: Optional[List[str]] = None) -> Tuple[List[dict], Dict[str, str]]:
    """(one row per timed optimizer of `labels` (default: all), {label: why not timed})."""
    name = MODELS[key][0]
    params = make_params(key, device)
    n = sum(p.numel() for p in params)
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    labels = list(OPTIMIZERS) if labels is None else labels
    skipped = {label: why for label in labels if (why := runs_here(label, params)) is not None}
    opts = {label: OPTIMIZERS[label](params) for label in labels if label not in skipped}
    times: Dict[str, List[float]] = {label: [] for label in opts}
    # CPU: process CPU time (user + system, page faults included), robust to other processes sharing the cores;
    # CUDA: wall time between synchronisations.
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    for r in range(warmup + steps):  # interleaved rounds: background load hits every optimizer alike
        for label, opt in opts.items():
            sync(device)
            t0 = clock()
            opt.step()
            sync(device)
            if r >= warmup:
                times[label].append(clock() - t0)
    held = {label: held_bytes(key, label, device) if memory else math.nan for label in opts}
    rows = []
    for label, opt in opts.items():
        rows.append(dict(model=name, params=n, optimizer=label, ms=1e3 * statistics.median(times[label]),
                         peak=2 * param_bytes + held[label], buffers=state_buffers(opt, params),
                         ran=opt.fused_step.summary() if getattr(opt, "fused_step", None) and opt.fused_step.steps
                         else ""))
    return rows, skipped


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["vit_s16", "vit_b16"], choices=list(MODELS))
    ap.add_argument("--steps", type=int, default=8, help="measured steps per optimizer")
    ap.add_argument("--warmup", type=int, default=3,
                    help="unmeasured steps per optimizer (at least 2: the compiled rows compile in the second)")
    ap.add_argument("--no-memory", action="store_true", help="time the steps only (no child process per optimizer)")
    ap.add_argument("--optimizers", nargs="+", metavar="SUBSTRING",
                    help="time only the rows whose label contains one of these (the AdamW baselines always)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads (default 1: CPU time of one thread is what is timed; 0 keeps torch's default)")
    args = ap.parse_args(argv)
    if args.warmup < 2:
        ap.error(f"--warmup {args.warmup}: expected at least 2 (the compiled optimizers compile in their second step)")
    if device_is_cpu(args.device):
        reuse_freed_memory()
        if args.threads:
            torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    where = f"{torch.cuda.get_device_name(device)}, wall time" if device.type == "cuda" else \
        f"CPU, {torch.get_num_threads()} thread(s), process CPU time"
    print(f"optimizer step, fp32, torch {torch.__version__}, {where}, median of {args.steps} steps")
    header = (f"{'model':<9} {'optimizer':<35} {'step ms':>8} {'x foreach':>9} {'x fused':>8} "
              f"{'peak MiB':>9} {'x foreach':>9} {'x fused':>8} {'extra bufs/param':>16}")
    print(header)
    print("-" * len(header))
    labels = [label for label in OPTIMIZERS if args.optimizers is None or label.startswith("AdamW ")
              or any(s in label for s in args.optimizers)]
    for key in args.models:
        rows, skipped = bench_model(key, device, args.steps, args.warmup, memory=not args.no_memory, labels=labels)
        base = {r["optimizer"]: r for r in rows}
        fe, fu = base["AdamW foreach"], base["AdamW fused"]
        for r in rows:
            print(f"{r['model']:<9} {r['optimizer']:<35} {r['ms']:8.1f} {r['ms'] / fe['ms']:9.2f} "
                  f"{r['ms'] / fu['ms']:8.2f} {r['peak'] / MiB:9.0f} {r['peak'] / fe['peak']:9.2f} "
                  f"{r['peak'] / fu['peak']:8.2f} {r['buffers'] - fe['buffers']:16d}  {r['ran']}")
        for label, why in skipped.items():
            print(f"{MODELS[key][0]:<9} {label:<35} not timed: {why}")
        print(f"{'':9} ({rows[0]['params'] / 1e6:.1f}M parameters in {len(MODELS[key][1])} tensors)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
