"""Estimate the GPU memory one training worker of a ViT preset needs, from raystream's own model, without a GPU.

    python cluster/gpu_memory.py                                   # ViT-S/B/L VideoMAE at paper scale
    python cluster/gpu_memory.py --scenario future_prediction_paper --stream future_prediction --batch 8 32

How: the scenario's model is built from the composed config (default: scenario=videomae_paper stream=videomae,
16 frames at 224 px, tube masking 0.9) and one forward pass runs on the CPU under bf16 autocast (unless
`trainer.bf16=false`), with a hook that adds up the bytes autograd saves for the backward pass (each storage once,
the parameters themselves left out: they are counted below; bf16 weight copies are saved tensors). Two batch sizes
give the activation bytes per clip and those that do not grow with the batch. What the run holds besides
(`state_bytes`, per trainable parameter, fp32): the gradient 4, the optimizer's state (AdamW moments 8; the
orthogonal EMA and its scratch row for the gradient, [g; c], 8), the diagnostics' two rows of gradients for
grad_cos_prev 8 (every run builds its optimizer with diagnostics): 28 bytes with Orthogonal-AdamW; DDP's gradient
buckets add 4 when trainer.num_workers > 1. Plus every parameter and buffer of the model (frozen ones too: DoRA's
teacher). Three moments of a run peak, and the estimate is the largest (`peaks`):
  step        weights + state + activations (the previous step's gradient is still held during the forward pass);
  checkpoint  weights + state + the copies rank 0 makes at a save (`checkpoint_copy_bytes`: every EMA and the previous
              gradient, cloned on the device, 8 bytes with Orthogonal-AdamW; torch.save copies one tensor at a time);
  correlation weights + 3 flattened gradients held (three of one pair per order's four, taken once; with more pairs
              the sum and one of a pair: raystream/train/correlation.py) + the
              next one's backward (its gradient and activations) or its flattening (gradient and flat copy).
A GPU run also holds the CUDA context and cuBLAS workspaces (1 GiB, added to the totals) and loses some memory to
allocator fragmentation (not added: keep 10-20 % headroom). CPU autocast saves the same tensors as CUDA autocast
for these layers (linear, SDPA flash attention, layer norm, GELU) up to dtype choices, so expect +-15 %.
tests/cluster/test_gpu_memory.py holds the estimate (less the CUDA context) within 15 % of `raystream bench`'s
peak on CPU (RSS above the process before the model was built) at the rehearsal's size (docs/paper-scale.md).

Measured figures replace estimates cell by cell: `--measured bench-*.json` reads the JSON objects `raystream bench
--device cuda --json PATH` writes and shows, in the cell of the same scenario, preset, resolution, frames per clip
and per-GPU batch, "estimate / measured" (measured: `max_memory_allocated`, the larger of bench's two phases,
live steps with a checkpoint save and the correlation, tensors only, so compare it with the estimate less the 1 GiB
of CUDA context). Below the table a line says how many
cells are measured. None is yet: no GPU has been available to this project.
"""

from __future__ import annotations

import argparse
import json
from typing import Dict, List, Sequence, Tuple

GRADIENT = 4  # fp32 gradient per trainable parameter
CORRELATION_HELD = 4  # flattened fp32 gradients the correlation holds on rank 0: 4 at one pair per order, else 3
CUDA_OVERHEAD = 1 << 30
GIB = float(1 << 30)


def state_bytes(opt_cfg, num_workers: int) -> Dict[str, int]:
    """What a training worker holds per trainable fp32 parameter besides its weight, by what holds it (built as
    raystream/train/loop.py builds the optimizer: with diagnostics)."""
    name = str(opt_cfg.name)
    out = {"gradient": GRADIENT, "grad_cos_prev rows": 8}  # diagnostics.GradCosine: [g_t; g_t-1]
    if name in ("adamw", "orthogonal_adamw", "slower_adamw"):
        out["AdamW moments"] = 8
    elif float(opt_cfg.momentum) > 0:
        out["SGD momentum"] = 4
    if name.startswith("orthogonal_"):
        flat = not bool(opt_cfg.compile) and str(opt_cfg.projection) != "dim0"
        out["orthogonal EMA" + (" [g; c]" if flat else "")] = 8 if flat else 4  # base.py's flat layout
    if num_workers > 1:
        out["DDP buckets"] = 4
    return out


def checkpoint_copy_bytes(opt_cfg) -> int:
    """Bytes per trainable parameter rank 0 copies on the device at a checkpoint: the previous gradient of
    grad_cos_prev (every optimizer) and each EMA out of its flat buffer (orthogonal ones)."""
    return 4 + (4 if str(opt_cfg.name).startswith("orthogonal_") else 0)


def _saved_bytes(model, batch: Dict, bf16: bool) -> int:
    """Bytes autograd keeps for backward during one forward pass (each storage counted once, the model's own
    parameters and buffers left out)."""
    import contextlib

    import torch

    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: Dict[int, int] = {}

    def pack(t):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            storage = t.untyped_storage()
            if storage.data_ptr() not in own:
                seen[storage.data_ptr()] = storage.nbytes()
        return t

    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with autocast:
            out = model(batch)
    del out
    return sum(seen.values())


def _batch(cfg, b: int) -> Dict:
    import torch

    s = cfg.stream
    shape = (b, int(s.frames_per_clip), int(cfg.scenario.backbone.in_chans), int(s.resolution), int(s.resolution))
    target = None
    if int(s.target_frames) > 0:
        target = torch.rand(b, int(s.target_frames), *shape[2:])
    return {"frames": torch.rand(shape), "target": target, "index": torch.arange(b), "step": 0}


def peaks(weights: int, trainable: int, state: int, copies: int, activations: int) -> Dict[str, int]:
    """The bytes of the three moments a run peaks at (see the module docstring), without the CUDA context."""
    return {"step": weights + trainable * state + activations,
            "checkpoint": weights + trainable * (state + copies),
            "correlation": weights + trainable * (CORRELATION_HELD - 1) * GRADIENT
            + max(trainable * 2 * GRADIENT, trainable * GRADIENT + activations)}


def estimate(overrides: Sequence[str], batches: Sequence[int] = (8, 16, 32, 64)) -> Dict:
    """Parameters, static bytes, activation bytes per clip and the estimated peak per per-GPU batch size: `total`
    with the CUDA context, `tensors` without it, `moments` {batch: {step, checkpoint, correlation}}."""
    import torch

    from raystream.config import compose
    from raystream.models import build_scenario

    cfg = compose(list(overrides))
    model = build_scenario(cfg.scenario, cfg.stream, seed=0).model
    model.train()
    bf16 = cfg.trainer.bf16 if cfg.trainer.bf16 is not None else True  # a GPU run: null is bf16
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    held = state_bytes(cfg.optimizer, int(cfg.trainer.num_workers))
    state, copies = sum(held.values()), checkpoint_copy_bytes(cfg.optimizer)
    torch.manual_seed(0)
    a1, a2 = _saved_bytes(model, _batch(cfg, 1), bf16), _saved_bytes(model, _batch(cfg, 2), bf16)
    per_clip, fixed = a2 - a1, max(2 * a1 - a2, 0)
    moments = {b: peaks(weights, trainable, state, copies, fixed + b * per_clip) for b in batches}
    tensors = {b: max(m.values()) for b, m in moments.items()}
    return {"params": trainable, "static": weights + trainable * state + CUDA_OVERHEAD, "per_clip": per_clip,
            "state_bytes": held, "checkpoint_copy_bytes": copies, "bf16": bf16, "moments": moments,
            "tensors": tensors, "total": {b: t + CUDA_OVERHEAD for b, t in tensors.items()},
            "key": (str(cfg.scenario.name), str(cfg.scenario.backbone.preset), int(cfg.stream.resolution),
                    int(cfg.stream.frames_per_clip))}


def measured_peaks(paths: Sequence[str]) -> Dict[Tuple, float]:
    """(scenario, preset, resolution, frames per clip, per-GPU batch) -> peak GiB, from `raystream bench --json`
    files measured on CUDA (CPU runs are left out: their peak is the process's RSS)."""
    out = {}
    for path in paths:
        try:
            with open(path) as f:
                r = json.load(f)
            if r.get("device") == "cuda" and "peak_memory_gb" in r:  # the larger of the steps' and correlation's
                out[(r["scenario"], r["backbone"], r["resolution"], r["frames_per_clip"], r["batch_size"])] = \
                    max(float(r["peak_memory_gb"]), float(r.get("correlation_peak_memory_gb", 0.0)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SystemExit(f"--measured {path}: not a `raystream bench --json` output "
                             f"({type(exc).__name__}: {exc})") from None
    return out


def _cell(estimate_bytes: int, measured) -> str:
    return f"{estimate_bytes / GIB:.1f}" + ("" if measured is None else f" / {measured:.1f} measured")


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default="videomae_paper")
    p.add_argument("--stream", default="videomae")
    p.add_argument("--presets", nargs="+", default=["small", "base", "large"])
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--batch", nargs="+", type=int, default=[8, 16, 32, 64], help="per-GPU batch sizes")
    p.add_argument("--measured", nargs="*", default=[], metavar="JSON",
                   help="`raystream bench --device cuda --json` outputs whose peaks fill their cells")
    args = p.parse_args(argv)
    measured = measured_peaks(args.measured)
    filled = 0
    print(f"scenario={args.scenario} stream={args.stream} stream.resolution={args.resolution}, bf16 autocast, "
          f"Orthogonal-AdamW; GiB per GPU")
    print("| preset | params | static | per clip | " + " | ".join(f"batch {b}" for b in args.batch) + " |")
    print("|---|---|---|---|" + "---|" * len(args.batch))
    for preset in args.presets:
        r = estimate([f"scenario={args.scenario}", f"stream={args.stream}", f"scenario.backbone.preset={preset}",
                      f"stream.resolution={args.resolution}"], args.batch)
        cells = {b: measured.get((*r["key"], b)) for b in args.batch}
        filled += sum(m is not None for m in cells.values())
        print(f"| {preset} | {r['params'] / 1e6:.1f}M | {r['static'] / GIB:.1f} | {r['per_clip'] / GIB:.3f} | "
              + " | ".join(_cell(r["total"][b], cells[b]) for b in args.batch) + " |")
    print(f"measured by raystream bench: {filled} of {len(args.presets) * len(args.batch)} cells"
          + ("" if filled else " (every figure above is an estimate)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
